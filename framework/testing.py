"""Helpers for testing msgbroker and its plugins without sockets.

``make_broker`` builds a :class:`~msgbroker.Broker` on a :class:`Clock`.

Two ways to talk to one of its protocols:

- :func:`drive` runs a protocol's server session alone, sans-IO: :class:`SessionDriver`
  feeds it bytes (split however the test likes), collects what it writes, and runs its
  timers when the test advances the clock. No Twisted protocol, no transport.
- :func:`connect` opens an in-memory connection through the protocol's Twisted factory
  (the adapter included); :class:`FakeConnection` feeds it bytes and collects what the
  broker writes. Timers run when the test advances ``broker.reactor``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from .broker import Broker
from .config import BrokerConfig, Listener
from .connection import ServerSession
from .reasons import CloseReason
from .timers import Timers


class ClosingTransport(StringTransport):
    """A StringTransport whose close (graceful or abort) reaches the protocol, as a real one
    would after flushing, and which records how it was closed."""

    protocol: Any = None
    closed_by: str | None = None

    def _close(self, how: str) -> None:
        if self.closed_by is None:
            self.closed_by = how
            self.disconnecting = True
            if self.protocol is not None:
                self.protocol.connectionLost(Failure(ConnectionError(how)))

    def loseConnection(self) -> None:
        self._close("lose")

    def abortConnection(self) -> None:
        self._close("abort")


class FakeConnection:
    """One in-memory connection to a broker protocol."""

    def __init__(self, protocol: Any, transport: ClosingTransport) -> None:
        self.protocol = protocol
        self.transport = transport

    def send(self, data: bytes) -> None:
        """Deliver ``data`` from the peer to the broker (no-op once closed)."""
        if self.transport.closed_by is None:
            self.protocol.dataReceived(data)
            # a real reactor writes the batch at the end of the turn
            self.protocol.connection.broker.batcher.flush()

    def received(self) -> bytes:
        """What the broker wrote since the last call (the batch included, as the reactor
        writes it at the end of the turn)."""
        self.protocol.connection.broker.batcher.flush()
        data: bytes = self.transport.value()
        self.transport.clear()
        return data

    @property
    def closed(self) -> bool:
        return self.transport.closed_by is not None

    def drop(self) -> None:
        """The peer goes away (network loss)."""
        self.transport._close("peer")

    @property
    def session(self) -> Any:
        """The broker's :class:`~msgbroker.session.Session` of this connection."""
        return self.protocol.connection.session

    @property
    def server(self) -> Any:
        """The protocol's server session."""
        return self.protocol.connection.server


class RecordingLink:
    """A session's :class:`~msgbroker.session.Link` that records how it was asked to close
    (``closed``: each reason, ``"abort"`` for an abort) and does nothing else: for testing an
    :class:`~msgbroker.output.Output` or a :class:`~msgbroker.session.Session` alone."""

    def __init__(self) -> None:
        self.closed: list[CloseReason | str] = []

    def close_transport(self, reason: CloseReason) -> None:
        self.closed.append(reason)

    def abort(self) -> None:
        self.closed.append("abort")

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class RecordingTransportLink:
    """A :class:`~msgbroker.connection.TransportLink` that records how the connection asked
    it to end (``ended``: ``(reason, abort)`` pairs): for running a
    :class:`~msgbroker.connection.Connection` on a :class:`MemoryWire`."""

    def __init__(self) -> None:
        self.ended: list[tuple[CloseReason, bool]] = []

    def end(self, reason: CloseReason, abort: bool) -> None:
        self.ended.append((reason, abort))

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def certificate_names(self) -> frozenset[str] | None:
        return None


def make_broker(
    config: BrokerConfig | None = None,
    plugins: Iterable[Any] = (),
    clock: Clock | None = None,
    broker_class: type[Broker] = Broker,
) -> Broker:
    """A broker on a fake clock (``broker.reactor``); ``plugins`` are registered too."""
    return broker_class(config or BrokerConfig(auth=("open",)), clock or Clock(), plugins)


def connect(
    broker: Broker, protocol: str, host: str = "127.0.0.1", port: int = 40000
) -> FakeConnection:
    """Open an in-memory connection from ``host`` to ``broker``'s ``protocol``."""
    spec = broker.protocols[protocol]
    listener = Listener(protocol, "tcp:0")
    factory: Any = spec.factory(broker, listener)
    address = IPv4Address("TCP", host, port)
    proto: Any = factory.buildProtocol(address)
    if proto is None:
        raise ConnectionRefusedError(f"{protocol} connection from {host} refused by a limit")
    transport = ClosingTransport(peerAddress=address)
    transport.protocol = proto
    proto.makeConnection(transport)
    return FakeConnection(proto, transport)


