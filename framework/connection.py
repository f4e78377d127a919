"""One connection lifecycle for every protocol and transport.

A protocol is a :class:`ServerSession` subclass: sans-IO, it takes bytes in
(:meth:`ServerSession.data_received`; a stream chunk, a WebSocket message or a packet,
whatever its transport delivers) and gives hub calls, replies (``self.reply``) and timer
requests (``self.timers``) out. It never sees Twisted.

:class:`Connection` is the one adapter around it, composed, not inherited: it opens the
broker's :class:`~msgbroker.session.Session` with the output the server session chooses,
feeds it input (what that causes is written at the end of the reactor turn), gives it its
timers (:class:`Timers`: the session asks for deadlines; they wait on the broker's one
queue), carries out closes and tells the broker when the connection is gone. What differs
per transport is a small :class:`TransportLink` — how to close, pause and resume reading,
which certificate the peer showed: :class:`StreamProtocol` for TCP and TLS here; STMP's
WebSocket and sbus's seqpacket sockets provide their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from twisted.internet.protocol import Factory
from twisted.internet.protocol import Protocol as TwistedProtocol

from .output import TransportOutput
from .reasons import ABORTED, CloseReason
from .tcpkeepalive import set_tcp_keepalive
from .timers import Keepalive, Timer, Timers
from .tls import peer_names

if TYPE_CHECKING:
    from .broker import Broker
    from .config import Listener
    from .message import Message
    from .output import Output
    from .session import Session


class ServerSession:
    """Base of every protocol's server session (sans-IO).

    A subclass sets ``name`` and ``encode`` (the protocol's delivery encoder) and
    implements :meth:`data_received`; it answers with ``self.reply(frame)``, routes through
    ``self.hub`` and the broker's decisions (``self.broker.login``, ``authorize``), asks for
    timers through ``self.timers`` and ends with ``self.close(reason, detail)``. The login
    timeout runs from the start; :meth:`logged_in` stops it and starts the keepalive, which
    calls :meth:`send_keepalive` when the peer is idle. What only the transport knows comes
    as keyword arguments of the constructor (:class:`Connection`'s ``options``).
    """

    # what every session has, in slots: a protocol's own attributes stay in its instance
    # dict (the few it has fit Python's shared-key dicts, about 30 names at most: past
    # that, each session's dict is a full one of over a kilobyte)
    __slots__ = ("_login_timer", "broker", "hub", "keepalive", "link", "peer", "reply", "timers")

    name: ClassVar[str]
    #: whether the peer must log in within ``--login-timeout``
    login_required: ClassVar[bool] = True
    #: close reasons for which the connection is aborted rather than flushed and closed
    aborted_on: ClassVar[frozenset[CloseReason]] = ABORTED
    #: whether the protocol has a ping of its own (:meth:`send_keepalive`). Without one,
    #: silence proves nothing: no idle timer runs after login, and a stream transport asks
    #: the kernel to probe a silent peer instead (:mod:`msgbroker.tcpkeepalive`)
    heartbeat: ClassVar[bool] = True

    def __init__(self, broker: Broker, peer: Session, timers: Timers, link: Any = None) -> None:
        self.broker = broker
        self.hub = broker.hub
        #: the broker's (and the hub's) view of this connection
        self.peer = peer
        self.timers = timers
        #: the adapter (``certificate_names()``); None for a session driven by a test
        self.link = link
        self.reply: Callable[[bytes], None] = peer.output.reply
        self.keepalive: Keepalive | None = None
        self._login_timer: Timer | None = None
        if self.login_required:
            self._login_timer = timers.call_later(
                broker.config.login_timeout, self.login_timed_out
            )

    @staticmethod
    def encode(message: Message) -> bytes | None:
        """The protocol's encoding of a delivery, or None when it cannot carry it (set it
        with ``encode = staticmethod(...)``); the hub calls it once per fan-out."""
        raise NotImplementedError

    @classmethod
    def make_output(cls, broker: Broker, session: Session, transport: Any) -> Output:
        """The output this protocol writes through (batched to the transport; MM2 and sbus
        choose their own)."""
        return TransportOutput(
            session, transport, broker.policy, broker.batcher, broker.output_budget
        )

    def opened(self) -> None:
        """The connection is open (before any input)."""

    def data_received(self, data: bytes) -> None:
        """What the peer sent (a stream chunk, a WebSocket message, a packet)."""
        raise NotImplementedError

    def packets_received(self, packets: Iterable[bytes]) -> None:
        """Several packets at once (a packet transport's read slice): each to
        :meth:`data_received`, unless the protocol has a faster way to take them."""
        for data in packets:
            self.data_received(data)

    def certificate_names(self) -> frozenset[str] | None:
        """Names the verified client certificate proves (after the TLS handshake, so ask at
        login); ``None`` without TLS or without a certificate."""
        names = None if self.link is None else self.link.certificate_names()
        self.peer.tls_names = names
        return names

    def logged_in(self) -> None:
        """Call once the login succeeded: stops the login timer, starts the keepalive (with
        a :attr:`heartbeat`)."""
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        self.start_keepalive()

    def start_keepalive(self) -> None:
        """Start the framework's :class:`Keepalive` (at login). A protocol whose heartbeat
        is its own (STMP pings on a fixed cadence from the open) overrides this."""
        if not self.heartbeat:  # the kernel's TCP keepalive probes instead
            return
        self.keepalive = Keepalive(self.timers, self.broker.config.keepalive, self)

    @property
    def keepalive_held(self) -> bool:
        """The broker itself stopped reading from the peer: its silence is ours."""
        return self.peer.reading_held

    def touch(self) -> None:
        """Activity (once per input): the keepalive starts counting again."""
        if self.keepalive is not None:
            self.keepalive.touch()

    def send_keepalive(self) -> None:
        """Send the protocol's ping (the peer was idle for one keepalive interval)."""

    def login_timed_out(self) -> None:
        self._login_timer = None
        self.close(CloseReason.LOGIN_TIMEOUT)

    def keepalive_expired(self) -> None:
        self.close(CloseReason.KEEPALIVE_TIMEOUT)

    def close(self, reason: CloseReason, detail: str = "") -> None:
        self.peer.close(reason, detail)

    @property
    def closed(self) -> bool:
        return self.peer.close_reason is not None

    def lost(self) -> None:
        """The connection is gone (its timers are cancelled already)."""


class TransportLink(Protocol):
    """What the adapter needs of one transport."""

    def end(self, reason: CloseReason, abort: bool) -> None:
        """Close the transport: ``abort`` at once, or flush what was written first."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def certificate_names(self) -> frozenset[str] | None: ...


class Connection:
    """One connection, any protocol, any transport (see the module docstring).

    ``options`` are keyword arguments for the server session's constructor: what only the
    transport knows and the session needs (sbus: the peer's SO_PEERCRED credentials, the
    listener's largest packet).
    """

    __slots__ = ("broker", "server", "session", "timers", "transport_link")

    def __init__(
        self,
        broker: Broker,
        session_class: type[ServerSession],
        transport_link: TransportLink,
        transport: Any,
        host: str = "",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.broker = broker
        self.transport_link = transport_link
        # on the broker's queue, which runs every connection's timers on one reactor call
        self.timers = Timers(broker.reactor.seconds, broker.session_timers)
        self.session = broker.open_session(
            protocol=session_class.name,
            encode=session_class.encode,
            link=self,
            host=host,
            make_output=lambda s: session_class.make_output(broker, s, transport),
        )
        self.server = session_class(broker, self.session, self.timers, self, **(options or {}))
        self.server.opened()

    # input to a session that is closing is not handled: it is being closed (or, at
    # shutdown, flushes its output first, out of the routing core)

    def data_received(self, data: bytes) -> None:
        if self.session.close_reason is not None:
            return
        stats = self.broker.hub.stats
        routed = stats.routed
        self.server.data_received(data)
        # counted per input, not per message: whatever the hub routed meanwhile, this
        # peer published
        session = self.session
        session.bytes_in += len(data)
        session.messages_in += stats.routed - routed
        # what this input caused is written at the end of the reactor turn (the batcher's
        # call): with every other input read in this turn, one write per recipient

    def packets_received(self, packets: Iterable[bytes]) -> None:
        """Inputs that come whole, several per read (a packet transport's slice, maybe read
        lazily: it stops at the packet after which the session held its input or closed):
        to the session's ``packets_received``, written at the end of the reactor turn."""
        if self.session.close_reason is not None:
            for _ in packets:  # read and let go: unread, the socket would stay readable
                pass
            return
        stats = self.broker.hub.stats
        routed = stats.routed
        self.server.packets_received(packets)
        self.session.messages_in += stats.routed - routed

    def feed_to(self, handle: Callable[..., None], *args: Any, size: int = 0) -> None:
        """Input the transport glue decoded itself (a WebSocket message and its type, of
        ``size`` bytes), for a method of the server session: ``handle(*args)``; its output is
        written at the end of the reactor turn, as after :meth:`data_received`."""
        if self.session.close_reason is not None:
            return
        stats = self.broker.hub.stats
        routed = stats.routed
        handle(*args)
        session = self.session
        session.bytes_in += size
        session.messages_in += stats.routed - routed

    def lost(self) -> None:
        """The transport is gone, whatever the reason."""
        self.timers.cancel_all()
        self.server.lost()
        session = self.session
        self.broker.session_closed(session, CloseReason.PEER)
        callbacks, session.on_lost = session.on_lost, []
        for callback in callbacks:
            callback()

    # -- the session's link -------------------------------------------------------------------

    def close_transport(self, reason: CloseReason) -> None:
        abort = reason in self.server.aborted_on
        if not abort:  # what is batched (the answer that explains the close) goes first
            self.session.output.flush()
        self.transport_link.end(reason, abort)

    def abort(self) -> None:
        """Cut the connection now (shutdown's last resort)."""
        self.transport_link.end(CloseReason.SHUTDOWN, True)

    def pause_reading(self) -> None:
        self.transport_link.pause_reading()

    def resume_reading(self) -> None:
        self.transport_link.resume_reading()

    def certificate_names(self) -> frozenset[str] | None:
        return self.transport_link.certificate_names()


def no_delay(transport: Any) -> None:
    """Disable Nagle's algorithm on the TCP socket under ``transport`` (through TLS).

    A broker answers small requests with small writes; with Nagle, a reply written while
    an earlier one is unacknowledged waits for the peer's delayed ACK (40 ms on Linux).
    Throughput does not suffer: the transport still coalesces each reactor turn's writes.
    """
    for _ in range(4):
        set_no_delay = getattr(type(transport), "setTcpNoDelay", None)
        if set_no_delay is not None and hasattr(transport, "socket"):
            with contextlib.suppress(OSError):  # not a TCP socket after all (unix)
                transport.setTcpNoDelay(True)
            return
        transport = getattr(transport, "transport", None)
        if transport is None:
            return


def reading_transport(transport: Any) -> Any:
    """The transport that reads the socket under ``transport``: through TLS, whose protocol
    wrapper cannot pause reading itself."""
    for _ in range(4):
        if transport is None or hasattr(transport, "pauseProducing"):
            break
        transport = getattr(transport, "transport", None)
    return transport


class ReadsTransport:
    """``pause_reading``, ``resume_reading`` and ``certificate_names`` of a
    :class:`TransportLink` whose ``transport`` is a Twisted transport (through TLS)."""

    transport: Any

    def pause_reading(self) -> None:
        reader = reading_transport(self.transport)
        if reader is not None:
            reader.pauseProducing()

    def resume_reading(self) -> None:
        reader = reading_transport(self.transport)
        if reader is not None:
            reader.resumeProducing()

    def certificate_names(self) -> frozenset[str] | None:
        return peer_names(self.transport)


class StreamProtocol(ReadsTransport, TwistedProtocol):
    """TCP and TLS (and unix stream sockets): the Twisted side of a :class:`Connection`."""

    connection: Connection | None = None

    def __init__(self, broker: Broker, session_class: type[ServerSession]) -> None:
        self.broker = broker
        self.session_class = session_class

    def connectionMade(self) -> None:
        transport: Any = self.transport
        no_delay(transport)
        if not self.session_class.heartbeat:
            set_tcp_keepalive(transport, self.broker.config.keepalive)
        host = getattr(transport.getPeer(), "host", "") or ""
        self.connection = Connection(self.broker, self.session_class, self, transport, host)

    def dataReceived(self, data: bytes) -> None:
        self.connection.data_received(data)  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        if self.connection is not None:
            self.connection.lost()

    # -- TransportLink --------------------------------------------------------------------------

    def end(self, reason: CloseReason, abort: bool) -> None:
        transport: Any = self.transport
        # a registered producer keeps a TLS transport from finishing its close
        transport.unregisterProducer()
        if abort:
            transport.abortConnection()
        else:
            transport.loseConnection()



class StreamFactory(Factory):
    """Builds one :class:`StreamProtocol` per connection of one listener, for one server
    session class; connections over a limit are refused before any protocol is built."""

    def __init__(self, broker: Broker, session_class: type[ServerSession]) -> None:
        self.broker = broker
        self.session_class = session_class

    def buildProtocol(self, addr: Any) -> StreamProtocol | None:
        if not self.broker.admit(addr):
            return None  # over a connection limit: Twisted closes the socket at once
        proto = StreamProtocol(self.broker, self.session_class)
        proto.factory = self
        return proto

    def doStart(self) -> None:  # quiet: the service logs what each listener is bound to
        self.numPorts += 1

    def doStop(self) -> None:
        self.numPorts -= 1


def stream_factory(session_class: type[ServerSession]) -> Callable[[Broker, Listener], Factory]:
    """``build_factory`` for a protocol served over stream endpoints (tcp, tls, unix)."""

    def build_factory(broker: Broker, listener: Listener) -> Factory:
        return StreamFactory(broker, session_class)

    return build_factory
