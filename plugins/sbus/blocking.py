"""The blocking sbus client, on a plain seqpacket socket (no reactor involved):
:class:`~.client_session.SbusClientSession` on the client kit's
:class:`~msgbroker.clientkit.blocking.BlockingClient`; and where both sbus clients connect
(the default address). :mod:`msgbroker.plugins.sbus.client` re-exports everything here;
import from there.

::

    with BlockingSbusClient("/run/user/1000/msgbroker/sbus.socket") as client:
        client.subscribe(b"news/*")
        client.sync()                          # the subscription is in force now
        client.publish(b"news/today", b"hello")
        packet = client.receive(timeout=5)     # a Publish or a ControlMessage, or None
        print(client.whoami())                 # b"!/cred/1000/1000/4242"

sbus answers nothing but ``CMSG !/cred/whoami``, so that round trip is the clients'
barrier (:meth:`~BlockingSbusClient.sync`): the broker handles a client's packets in
order, so once the reply is back, every packet written before it took effect, and every
message it routed to this client before is already received.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from msgbroker.clientkit import blocking as kit
from msgbroker.clientkit.reconnect import Reconnect

from . import codec
from .addresses import SeqpacketAddress, default_path, parse_address
from .client_session import (
    SbusClientSession,
    SbusConnectionClosed,
    SbusVerbs,
    flood_controls,
    server_packet,
)
from .codec import ControlMessage, Publish

__all__ = [
    "ADDRESS_ENV",
    "TIMEOUT",
    "BlockingClient",
    "BlockingSbusClient",
    "SbusConnectionClosed",
    "SbusVerbs",
    "as_address",
    "default_address",
    "flood_controls",
    "server_packet",
]

#: the environment variable naming the bus when no address is given (as ``sbusd`` sets it)
ADDRESS_ENV = "SBUS_ADDRESS"
TIMEOUT = 10.0


def default_address() -> str:
    """``$SBUS_ADDRESS``, else where the broker's embedded default listens."""
    from_env = os.environ.get(ADDRESS_ENV)
    if from_env:
        return from_env
    return default_path()


def as_address(address: SeqpacketAddress | str | None) -> SeqpacketAddress:
    """``address`` (an address as ``sbusd -a`` takes it, or None for the default) parsed."""
    if isinstance(address, SeqpacketAddress):
        return address
    return parse_address(default_address() if address is None else address)


class BlockingSbusClient(SbusVerbs, kit.BlockingClient):
    """A blocking sbus client. Not thread-safe.

    ``address``: a socket path, ``@name``, ``/dev/unix/abstract/HEX`` or ``/dev/fd/N`` (an
    inherited, connected socket); None for :func:`default_address`. ``timeout`` bounds the
    connect, each send, and :meth:`whoami`/:meth:`sync`. ``max_packet`` is the largest
    packet accepted from the broker (its own maximum, if configured larger).

    Sending never waits for an answer (sbus has none). Packets received while
    :meth:`whoami` waits are kept for :meth:`receive`. Anything from the broker outside the
    protocol closes the connection and raises :class:`SbusConnectionClosed`.

    ``reconnect`` (True, or a :class:`~msgbroker.clientkit.reconnect.Reconnect`): a lost
    connection is opened again, with the same patterns and echo and flood choices, by the
    next call (see :mod:`msgbroker.clientkit.blocking`; not for a ``/dev/fd/N`` socket).
    """

    peer = "broker"
    session: SbusClientSession

    def __init__(
        self,
        address: SeqpacketAddress | str | None = None,
        *,
        timeout: float | None = TIMEOUT,
        max_packet: int = codec.DEFAULT_MAX_PACKET,
        reconnect: Reconnect | bool | None = None,
    ) -> None:
        self.address = as_address(address)
        self._packets: deque[Publish | ControlMessage] = deque()
        sock = _connect(self.address, timeout)
        channel = kit.PacketChannel(sock, max_packet)
        super().__init__(
            SbusClientSession(max_packet), channel, timeout=timeout, reconnect=reconnect
        )
        self._opened()

    def _reopen(self) -> tuple[SbusClientSession, kit.StreamChannel]:
        if self.address.fd is not None:
            raise RuntimeError(f"{self.address}: an inherited socket cannot be opened again")
        max_packet = self.session.max_packet
        channel = kit.PacketChannel(_connect(self.address, self.timeout), max_packet)
        return SbusClientSession(max_packet), channel

    # -- sending -----------------------------------------------------------------------------

    def _perform(self, ask: Callable[[], int]) -> Any:
        """A round trip (whoami, login): TimeoutError (and the connection closed) when the
        reply does not come within ``timeout``."""
        return self._ask(ask, self.timeout, "answer")

    def sync(self) -> None:
        """Return once the broker handled everything sent before (a :meth:`whoami` round
        trip; see the module docstring)."""
        self.whoami()

    def close(self) -> None:
        """Close the socket; the broker still handles what was sent before. Never raises."""
        super().close()

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Publish | ControlMessage | None:
        """The next packet from the broker (kept or read now), or None after ``timeout``
        seconds (None: wait as long as it takes; 0: only what is already here). Raises
        :class:`SbusConnectionClosed` when the connection ends."""
        packet: Publish | ControlMessage | None = self._next(self._packets, timeout)
        return packet

    def messages(self) -> Iterator[Publish | ControlMessage]:
        """Every packet, as it arrives, until the connection ends (then it raises)."""
        return self._every(self.receive)

    # -- plumbing ----------------------------------------------------------------------------

    def _send(self, packet: codec.Packet) -> None:
        self._usable()
        self.session.send(packet)
        self._sent()

    def _event(self, packet: Publish | ControlMessage) -> None:
        self._packets.append(packet)


#: the name the sbus docs use
BlockingClient = BlockingSbusClient


def _connect(address: SeqpacketAddress, timeout: float | None) -> socket.socket:
    if address.fd is not None:
        return kit.adopt_socket(address.fd, kind=socket.SOCK_SEQPACKET)
    return kit.open_unix(address.sockaddr(), kind=socket.SOCK_SEQPACKET, timeout=timeout)
