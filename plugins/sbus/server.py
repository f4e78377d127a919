"""The Twisted side of sbus's server: the glue between a seqpacket socket
(:class:`~.seqpacket.SeqpacketConnection`) and the framework's
:class:`~msgbroker.connection.Connection` around one :class:`~.protocol.SbusServerSession`.

The glue is the transport's protocol and the connection's
:class:`~msgbroker.connection.TransportLink`: it opens the connection with what the socket
knows (the peer's SO_PEERCRED credentials, the listener's largest packet), hands it each
read slice, lazily, so that reading stops at the very packet after which the session paused
its peer or closed (:meth:`Connection.packets_received`), and closes, pauses and resumes the
socket when the connection asks. Opening, closing, loss and flushing are the connection's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.internet.protocol import Factory

from msgbroker.connection import Connection
from msgbroker.reasons import CloseReason

from . import codec
from .protocol import SbusServerSession


class SbusGlue:
    """One sbus client on the server (see the module docstring)."""

    __slots__ = ("broker", "connection", "max_packet", "transport")

    def __init__(self, broker: Any, max_packet: int) -> None:
        self.broker = broker
        self.max_packet = max_packet
        self.transport: Any = None
        self.connection: Connection | None = None

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport
        options = {"credentials": transport.credentials, "max_packet": self.max_packet}
        self.connection = Connection(
            self.broker, SbusServerSession, self, transport, options=options
        )

    def packets_received(self, packets: Iterable[bytes]) -> None:
        self.connection.packets_received(packets)  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        if self.connection is not None:
            self.connection.lost()

    # -- TransportLink --------------------------------------------------------------------------

    def end(self, reason: CloseReason, abort: bool) -> None:
        if abort:
            self.transport.abortConnection()
        else:
            self.transport.loseConnection()  # once the outbox has sent what it holds

    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.transport.resumeProducing()

    def certificate_names(self) -> None:
        return None


class SbusFactory(Factory):
    """Builds one :class:`SbusGlue` per client of one listener, within the broker's
    connection limits."""

    def __init__(self, broker: Any, max_packet: int = codec.DEFAULT_MAX_PACKET) -> None:
        self.broker = broker
        self.max_packet = max_packet

    @property
    def listen_backlog(self) -> int:
        """The accept queue the seqpacket endpoint listens with: the broker's setting."""
        return int(self.broker.config.listen_backlog)

    def buildProtocol(self, addr: Any) -> SbusGlue | None:  # type: ignore[override]
        if not self.broker.admit(addr):
            return None  # over a connection limit: the port closes the socket at once
        return SbusGlue(self.broker, self.max_packet)

    def doStart(self) -> None:  # quiet: the service logs what each listener is bound to
        self.numPorts += 1

    def doStop(self) -> None:
        self.numPorts -= 1
