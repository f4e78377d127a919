"""The Redis engine: the cluster's channels and keys on one Redis server.

- channels (PUBLISH/SUBSCRIBE): ``PREFIX:t:TOPIC`` per topic (a node subscribes while it
  has members in the topic: interest-based routing), ``PREFIX:n:NODE`` per node (UCAST,
  BCAST, what a node's sbus patterns match), ``PREFIX:ctl`` for announcements;
- keys: ``PREFIX:node:NODE`` says the node is alive (it expires ``node-timeout`` after the
  last heartbeat), ``PREFIX:state:NODE`` is a hash of the node's state (its members,
  patterns, identities: what a node that (re)connects reads), ``PREFIX:nodes`` the set of
  node names;
- Micromessage2 queue groups across nodes: a stream per group, and its wake-up channel
  (:mod:`.streams`, the engine's queue store).

One connection (RESP3) carries it all, so a node's SUBSCRIBE is in effect before the
announcement that follows it. It reconnects with backoff (0.1 s doubling to 5 s) and then
subscribes again to every channel; the cluster stores its state again (Redis may have
restarted empty).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from msgbroker import ConfigError
from msgbroker.engine import EngineContext, NodeState, redact_url

from .connection import RedisConnection, RedisError
from .streams import RedisStreams

log = Logger(namespace="msgbroker.cluster.redis")

#: topics subscribed per SUBSCRIBE command when restoring them
_BATCH = 1000


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class RedisEngine:
    """:class:`msgbroker.engine.Engine` on Redis (see the module docstring)."""

    def __init__(self, context: EngineContext) -> None:
        self.context = context
        settings = context.settings
        parts = urlsplit(context.url)
        self.tls = parts.scheme.lower() == "rediss"
        try:
            self.host = parts.hostname or "127.0.0.1"
            self.port = parts.port or 6379
            path = parts.path.strip("/")
            self.db = int(path) if path else 0
        except ValueError:
            raise ConfigError(f"bad Redis URL {redact_url(context.url)!r}") from None
        self.username = unquote(parts.username) if parts.username else None
        self.password = settings.read_password() or (
            unquote(parts.password) if parts.password else None
        )
        self.url = redact_url(context.url)
        prefix = _b(settings.prefix)
        self.node_key = prefix + b":node:" + _b(context.node)
        self.state_key = prefix + b":state:" + _b(context.node)
        self.nodes_key = prefix + b":nodes"
        self.control = prefix + b":ctl"
        self.own_channel = prefix + b":n:" + _b(context.node)
        self._prefix = prefix
        self._topic_prefix = prefix + b":t:"
        self._node_prefix = prefix + b":n:"
        self.ttl_ms = max(1, int(settings.timeout * 1000))
        #: the state hash outlives the liveness key: a node slow to beat keeps its state
        self.state_ttl_ms = max(30_000, 10 * self.ttl_ms)
        self.listening: set[bytes] = set()
        self.conn: RedisConnection | None = None
        self.ready = False
        self._stopped = False
        self._delay = 0.1
        self._retry: Any = None
        self._connecting: Deferred[Any] | None = None
        self.streams = RedisStreams(self)
        self._wake_prefix = self.streams.wake_prefix

    def queue_store(self) -> RedisStreams:
        """The engine's queue store (:class:`msgbroker.engine.QueueStore`)."""
        return self.streams

    # -- connecting ------------------------------------------------------------------------

    def _endpoint(self) -> Any:
        reactor = self.context.reactor
        endpoint: Any = HostnameEndpoint(
            reactor, self.host, self.port, timeout=self.context.settings.connect_timeout
        )
        if not self.tls:
            return endpoint
        from twisted.internet import ssl

        settings = self.context.settings
        trust = None
        if settings.tls_ca:
            with open(settings.tls_ca, "rb") as f:
                trust = ssl.Certificate.loadPEM(f.read())
        client = None
        if settings.tls_cert and settings.tls_key:
            with open(settings.tls_cert, "rb") as f, open(settings.tls_key, "rb") as g:
                client = ssl.PrivateCertificate.loadPEM(f.read() + b"\n" + g.read())
        options = ssl.optionsForClientTLS(
            self.host, trustRoot=trust, clientCertificate=client
        )
        return _TLSEndpoint(endpoint, options, reactor)

    def start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        self._retry = None
        if self._stopped:
            return
        settings = self.context.settings

        def build() -> RedisConnection:
            return RedisConnection(
                settings.max_buffer, self._push, self.context.events.chunk_done, self._lost,
                self._error,
            )

        self._connecting = self._endpoint().connect(Factory.forProtocol(build))
        self._connecting.addCallbacks(self._made, self._failed)

    def _made(self, conn: RedisConnection) -> None:
        self._connecting = None
        self.conn = conn
        hello: list[bytes | str | int] = [b"HELLO", b"3"]
        if self.password is not None:
            hello += [b"AUTH", self.username or "default", self.password]
        hello += [b"SETNAME", b"msgbroker:" + _b(self.context.node)]
        conn.command(*hello).addCallbacks(self._hello, self._refused, errbackArgs=(conn,))
        if self.db:
            conn.command(b"SELECT", self.db).addErrback(self._refused, conn)
        conn.flush()

    def _hello(self, reply: Any) -> None:
        conn = self.conn
        if conn is None or conn.lost:
            return
        channels = [self.control, self.own_channel, *self.listening, *self.streams.wakes]
        for start in range(0, len(channels), _BATCH):
            conn.send([(b"SUBSCRIBE", *channels[start : start + _BATCH])], force=True)
        self.ready = True
        self.streams.connected()
        conn.flush()
        self._delay = 0.1
        self.context.events.engine_connected()

    def _refused(self, failure: Any, conn: RedisConnection) -> None:
        # an error, not the password, is logged (Redis's WRONGPASS text names no secret)
        self.context.log("refused", f"cluster: Redis at {self.url} refused the connection: "
                         f"{failure.getErrorMessage()}")
        if conn.transport is not None:
            conn.transport.loseConnection()

    def _failed(self, failure: Any) -> None:
        self._connecting = None
        self.context.log(
            "connect", f"cluster: cannot connect to Redis at {self.url}: "
            f"{failure.getErrorMessage()}"
        )
        self._again()

    def _lost(self, reason: str) -> None:
        was_ready, self.ready, self.conn = self.ready, False, None
        if was_ready and not self._stopped:
            self.context.events.engine_lost(reason)
        self._again()

    def _again(self) -> None:
        if self._stopped or self._retry is not None:
            return
        delay, self._delay = self._delay, min(self._delay * 2, 5.0)
        self._retry = self.context.reactor.callLater(delay, self._connect)

    def _error(self, text: str) -> None:
        self.context.log("error", f"cluster: Redis answered an error: {text}")

    def stop(self) -> Deferred[None]:
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        conn = self.conn
        if conn is None or conn.lost or not self.ready:
            return defer.succeed(None)
        conn.send(
            [
                (b"DEL", self.node_key, self.state_key),
                (b"SREM", self.nodes_key, _b(self.context.node)),
            ],
            force=True,
        )
        done = conn.command(b"PING")
        conn.flush()
        closed: Deferred[None] = Deferred()

        def close(_: Any) -> None:
            if conn.transport is not None:
                conn.transport.loseConnection()
            closed.callback(None)

        timeout = self.context.reactor.callLater(
            self.context.settings.connect_timeout, done.cancel
        )
        done.addBoth(lambda r: timeout.cancel() if timeout.active() else None)
        done.addBoth(close)
        return closed

    # -- the Engine interface --------------------------------------------------------------

    def _send(self, commands: Sequence[Sequence[bytes | str | int]], force: bool = False) -> bool:
        conn = self.conn
        if conn is None or not self.ready:
            return False
        return conn.send(commands, force)

    def listen(self, topic: str) -> None:
        channel = self._topic_prefix + _b(topic)
        if channel not in self.listening:
            self.listening.add(channel)
            self._send([(b"SUBSCRIBE", channel)], force=True)

    def unlisten(self, topic: str) -> None:
        channel = self._topic_prefix + _b(topic)
        if channel in self.listening:
            self.listening.discard(channel)
            self._send([(b"UNSUBSCRIBE", channel)], force=True)

    def publish(self, topic: str, data: bytes) -> bool:
        return self._send([(b"PUBLISH", self._topic_prefix + _b(topic), data)])

    def send(self, node: str, data: bytes) -> bool:
        return self._send([(b"PUBLISH", self._node_prefix + _b(node), data)])

    def announce(self, data: bytes, changes: Sequence[tuple[bytes, bytes | None]]) -> bool:
        final = dict(changes)
        commands: list[Sequence[bytes | str | int]] = []
        values = [x for key, value in final.items() if value is not None for x in (key, value)]
        if values:
            commands.append((b"HSET", self.state_key, *values))
        gone = [key for key, value in final.items() if value is None]
        if gone:
            commands.append((b"HDEL", self.state_key, *gone))
        commands.append((b"PUBLISH", self.control, data))
        # the node's own state is never dropped: others would miss it for good
        return self._send(commands, force=True)

    def replace_state(self, state: NodeState) -> bool:
        commands: list[Sequence[bytes | str | int]] = [(b"DEL", self.state_key)]
        items = [x for pair in state.items() for x in pair]
        for start in range(0, len(items), 2 * _BATCH):
            commands.append((b"HSET", self.state_key, *items[start : start + 2 * _BATCH]))
        commands.append((b"SADD", self.nodes_key, _b(self.context.node)))
        return self._send(commands, force=True)

    def beat(self) -> None:
        self._send(
            [
                (b"SET", self.node_key, b"1", b"PX", self.ttl_ms),
                (b"PEXPIRE", self.state_key, self.state_ttl_ms),
            ],
            force=True,
        )

    def snapshot(self, nodes: Sequence[str] | None = None) -> Deferred[dict[str, NodeState]]:
        conn = self.conn
        if conn is None or not self.ready:
            return defer.fail(RedisError("not connected"))
        return defer.ensureDeferred(self._snapshot(conn, nodes))

    async def _snapshot(
        self, conn: RedisConnection, nodes: Sequence[str] | None
    ) -> dict[str, NodeState]:
        own = self.context.node
        if nodes is None:
            d = conn.command(b"SMEMBERS", self.nodes_key)
            conn.flush()
            members = await d
            names = sorted(n.decode("utf-8", "surrogateescape") for n in members)
            names = [n for n in names if n != own]
        else:
            names = list(nodes)
        if not names:
            return {}
        prefix = self._prefix
        alive_d = conn.command(b"MGET", *(prefix + b":node:" + _b(n) for n in names))
        states_d = [conn.command(b"HGETALL", prefix + b":state:" + _b(n)) for n in names]
        conn.flush()
        alive = await alive_d
        result: dict[str, NodeState] = {}
        for name, live, state_d in zip(names, alive, states_d, strict=True):
            state = await state_d
            if live is not None:  # alive; its state may be empty (no member yet)
                result[name] = _as_dict(state) if state else {}
        return result

    def flush(self) -> None:
        if self.conn is not None:
            self.conn.flush()

    def status(self) -> Mapping[str, Any]:
        conn = self.conn
        return {
            "url": self.url,
            "connected": self.ready,
            "buffered": conn.buffered if conn is not None else 0,
            "topics": len(self.listening),
        }

    # -- from Redis ------------------------------------------------------------------------

    def _push(self, message: list[Any]) -> None:
        if len(message) == 3 and message[0] == b"message":
            channel, data = message[1], message[2]
            if channel == self.control:
                self.context.events.announced(data)
            elif channel.startswith(self._wake_prefix):
                self.streams.woken(channel)
            else:
                self.context.events.delivered(data)


class _TLSEndpoint:
    """TLS over ``inner``, timed by the engine's reactor (``wrapClientTLS`` times TLS
    writes on the global reactor, which a broker on another reactor does not run)."""

    def __init__(self, inner: Any, options: Any, reactor: Any) -> None:
        self.inner, self.options, self.reactor = inner, options, reactor

    def connect(self, factory: Any) -> Deferred[Any]:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        wrapped = TLSMemoryBIOFactory(self.options, True, factory, clock=self.reactor)
        connected: Deferred[Any] = self.inner.connect(wrapped)
        return connected.addCallback(lambda protocol: protocol.wrappedProtocol)


def _as_dict(state: Any) -> dict[bytes, bytes]:
    if isinstance(state, dict):
        return state
    return dict(zip(state[::2], state[1::2], strict=True))  # a RESP2 flat list
