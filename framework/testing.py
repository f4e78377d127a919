"""Helpers for testing msgbroker and its plugins without sockets.

``make_broker`` builds a :class:`~msgbroker.Broker` on a :class:`Clock`;
``connect(broker, "ssmp")`` opens an in-memory connection to one of its protocols;
:class:`FakeConnection` feeds it bytes and collects what the broker writes. Timers (login
timeout, keepalive) run when the test advances ``broker.reactor``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from .broker import Broker
from .config import BrokerConfig, Listener


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

    def received(self) -> bytes:
        """What the broker wrote since the last call."""
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
        return self.protocol.session


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
    factory: Any = spec.build_factory(broker, listener)
    address = IPv4Address("TCP", host, port)
    proto: Any = factory.buildProtocol(address)
    if proto is None:
        raise ConnectionRefusedError(f"{protocol} connection from {host} refused by a limit")
    transport = ClosingTransport(peerAddress=address)
    transport.protocol = proto
    proto.makeConnection(transport)
    return FakeConnection(proto, transport)