class MemoryWire:
    """Where a driven session's output lands: a transport with a buffer the test reads,
    and a high-water mark the test can pass (:meth:`fill`) to make the peer slow."""

    def __init__(self) -> None:
        self.data = bytearray()
        #: the same, one item per write (a packet transport's packets)
        self.writes: list[bytes] = []
        self.producer: Any = None
        self.full = False

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes.append(data)
        if self.full and self.producer is not None:
            self.producer.pauseProducing()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def fill(self) -> None:
        """The peer stops reading: from the next write on the output holds what it sends."""
        self.full = True
        if self.producer is not None:
            self.producer.pauseProducing()

    def drain(self) -> None:
        """The peer read everything: what the output held comes out."""
        self.full = False
        if self.producer is not None:
            self.producer.resumeProducing()


class SessionDriver:
    """One server session driven without Twisted (see :func:`drive`)."""

    def __init__(
        self,
        broker: Broker,
        session_class: type[ServerSession],
        host: str = "127.0.0.1",
        certificate_names: frozenset[str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.broker = broker
        self.clock: Clock = broker.reactor
        self.wire = MemoryWire()
        #: how the session asked to be closed: None, "close" or "abort"
        self.closed_by: str | None = None
        #: whether the session holds the peer's input now
        self.reading_paused = False
        self._names = certificate_names
        self.timers = Timers(self.clock.seconds)
        self.session = broker.open_session(
            protocol=session_class.name,
            encode=session_class.encode,
            link=self,
            host=host,
            make_output=lambda s: session_class.make_output(broker, s, self.wire),
        )
        self.server = session_class(broker, self.session, self.timers, self, **(options or {}))
        self.server.opened()
        self._lost = False

    def feed(self, data: bytes) -> None:
        """``data`` arrives from the peer (no-op once the connection is gone)."""
        if not self._lost:
            stats = self.broker.hub.stats
            routed = stats.routed
            self.server.data_received(data)
            self.session.bytes_in += len(data)
            self.session.messages_in += stats.routed - routed
            self.broker.batcher.flush()

    def feed_to(self, handle: Callable[..., None], *args: Any, size: int = 0) -> None:
        """Input for a method of the server session other than ``data_received`` (what a
        transport glue decodes itself, a WebSocket message of ``size`` bytes):
        ``handle(*args)``, as :meth:`msgbroker.connection.Connection.feed_to` does (no-op
        once gone)."""
        if not self._lost:
            stats = self.broker.hub.stats
            routed = stats.routed
            handle(*args)
            self.session.bytes_in += size
            self.session.messages_in += stats.routed - routed
            self.broker.batcher.flush()

    def feed_split(self, data: bytes, sizes: Iterable[int]) -> None:
        """``data`` arrives in pieces of ``sizes`` bytes (the rest in one last piece)."""
        at = 0
        for size in sizes:
            self.feed(data[at : at + size])
            at += size
        if at < len(data):
            self.feed(data[at:])

    def advance(self, seconds: float) -> None:
        """Time passes: the broker's clock moves and the session's due timers run."""
        self.clock.advance(seconds)
        if not self._lost:
            self.timers.tick()
            self.broker.batcher.flush()

    def received(self) -> bytes:
        """What the session wrote since the last call (the batch included: the reactor
        writes it at the end of the turn, before anyone could look)."""
        self.broker.batcher.flush()
        data = bytes(self.wire.data)
        self.wire.data.clear()
        self.wire.writes.clear()
        return data

    def received_packets(self) -> list[bytes]:
        """What the session wrote since the last call, one item per write: the packets,
        for a protocol on a packet transport (sbus)."""
        self.broker.batcher.flush()
        writes = self.wire.writes[:]
        self.wire.data.clear()
        self.wire.writes.clear()
        return writes

    @property
    def closed(self) -> bool:
        return self.closed_by is not None

    def lose(self) -> None:
        """The connection is gone (the peer left, or the close the session asked for)."""
        if not self._lost:
            self._lost = True
            self.timers.cancel_all()
            self.server.lost()
            self.broker.session_closed(self.session, CloseReason.PEER)

    # -- the session's link ---------------------------------------------------------------------

    def close_transport(self, reason: CloseReason) -> None:
        abort = reason in self.server.aborted_on
        self.closed_by = "abort" if abort else "close"
        if not abort:  # as the connection adapter: what is batched goes before the close
            self.session.output.flush()
        self.wire.unregisterProducer()
        self.lose()

    def abort(self) -> None:
        self.closed_by = "abort"
        self.lose()

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def certificate_names(self) -> frozenset[str] | None:
        return self._names


def drive(broker: Broker, protocol: str, host: str = "127.0.0.1", **options: Any) -> SessionDriver:
    """Run ``broker``'s ``protocol`` server session sans-IO (:class:`SessionDriver`);
    ``options`` go to the session's constructor, as its transport would give them (sbus:
    ``credentials``, ``max_packet``)."""
    spec = broker.protocols[protocol]
    if spec.session is None:
        raise ValueError(f"protocol {protocol!r} registers no server session")
    if not broker.admit(IPv4Address("TCP", host, 40000)):
        raise ConnectionRefusedError(f"{protocol} connection from {host} refused by a limit")
    return SessionDriver(broker, spec.session, host, options=options)
