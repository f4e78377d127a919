"""sbus server protocol: the thin Twisted adapter between the codec, the hub and one
client's :class:`~.flood.Outbox`.

An sbus client has no login: it is known as ``sbus:<uid>:<pid>`` from its SO_PEERCRED
credentials as soon as it connects. It is not entered in the identity table: a process
may open many sbus connections, and sbus has no unicast a name would be for. Its
subscriptions are hub patterns (:meth:`~msgbroker.hub.Hub.subscribe_pattern`), so they
receive what every protocol publishes; its ``MSG`` packets are MCASTs on the topic its key
maps to, and sbus recipients get the very packet that came in.
"""

from __future__ import annotations

import errno
from typing import Any

from twisted.internet import main
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from msgbroker.errors import LimitExceeded, RemoteProtocolError
from msgbroker.legacy import OutboxOutput, open_legacy_session
from msgbroker.message import Kind, Message

from . import codec
from .flood import Throttle
from .patterns import key_to_topic, resolve_subscription, topic_to_key

log = Logger(namespace="msgbroker.sbus")

NAME = "sbus"
_MSG = b"MSG "


def encode_message(message: Message) -> bytes | None:
    """The ``MSG key\\0payload`` packet for an MCAST; None for what sbus cannot carry: any
    other kind, or a topic that is no routing key (a NUL, or a lone surrogate)."""
    if message.kind is not Kind.MCAST:
        return None
    try:
        key = topic_to_key(message.topic)  # type: ignore[arg-type]
    except ValueError:
        return None
    return _MSG + key + b"\0" + message.payload


def throttle_of(session: Any) -> Throttle:
    """The :class:`Throttle` that holds reading from ``session``'s connection (whatever its
    protocol) while some outbox it filled asks it to wait, made on first use. It holds the
    session's input through :meth:`~msgbroker.session.Session.hold_reading`, which is
    counted (another holder's release cannot resume it) and tells the keepalive timers
    that the silence is the broker's doing."""
    data = session.data
    throttle = data.get("sbus.throttle")
    if throttle is None:
        throttle = data["sbus.throttle"] = Throttle(
            lambda: session.hold_reading("sbus.throttle"),
            lambda: session.release_reading("sbus.throttle"),
        )
    return throttle


