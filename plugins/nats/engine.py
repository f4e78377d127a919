"""The NATS engine: the cluster's subjects on a NATS server (or a NATS cluster).

Subjects (``P`` is ``[cluster] prefix``; topics and node names as one token each,
:func:`.codec.topic_token`):

- ``P.t.TOPIC``: publications on a topic (a node subscribes while it has members in it:
  interest-based routing, which NATS itself applies: a publication nobody subscribes to
  goes nowhere);
- ``P.n.NODE``: messages to one node (UCAST, BCAST, what its sbus patterns match);
- ``P.a``: announcements (state changes, joins, heartbeats, byes) to every node;
- ``P.q`` and ``P.q.NODE``: "what is your state?", asked of every node and of one node;
  each answers on the asker's ``P.r.ASKER.SEQ`` with its state, in parts that fit the
  server's ``max_payload``.

Nothing is stored on the server: a node keeps its own state (what it announced) and hands
it to whoever asks; a node that (re)connects asks every node (and takes the answers that
come within a heartbeat: a node heard later is asked on its own). Liveness is the
heartbeat announcement each node makes on ``P.a`` every heartbeat (:meth:`beat` PINGs the
server, to notice one that hangs). One connection carries it all, so a node's SUB is in
effect before the announcement that follows it. It reconnects with backoff (0.1 s doubling
to 5 s), then subscribes again to every subject; the cluster announces itself and asks
again.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import define, field
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory

from msgbroker import ConfigError
from msgbroker.engine import EngineContext, NodeState

from . import codec, statewire
from .connection import NatsConnection, NatsError
from .urls import NatsAddress, parse_url

# subscription ids: fixed ones, then one per topic listened on
_ANNOUNCE, _OWN, _ASK_ALL, _ASK_ME, _REPLIES = 1, 2, 3, 4, 5
_FIRST_TOPIC_SID = 16
#: what a state reply's part may hold besides its fields
_REPLY_OVERHEAD = 1024


@define
class _Asking:
    """A state request in flight: the answers so far, by node."""

    wanted: set[str] | None
    done: Deferred[dict[str, NodeState]]
    timer: Any = None
    parts: dict[str, list[list[bytes]]] = field(factory=dict)
    states: dict[str, dict[bytes, bytes]] = field(factory=dict)


class NatsEngine:
    """:class:`msgbroker.engine.Engine` on NATS (see the module docstring)."""

    def __init__(self, context: EngineContext) -> None:
        self.context = context
        settings = context.settings
        self.address: NatsAddress = parse_url(context.url, settings.read_password())
        self.url = self.address.redacted
        prefix = settings.prefix.encode("utf-8")
        if not codec.valid_subject(prefix):
            raise ConfigError(
                f"cluster-prefix {settings.prefix!r} is no NATS subject (dot-separated "
                "tokens without spaces, '*' or '>')"
            )
        own = codec.topic_token(context.node)
        self.announce_subject = prefix + b".a"
        self.own_subject = prefix + b".n." + own
        self.ask_all_subject = prefix + b".q"
        self.ask_prefix = prefix + b".q."
        self.reply_prefix = prefix + b".r." + own + b"."
        self._topic_prefix = prefix + b".t."
        self._node_prefix = prefix + b".n."
        #: this node's state as announced: what it answers state requests with
        self.state: dict[bytes, bytes] = {}
        #: topic -> (subject, sid), kept across reconnects
        self.listening: dict[str, tuple[bytes, int]] = {}
        self._sids = itertools.count(_FIRST_TOPIC_SID)
        self._subjects: dict[str, bytes] = {}
        self._asking: dict[int, _Asking] = {}
        self._asks = itertools.count(1)
        self.conn: NatsConnection | None = None
        self.ready = False
        self.skipped = 0
        self.too_big = 0
        self._stopped = False
        self._delay = 0.1
        self._retry: Any = None
        self._handshake: Any = None
        self._connecting: Deferred[Any] | None = None
        #: when the PING now unanswered was sent
        self._ping_since: float | None = None
        self._tls_made: Any = self._tls_options() if self.address.tls else None

    # -- connecting ------------------------------------------------------------------------

    def _tls_options(self) -> Any:
        """The client TLS options (the ``[cluster]`` CA and certificate files read now:
        ConfigError if they cannot be)."""
        from twisted.internet import ssl

        settings = self.context.settings
        try:
            trust = None
            if settings.tls_ca:
                with open(settings.tls_ca, "rb") as f:
                    trust = ssl.Certificate.loadPEM(f.read())
            client = None
            if settings.tls_cert and settings.tls_key:
                with open(settings.tls_cert, "rb") as f, open(settings.tls_key, "rb") as g:
                    client = ssl.PrivateCertificate.loadPEM(f.read() + b"\n" + g.read())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the cluster's TLS files: {e}") from None
        return ssl.optionsForClientTLS(
            self.address.host, trustRoot=trust, clientCertificate=client
        )

    def _tls(self, required: bool) -> Any:
        """TLS options for a ``tls://`` URL, or a server that requires TLS; else None."""
        if not (self.address.tls or required):
            return None
        if self._tls_made is None:
            self._tls_made = self._tls_options()
        return self._tls_made

    def _connect_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "name": f"msgbroker:{self.context.node}",
            "lang": "python-twisted",
            "version": "1",
            "protocol": 1,
            "echo": True,  # a node hears its own announcements: the cluster needs them
            "headers": False,
        }
        return {**options, **self.address.credentials()}

    def start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        self._retry = None
        if self._stopped:
            return
        settings = self.context.settings
        reactor = self.context.reactor

        def build() -> NatsConnection:
            return NatsConnection(
                reactor,
                settings.max_buffer, self._connect_options, self._tls, self._ready,
                self._msg, self.context.events.chunk_done, self._lost, self._error,
            )

        endpoint: Any = HostnameEndpoint(
            reactor, self.address.host, self.address.port, timeout=settings.connect_timeout
        )
        self._connecting = endpoint.connect(Factory.forProtocol(build))
        self._connecting.addCallbacks(self._made, self._failed)

    def _made(self, conn: NatsConnection) -> None:
        self._connecting = None
        self.conn = conn

        def too_slow() -> None:
            self._handshake = None
            if not conn.ready:
                self.context.log("connect", f"cluster: NATS at {self.url} did not complete "
                                 "the handshake in time")
                conn.abort()

        self._handshake = self.context.reactor.callLater(
            self.context.settings.connect_timeout, too_slow
        )

    def _ready(self, info: codec.Info) -> None:
        conn = self.conn
        if self._handshake is not None and self._handshake.active():
            self._handshake.cancel()
        self._handshake = None
        if conn is None or conn.lost:
            return
        subscriptions = [
            codec.sub(self.announce_subject, _ANNOUNCE),
            codec.sub(self.own_subject, _OWN),
            codec.sub(self.ask_all_subject, _ASK_ALL),
            codec.sub(self.ask_prefix + codec.topic_token(self.context.node), _ASK_ME),
            codec.sub(self.reply_prefix + b"*", _REPLIES),
            *(codec.sub(subject, sid) for subject, sid in self.listening.values()),
        ]
        conn.write(b"".join(subscriptions), force=True)
        conn.flush()
        self.ready = True
        self._delay = 0.1
        self._ping_since = None
        self.context.events.engine_connected()

    def _failed(self, failure: Any) -> None:
        self._connecting = None
        self.context.log(
            "connect", f"cluster: cannot connect to NATS at {self.url}: "
            f"{failure.getErrorMessage()}"
        )
        self._again()

    def _lost(self, reason: str) -> None:
        was_ready, self.ready, self.conn = self.ready, False, None
        if self._handshake is not None and self._handshake.active():
            self._handshake.cancel()
        self._handshake = None
        asking, self._asking = self._asking, {}
        for request in asking.values():
            self._finish(request, NatsError("connection lost"))
        if was_ready and not self._stopped:
            self.context.events.engine_lost(reason)
        elif not self._stopped:  # a TLS handshake refused, a server that hung up on us
            self.context.log("connect", f"cluster: NATS at {self.url} closed the connection "
                             f"before it was ready: {reason}")
        self._again()

    def _again(self) -> None:
        if self._stopped or self._retry is not None:
            return
        delay, self._delay = self._delay, min(self._delay * 2, 5.0)
        self._retry = self.context.reactor.callLater(delay, self._connect)

    def _error(self, text: str, ready: bool) -> None:
        # the server's texts name no secret ('Authorization Violation')
        if ready:
            self.context.log("error", f"cluster: NATS answered an error: {text}")
        else:
            self.context.log("refused", f"cluster: NATS at {self.url} refused the "
                             f"connection: {text}")

    def stop(self) -> Deferred[None]:
        self._stopped = True
        for call in (self._retry, self._handshake):
            if call is not None and call.active():
                call.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        conn = self.conn
        if conn is None or not self.ready:
            if conn is not None:
                conn.abort()
            return defer.succeed(None)
        done = conn.ping()  # its PONG: the server has taken everything before it (our bye)
        conn.flush()
        closed: Deferred[None] = Deferred()

        def close(_: Any) -> None:
            conn.close()
            closed.callback(None)

        timeout = self.context.reactor.callLater(
            self.context.settings.connect_timeout, done.cancel
        )
        done.addBoth(lambda r: timeout.cancel() if timeout.active() else None)
        done.addBoth(close)
        return closed

    # -- the Engine interface --------------------------------------------------------------

    def _write(self, data: bytes, force: bool = False) -> bool:
        conn = self.conn
        if conn is None or not self.ready:
            return False
        return conn.write(data, force)

    def _fits(self, data: bytes, what: str) -> bool:
        conn = self.conn
        limit = conn.max_payload if conn is not None else 1 << 20
        if len(data) <= limit:
            return True
        self.too_big += 1
        self.context.log(
            "too-big", f"cluster: a {what} of {len(data)} bytes is above the NATS server's "
            f"max_payload ({limit}): not sent (raise max_payload in its configuration)"
        )
        return False

    def listen(self, topic: str) -> None:
        if topic in self.listening:
            return
        subject = self._topic_prefix + codec.topic_token(topic)
        sid = next(self._sids)
        self.listening[topic] = (subject, sid)
        self._write(codec.sub(subject, sid), force=True)

    def unlisten(self, topic: str) -> None:
        found = self.listening.pop(topic, None)
        if found is not None:
            self._write(codec.unsub(found[1]), force=True)

    def publish(self, topic: str, data: bytes) -> bool:
        conn = self.conn
        if conn is None or not self.ready:
            return False
        subject = self._subjects.get(topic)
        if subject is None:
            if len(self._subjects) >= 65_536:
                self._subjects.clear()
            subject = self._subjects[topic] = self._topic_prefix + codec.topic_token(topic)
        return self._fits(data, "publication") and conn.write(codec.pub(subject, data))

    def send(self, node: str, data: bytes) -> bool:
        subject = self._node_prefix + codec.topic_token(node)
        return self._fits(data, "message to a node") and self._write(codec.pub(subject, data))

    def announce(self, data: bytes, changes: Sequence[tuple[bytes, bytes | None]]) -> bool:
        state = self.state
        for key, value in changes:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        conn = self.conn
        if conn is not None and len(data) > conn.max_payload:
            # one announcement per part that fits: others would miss it for good
            parts = statewire.split_changes(data, changes, conn.max_payload - _REPLY_OVERHEAD)
            out = b"".join(codec.pub(self.announce_subject, part) for part in parts)
        else:
            out = codec.pub(self.announce_subject, data)
        # the node's own state is never dropped: others would miss it for good
        return self._write(out, force=True)

    def replace_state(self, state: NodeState) -> bool:
        self.state = dict(state)
        return self.ready

    def beat(self) -> None:
        """The heartbeat is the announcement the cluster makes next; here a PING, so that
        a server that has not answered one for ``max(3 heartbeats, connect-timeout)`` is
        taken for gone (a cut network sends no FIN) and the engine connects again."""
        conn = self.conn
        if conn is None or not self.ready:
            return
        now = self.context.reactor.seconds()
        if self._ping_since is None:
            self._ping_since = now
            conn.ping().addCallbacks(self._ponged, lambda failure: None)
            return
        settings = self.context.settings
        silent = now - self._ping_since
        if silent > max(3 * settings.heartbeat, settings.connect_timeout):
            self.context.log("stale", f"cluster: NATS at {self.url} has not answered a PING "
                             f"for {silent:.1f} s: connecting again")
            conn.abort()

    def _ponged(self, _: None) -> None:
        self._ping_since = None

    def snapshot(self, nodes: Sequence[str] | None = None) -> Deferred[dict[str, NodeState]]:
        conn = self.conn
        if conn is None or not self.ready:
            return defer.fail(NatsError("not connected"))
        done: Deferred[dict[str, NodeState]] = Deferred()
        own = self.context.node
        wanted = None if nodes is None else {n for n in nodes if n != own}
        if wanted is not None and not wanted:
            done.callback({})
            return done
        seq = next(self._asks)
        reply = self.reply_prefix + b"%d" % seq
        settings = self.context.settings
        if wanted is None:
            # nobody knows how many will answer: those that do within a heartbeat
            wait = min(settings.heartbeat, settings.connect_timeout)
            conn.write(codec.pub(self.ask_all_subject, b"", reply), force=True)
        else:
            wait = settings.connect_timeout
            conn.write(b"".join(
                codec.pub(self.ask_prefix + codec.topic_token(n), b"", reply) for n in wanted
            ), force=True)
        conn.flush()
        asking = self._asking[seq] = _Asking(wanted, done)
        asking.timer = self.context.reactor.callLater(wait, self._timed_out, seq)
        return done

    def _timed_out(self, seq: int) -> None:
        asking = self._asking.pop(seq, None)
        if asking is not None:
            asking.timer = None
            self._finish(asking, None)

    def _finish(self, asking: _Asking, error: Exception | None) -> None:
        if asking.timer is not None and asking.timer.active():
            asking.timer.cancel()
        if error is not None:
            asking.done.errback(error)
        else:
            asking.done.callback(dict(asking.states))

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
            "skipped": self.skipped,
            "too_big": self.too_big,
            "max_payload": conn.max_payload if conn is not None and conn.info else 0,
        }

    # -- from NATS -------------------------------------------------------------------------

    def _msg(self, msg: codec.Msg) -> None:
        sid = msg.sid
        if sid >= _FIRST_TOPIC_SID or sid == _OWN:
            self.context.events.delivered(msg.payload)
        elif sid == _ANNOUNCE:
            self.context.events.announced(msg.payload)
        elif sid == _REPLIES:
            self._answer_came(msg)
        elif sid in (_ASK_ALL, _ASK_ME):
            self._answer(msg)

    def _answer(self, msg: codec.Msg) -> None:
        """Another node asks for this node's state: the parts of it, each within the
        server's max_payload."""
        reply, conn = msg.reply, self.conn
        if reply is None or conn is None or not codec.valid_subject(reply):
            self._skip("a state request without a valid reply subject")
            return
        if reply.startswith(self.reply_prefix):
            return  # our own question to every node
        limit = max(conn.max_payload - _REPLY_OVERHEAD, 1024)
        parts = statewire.state_parts(self.context.node, self.state, limit)
        out = [codec.pub(reply, part) for part in parts]
        conn.write(b"".join(out), force=True)
        conn.flush()

    def _answer_came(self, msg: codec.Msg) -> None:
        try:
            seq = int(msg.subject.rsplit(b".", 1)[1])
            node, index, count, flat = statewire.read_part(msg.payload)
        except (ValueError, IndexError):
            self._skip("a malformed state reply")
            return
        asking = self._asking.get(seq)
        if asking is None or node == self.context.node:
            return  # too late, or a twin's
        parts = asking.parts.setdefault(node, [])
        if len(parts) != index:
            self._skip("a state reply's parts out of order")
            asking.parts.pop(node, None)
            return
        parts.append(flat)
        if len(parts) < count:
            return
        del asking.parts[node]
        state = asking.states[node] = {}
        for flat_part in parts:
            state.update(zip(flat_part[::2], flat_part[1::2], strict=True))
        if asking.wanted is not None and asking.wanted <= asking.states.keys():
            del self._asking[seq]
            self._finish(asking, None)

    def _skip(self, what: str) -> None:
        self.skipped += 1
        self.context.events.skipped(f"{what} from NATS")
