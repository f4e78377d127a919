"""The sbus server session: packets in (one per ``data_received``), hub calls and flood
control out. Sans-IO: its glue (:mod:`.server`) feeds it what the seqpacket socket reads.

An sbus client has no login: it is known as ``sbus:<uid>:<pid>`` from its SO_PEERCRED
credentials (given by its transport) as soon as it connects. It is not entered in the
identity table: a process may open many sbus connections, and sbus has no unicast a name
would be for. It may log in (ours, not the README's):
``CMSG !/login\\0ID\\0SCHEME\\0CREDENTIAL`` with any enabled scheme (``password``,
``secret``...); accepted, it is known as ``ID`` from then on (entered in the identity table
like any login, for the other protocols and permissions); refused, it is answered late and
closed, as in every protocol. There is no keepalive either: a unix socket's peer cannot
vanish without the kernel telling us. Its subscriptions are hub patterns
(:meth:`~msgbroker.hub.Hub.subscribe_pattern`), so they receive what every protocol
publishes; its ``MSG`` packets are MCASTs on the topic its key maps to, and sbus recipients
get the very packet that came in — directly, without the hub, for a key whose recipients
the session remembers (:class:`~msgbroker.routecache.RouteCache`).

Its output is the client's flood-control :class:`~.flood.Outbox`, chosen when it opens.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from msgbroker.auth import Accept, AuthResult, LoginRequest
from msgbroker.connection import ServerSession
from msgbroker.errors import LimitExceeded, RemoteProtocolError
from msgbroker.message import Kind, Message
from msgbroker.reasons import CloseReason
from msgbroker.routecache import RouteCache

from . import codec
from .flood import Outbox, Throttle, TransportSink
from .patterns import key_to_topic, resolve_subscription, topic_to_key

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.session import Session

    from .addresses import Credentials

log = Logger(namespace="msgbroker.sbus")

NAME = "sbus"
#: holds the client's input while its login is checked (Session.hold_reading)
_LOGIN_HOLD = "sbus.login"
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


class SbusServerSession(ServerSession):
    """One sbus client on the server side (see the module docstring).

    ``credentials`` are the peer's (SO_PEERCRED: ``pid``, ``uid``, ``gid``); a packet longer
    than ``max_packet`` (the listener's ``max-packet``) closes the connection.
    """

    name = NAME
    encode = staticmethod(encode_message)
    login_required = False
    #: every close drops what the client has not read yet, but the broker's own: shutdown,
    #: a kick (a login of its identity elsewhere) and a refused login send it first
    aborted_on = frozenset(CloseReason) - {
        CloseReason.SHUTDOWN,
        CloseReason.KICKED,
        CloseReason.LOGIN_REFUSED,
    }

    def __init__(
        self,
        broker: Broker,
        peer: Session,
        timers: Any,
        link: Any = None,
        *,
        credentials: Credentials,
        max_packet: int = codec.DEFAULT_MAX_PACKET,
    ) -> None:
        super().__init__(broker, peer, timers, link)
        self.credentials = credentials
        self.max_packet = max_packet

    @classmethod
    def make_output(cls, broker: Broker, session: Session, transport: Any) -> Outbox:
        """The client's flood-control outbox on its socket (or, sans-IO, on any byte
        transport with a streaming producer): bounded by ``--max-backlog``, a member of the
        broker's output budget, and with a hard policy (and the fallback of a ``block``
        that outlasts ``--block-timeout``) that follows ``--slow-consumer`` — one slow
        client never blocks the bus."""
        sink = transport if hasattr(transport, "write_through") else TransportSink(transport)
        hub = broker.hub
        hard = "discard" if broker.policy.drop else "error"
        outbox = Outbox(
            sink.send_packet,
            sink.want_writable,
            partial(_flood_error, session),
            broker.policy.max_backlog,
            lambda: None if hub.source is None else throttle_of(hub.source),
            block_timeout=broker.config.block_timeout,
            fallback=hard,
            on_dropped=partial(_dropped, session),
            budget=broker.output_budget,
            # a socket's deliveries during one input go out in one system call
            send_many=getattr(sink, "send_packets", None),
            defer=broker.batcher.mark,
        )
        outbox.policy.hard = hard
        outbox.policy_changed()
        sink.write_through(outbox)
        return outbox

    def opened(self) -> None:
        credentials = self.credentials
        peer = self.peer
        self.identity = peer.identity = f"sbus:{credentials.uid}:{credentials.pid}"
        peer.data["sbus.credentials"] = credentials
        self.outbox: Outbox = peer.output  # type: ignore[assignment]
        # a block stall's deadline is one of this session's timers
        self.outbox.call_later = self.timers.call_later
        #: the recipients of the keys it publishes on, remembered; with echo (the
        #: default: ``CMSG echo/off`` clears it) the client receives its own messages
        self.routes = RouteCache(self.hub, peer, encode_message, echo=True)
        #: a login being checked; the packets that came after it, held until it is decided
        self._login_pending = False
        self._logged_in = False
        #: a refused login's late answer is due: nothing more is handled
        self._refusing = False
        self._held: list[bytes] = []

    # -- packets -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """One packet."""
        self.packets_received((data,))

    def packets_received(self, packets: Iterable[bytes]) -> None:
        """A read slice of packets, in order, up to a close. The hot path: the route cache
        takes the slice, and a publish whose recipients are remembered goes straight from
        the transport's read to their outboxes; every other packet comes back to
        :meth:`_packet`."""
        if self.closed or self._refusing:
            return
        if self._login_pending:
            self._held.extend(packets)
            return
        packets = iter(packets)
        self.routes.send_frames(packets, _MSG, b"\0", self.max_packet, self._packet)
        if self._login_pending:  # a login in the slice: the rest waits for its answer
            self._held.extend(packets)

    def _packet(self, data: bytes) -> bool:
        """A packet that is no publish on a remembered route; False once closed, or
        when it was a login still being checked."""
        self._handle(data)
        return not (self.closed or self._login_pending or self._refusing)

    def _handle(self, data: bytes) -> None:
        if len(data) > self.max_packet:
            self._protocol_error(f"packet of more than {self.max_packet} bytes")
        elif data[:4] == _MSG:
            nul = data.find(b"\0", 4)
            if nul < 0:
                self._protocol_error("MSG without a NUL after its routing key")
            else:
                self._publish(data[4:nul], data, nul)
        else:
            self._request(data)

    def _request(self, data: bytes) -> None:
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
        authorizes = broker.authorizes
        if authorizes and not broker.authorize(self.peer, "publish", topic):
            self._refused("publish", topic)
            return
        message = Message(Kind.MCAST, self.identity, NAME, topic, data[nul + 1 :])
        message.preencode(encode_message, data)  # sbus recipients get this very packet
        routes = self.routes
        self.hub.multicast(self.peer, message, routes.echo)
        # a hook that asks about each publish must see every one; one that decides per
        # topic has answered for this key until the hub's generation changes
        if not authorizes or broker.authorizes_per_topic:
            routes.remember(key, topic)

    def _subscribe(self, pattern: bytes) -> None:
        credentials = self.credentials
        stored = resolve_subscription(pattern, credentials.gid, credentials.uid, credentials.pid)
        if stored is None:
            self._protocol_error(f"may not subscribe to {pattern!r}: not its credentials")
            return
        topic = key_to_topic(stored)
        broker = self.broker
        if broker.authorizes and not broker.authorize(self.peer, "subscribe", topic):
            self._refused("subscribe", topic)
            return
        try:
            self.hub.subscribe_pattern(self.peer, topic)
        except LimitExceeded as e:
            # sbus cannot answer "no" (docs/sbus.md, Limits): that client is closed; the
            # hub has counted and logged the refusal already (rate-limited)
            self.close(CloseReason.LIMIT_EXCEEDED, e.limit)

    def _unsubscribe(self, pattern: bytes) -> None:
        credentials = self.credentials
        stored = resolve_subscription(pattern, credentials.gid, credentials.uid, credentials.pid)
        if stored is not None:  # an unknown pattern is ignored (docs/sbus.md)
            self.hub.unsubscribe_pattern(self.peer, key_to_topic(stored))

    def _control(self, packet: codec.ControlMessage) -> None:
        key = packet.key
        if key == codec.WHOAMI:
            c = self.credentials
            self.reply(codec.encode_packet(codec.whoami_reply(c.gid, c.uid, c.pid)))
        elif key == codec.LOGIN:
            self._login(packet.payload)
        elif key == codec.ECHO_OFF:
            self.routes.echo = False
        elif key == codec.ECHO_ON:
            self.routes.echo = True
        elif key in codec.FLOOD_CONTROL:
            outbox = self.outbox
            order = outbox.policy.order
            outbox.policy.apply(key)
            outbox.policy_changed()
            if outbox.policy.order != order:
                outbox.reorder()
        # any other control message is the server's to ignore; none is ever forwarded

    # -- login ----------------------------------------------------------------------------

    def _login(self, payload: bytes) -> None:
        if self._logged_in:
            self._protocol_error("a second login")
            return
        try:
            identity, scheme, credential = codec.parse_login(payload)
        except RemoteProtocolError as e:
            self._protocol_error(str(e))
            return
        peer = self.peer
        request = LoginRequest(NAME, identity, scheme, credential, peer.host, None)
        peer.identity = None  # logged in (by the hub) under the identity accepted, if it is
        self._login_pending = True
        self.broker.begin_login(peer, request, self._login_decided)
        if self._login_pending:
            peer.hold_reading(_LOGIN_HOLD)

    def _login_decided(self, result: AuthResult) -> None:
        self._login_pending = False
        peer = self.peer
        if not isinstance(result, Accept):
            peer.identity = self.identity  # known by its credentials until it is closed
            self._held.clear()
            self._refusing = True
            delay = self.broker.config.login_failure_delay
            if delay > 0:
                peer.hold_reading(_LOGIN_HOLD)  # nothing more is read: it closes
                self.timers.call_later(delay, self._refuse_login)
            else:
                self._refuse_login()
            return
        self._logged_in = True
        self.identity = result.identity
        self.reply(
            codec.encode_packet(
                codec.ControlMessage(codec.LOGIN, codec.LOGIN_OK + b"\0" + result.identity.encode())
            )
        )
        held, self._held = self._held, []
        if held:  # answered later: what came meanwhile, in order
            self.packets_received(held)
        if not self.closed and not self._login_pending:
            peer.release_reading(_LOGIN_HOLD)

    def _refuse_login(self) -> None:
        if not self.closed:
            self.reply(codec.encode_packet(codec.ControlMessage(codec.LOGIN, codec.LOGIN_REFUSED)))
            self.close(CloseReason.LOGIN_REFUSED)

    # -- ends ------------------------------------------------------------------------------

    def _protocol_error(self, reason: str) -> None:
        # what a client got wrong is debug, as in every protocol: it cannot flood the log
        log.debug(
            "sbus client {identity} disconnected: {reason}", identity=self.identity, reason=reason
        )
        self.close(CloseReason.PROTOCOL_ERROR, reason)

    def _refused(self, action: str, topic: str) -> None:
        # a refusal is worth an info line, but a client that reconnects and asks again
        # must not multiply it: one per identity per 10 s, with a count
        self.broker.rate_limited_log(
            f"sbus-refused {self.identity}",
            self.timers.seconds(),
            f"sbus client {self.identity} may not {action} {topic!r}: disconnected",
        )
        self.close(CloseReason.NOT_AUTHORIZED, f"{action} {topic!r}")


def _flood_error(session: Session, reason: CloseReason, detail: str) -> None:
    """The outbox gave up on this client (``blocking/*/error``, a ``block`` that outlasted
    block-timeout, the broker's output budget); the broker logs a slow consumer's close."""
    log.debug(
        "sbus client {identity} disconnected: {detail}", identity=session.identity, detail=detail
    )
    session.stats.dropped += 1
    session.dropped += 1
    session.close(reason, detail)


def _dropped(session: Session, count: int) -> None:
    """The outbox dropped ``count`` deliveries to this client (its flood control)."""
    session.stats.dropped += count
    session.dropped += count
    if session.on_dropped is not None:
        session.on_dropped(session, count)