class SbusServerProtocol(Protocol):
    """One sbus client (see the module docstring)."""

    def __init__(self, broker: Any, max_packet: int) -> None:
        self.broker = broker
        self.hub = broker.hub
        self.max_packet = max_packet
        #: whether the client receives its own messages (``CMSG echo/off`` clears it)
        self.echo = True
        #: routing key -> (hub generation, recipients' offer, how many): see _remember_route
        self._routes: dict[bytes, tuple[int, tuple[Any, ...], int]] = {}
        self.identity = ""
        self.credentials: Any = None
        self.session: Any = None

    def connectionMade(self) -> None:
        transport: Any = self.transport
        credentials = self.credentials = transport.credentials
        self.identity = f"sbus:{credentials.uid}:{credentials.pid}"
        session = self.session = open_legacy_session(
            self.broker, NAME, encode_message, transport, self._close, "",
            output=OutboxOutput(transport.outbox),
        )
        session.identity = self.identity
        session.data["sbus.credentials"] = credentials
        outbox = transport.outbox
        broker = self.broker
        # the broker's slow-consumer policy is the default hard policy, and what replaces
        # block once a stall outlasts block-timeout: one slow client never blocks the bus
        outbox.policy.hard = outbox.fallback = "discard" if broker.policy.drop else "error"
        outbox.max_bytes = broker.policy.max_backlog
        outbox.block_timeout = broker.config.block_timeout
        outbox.call_later = broker.reactor.callLater
        outbox.on_dropped = self._dropped
        outbox.budget = broker.output_budget

    # -- packets -----------------------------------------------------------------------------

    def read_packets(self, transport: Any, budget: int) -> Any:
        """Read up to ``budget`` packets (the transport's ``doRead``, done here): a publish
        whose recipients are remembered (:meth:`_remember_route`) is offered to them
        right in this loop; every other packet goes to :meth:`packetReceived`. Returns
        what ``doRead`` returns: None, or why the connection ended."""
        # the reactor's shared buffer: each packet is copied out (tobytes) before the next read
        recv_into, view = transport.socket.recv_into, transport.receive_view()
        routes, hub, session, max_packet = self._routes, self.hub, self.session, self.max_packet
        received = self.packetReceived
        routed = delivered = 0
        try:
            for _ in range(budget):
                if transport.paused or not transport.connected or transport.disconnecting:
                    return None
                try:
                    size = recv_into(view)
                except BlockingIOError:
                    return None
                except InterruptedError:
                    continue
                except OSError as e:
                    return main.CONNECTION_LOST if e.errno != errno.ECONNRESET else e
                if not size:
                    return main.CONNECTION_DONE
                data = view[:size].tobytes()
                if data[:4] == _MSG and size <= max_packet:
                    nul = data.find(b"\0", 4)
                    route = routes.get(data[4:nul]) if nul > 0 else None
                    if route is not None and route[0] == hub.generation:
                        hub.source = session
                        for offer in route[1]:
                            offer(data)
                        routed += 1
                        delivered += route[2]
                        continue
                received(data)
            return None
        finally:
            stats = hub.stats
            stats.routed += routed
            stats.delivered += delivered

    def packetReceived(self, data: bytes) -> None:
        if len(data) > self.max_packet:
            self._protocol_error(f"packet of more than {self.max_packet} bytes")
            return
        if data[:4] == _MSG:  # the hot path: a publish
            nul = data.find(b"\0", 4)
            if nul < 0:
                self._protocol_error("MSG without a NUL after its routing key")
                return
            key = data[4:nul]
            route = self._routes.get(key)
            hub = self.hub
            if route is not None and route[0] == hub.generation:
                # only sbus clients receive it: the packet itself goes to each, no Message
                hub.source = self.session
                for offer in route[1]:
                    offer(data)
                stats = hub.stats
                stats.routed += 1
                stats.delivered += route[2]
                return
            self._publish(key, data, nul)
            return
        try:
            packet = codec.parse_packet(data, self.max_packet)
        except RemoteProtocolError as e:
            self._protocol_error(str(e))
            return
        if isinstance(packet, codec.Subscribe):
            self._subscribe(packet.pattern)
        elif isinstance(packet, codec.Unsubscribe):
            self._unsubscribe(packet.pattern)
        elif isinstance(packet, codec.ControlMessage):
            self._control(packet)

    def _publish(self, key: bytes, data: bytes, nul: int) -> None:
        topic = key.decode("utf-8", "surrogateescape")
        broker = self.broker
        if broker.authorizes and not broker.authorize(self.session, "publish", topic):
            self._refused("publish", topic)
            return
        message = Message(Kind.MCAST, self.identity, NAME, topic, data[nul + 1 :])
        message.preencode(encode_message, data)  # sbus recipients get this very packet
        # other protocols' recipients are batched: flushed on the reactor's next turn
        self.hub.multicast(self.session, message, self.echo)
        self._remember_route(key, topic)

    def _remember_route(self, key: bytes, topic: str) -> None:
        """When only sbus clients receive ``topic`` (no member of another protocol, no
        observer, no authorization hook), remember their ``offer``s: the next publishes
        on ``key`` skip the Message and the hub until the hub's recipients change."""
        hub = self.hub
        if hub.observer is not None or self.broker.authorizes or topic in hub.topics:
            return
        groups = hub.pattern_recipients(topic) if hub.patterns else {}
        if any(encoder is not encode_message for encoder in groups):
            return
        session = self.session
        offers = tuple(
            peer.send for peer in groups.get(encode_message, ()) if self.echo or peer is not session
        )
        routes = self._routes
        if len(routes) >= 1024:
            routes.clear()
        routes[key] = (hub.generation, offers, len(offers))

    def _subscribe(self, pattern: bytes) -> None:
        credentials = self.credentials
        stored = resolve_subscription(pattern, credentials.gid, credentials.uid, credentials.pid)
        if stored is None:
            self._protocol_error(f"may not subscribe to {pattern!r}: not its credentials")
            return
        topic = key_to_topic(stored)
        broker = self.broker
        if broker.authorizes and not broker.authorize(self.session, "subscribe", topic):
            self._refused("subscribe", topic)
            return
        try:
            self.hub.subscribe_pattern(self.session, topic)
        except LimitExceeded:
            # sbus cannot answer "no" (DECISIONS.md, Limits): that client is closed; the
            # hub has counted and logged the refusal already (rate-limited)
            self.session.close("limit exceeded")

    def _unsubscribe(self, pattern: bytes) -> None:
        credentials = self.credentials
        stored = resolve_subscription(pattern, credentials.gid, credentials.uid, credentials.pid)
        if stored is not None:  # an unknown pattern is ignored (DECISIONS.md)
            self.hub.unsubscribe_pattern(self.session, key_to_topic(stored))

    def _control(self, packet: codec.ControlMessage) -> None:
        key = packet.key
        outbox: Any = self.transport.outbox  # type: ignore[union-attr]
        if key == codec.WHOAMI:
            c = self.credentials
            outbox.reply(codec.encode_packet(codec.whoami_reply(c.gid, c.uid, c.pid)))
        elif key == codec.ECHO_OFF:
            self.echo = False
            self._routes.clear()
        elif key == codec.ECHO_ON:
            self.echo = True
            self._routes.clear()
        elif key in codec.FLOOD_CONTROL:
            order = outbox.policy.order
            outbox.policy.apply(key)
            if outbox.policy.order != order:
                outbox.reorder()
        # any other control message is the server's to ignore; none is ever forwarded

    # -- ends ------------------------------------------------------------------------------

    def _protocol_error(self, reason: str) -> None:
        log.info(
            "sbus client {identity} disconnected: {reason}", identity=self.identity, reason=reason
        )
        self.session.close("protocol error")

    def _refused(self, action: str, topic: str) -> None:
        log.info(
            "sbus client {identity} may not {action} {topic!r}: disconnected",
            identity=self.identity,
            action=action,
            topic=topic,
        )
        self.session.close("not authorized")

    def flood_error(self, reason: str) -> None:
        """The outbox gave up on this client (``blocking/*/error``, or a ``block`` that
        outlasted block-timeout); the broker logs the slow consumer's close."""
        log.debug(
            "sbus client {identity} disconnected: {reason}", identity=self.identity, reason=reason
        )
        session = self.session
        session.stats.dropped += 1
        session.dropped += 1
        session.close("slow consumer")

    def _dropped(self, count: int) -> None:
        """The outbox dropped ``count`` deliveries to this client (its flood control)."""
        session = self.session
        session.stats.dropped += count
        session.dropped += count
        self.broker.slow_consumer_dropped(session, count)

    def _close(self, reason: str) -> None:
        transport: Any = self.transport
        if reason in ("shutdown", "kicked"):
            transport.loseConnection()
        else:
            transport.abortConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        session = self.session
        if session is None:
            return
        self.broker.session_closed(session, "closed by peer")
        callbacks, session.on_lost = session.on_lost, []
        for callback in callbacks:
            callback()


class SbusFactory(Factory):
    """Builds one :class:`SbusServerProtocol` per client of one listener; ``source()`` is
    the throttle of the publisher being routed now (for ``block`` flood control)."""

    def __init__(self, broker: Any, max_packet: int = codec.DEFAULT_MAX_PACKET) -> None:
        self.broker = broker
        self.max_packet = max_packet

    @property
    def listen_backlog(self) -> int:
        """The accept queue the seqpacket endpoint listens with: the broker's setting."""
        return int(self.broker.config.listen_backlog)

    def source(self) -> Throttle | None:
        peer = self.broker.hub.source
        return None if peer is None else throttle_of(peer)

    def buildProtocol(self, addr: Any) -> SbusServerProtocol | None:
        if not self.broker.admit(addr):
            return None  # over a connection limit: the port closes the socket at once
        protocol = SbusServerProtocol(self.broker, self.max_packet)
        protocol.factory = self
        return protocol

    def doStart(self) -> None:  # quiet: the service logs what each listener is bound to
        self.numPorts += 1

    def doStop(self) -> None:
        self.numPorts -= 1
