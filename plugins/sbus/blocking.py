"""The blocking sbus client, on a plain seqpacket socket (no reactor involved), and what
both sbus clients share: the error, the default address, the flood-control helper.
:mod:`msgbroker.plugins.sbus.client` re-exports everything here; import from there.

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

import errno
import os
import socket
import time
from collections import deque
from collections.abc import Iterator

from msgbroker.errors import RemoteProtocolError

from . import codec, flood
from .addresses import default_path
from .codec import ControlMessage, Publish
from .seqpacket import SeqpacketAddress, parse_address

#: the environment variable naming the bus when no address is given (as ``sbusd`` sets it)
ADDRESS_ENV = "SBUS_ADDRESS"
TIMEOUT = 10.0


class SbusConnectionClosed(ConnectionError):
    """The connection ended (or was never usable): the broker closed it, it sent something
    outside the protocol, or this client was closed."""


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


def flood_controls(
    soft: str | None = None, hard: str | None = None, order: str | None = None
) -> list[bytes]:
    """The ``CMSG`` keys choosing the given flood-control behaviours (sbus.txt, "Flood
    control"): ``soft`` one of queue, discard, block, error; ``hard`` one of discard,
    block, error; ``order`` one of queue, stack, random. ValueError for anything else,
    before anything is sent."""
    keys = []
    for group, choice, allowed in (
        ("blocking/soft/", soft, flood.SOFT),
        ("blocking/hard/", hard, flood.HARD),
        ("order/", order, flood.ORDER),
    ):
        if choice is None:
            continue
        if choice not in allowed:
            raise ValueError(f"{group}{choice} is no flood control; choose from {allowed}")
        keys.append(f"{group}{choice}".encode("ascii"))
    return keys


def server_packet(data: bytes, max_packet: int) -> Publish | ControlMessage:
    """What the broker sent: a ``MSG`` or a ``CMSG``; RemoteProtocolError for anything
    else (malformed, too long, or a ``SUB``/``UNSUB``, which only clients send)."""
    packet = codec.parse_packet(data, max_packet)
    if not isinstance(packet, Publish | ControlMessage):
        raise RemoteProtocolError(f"a server never sends {type(packet).__name__} packets")
    return packet


class SbusVerbs:
    """What both clients send, the same way: each verb is one packet through ``_send``."""

    def _send(self, packet: codec.Packet) -> None:
        raise NotImplementedError

    def subscribe(self, pattern: bytes) -> None:
        self._send(codec.Subscribe(pattern))

    def unsubscribe(self, pattern: bytes) -> None:
        self._send(codec.Unsubscribe(pattern))

    def publish(self, key: bytes, payload: bytes) -> None:
        self._send(Publish(key, payload))

    def control(self, key: bytes, payload: bytes = b"") -> None:
        """Send ``CMSG key\\0payload`` to the broker (never forwarded to anyone)."""
        self._send(ControlMessage(key, payload))

    def echo(self, on: bool) -> None:
        """Whether this client receives its own messages (on by default)."""
        self.control(codec.ECHO_ON if on else codec.ECHO_OFF)

    def flood(
        self, soft: str | None = None, hard: str | None = None, order: str | None = None
    ) -> None:
        """What the broker does when this client cannot keep up; see :func:`flood_controls`."""
        for key in flood_controls(soft, hard, order):
            self.control(key)


class BlockingSbusClient(SbusVerbs):
    """A blocking sbus client. Not thread-safe.

    ``address``: a socket path, ``@name``, ``/dev/unix/abstract/HEX`` or ``/dev/fd/N`` (an
    inherited, connected socket); None for :func:`default_address`. ``timeout`` bounds the
    connect, each send, and :meth:`whoami`/:meth:`sync`. ``max_packet`` is the largest
    packet accepted from the broker (its own maximum, if configured larger).

    Sending never waits for an answer (sbus has none). Packets received while
    :meth:`whoami` waits are kept for :meth:`receive`. Anything from the broker outside the
    protocol closes the connection and raises :class:`SbusConnectionClosed`.
    """

    def __init__(
        self,
        address: SeqpacketAddress | str | None = None,
        *,
        timeout: float | None = TIMEOUT,
        max_packet: int = codec.DEFAULT_MAX_PACKET,
    ) -> None:
        self.address = as_address(address)
        self.timeout = timeout
        self.max_packet = max_packet
        self.closed = False
        self._received: deque[Publish | ControlMessage] = deque()
        self._replies: deque[bytes] = deque()
        self._asked = 0  # whoami requests whose reply has not come yet
        self._sock = _connect(self.address, timeout)

    def __enter__(self) -> BlockingSbusClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sending -----------------------------------------------------------------------------

    def whoami(self) -> bytes:
        """This client's credentials as the broker sees them: ``b"!/cred/GID/UID/PID"``
        (longer through a relay). TimeoutError (and the connection closed) when the reply
        does not come within ``timeout``."""
        self._asked += 1
        self._send(ControlMessage(codec.WHOAMI))
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self._replies:
            if not self._read(deadline):
                self._shut()
                raise TimeoutError(f"no answer to whoami within {self.timeout:g} s")
        return self._replies.popleft()

    def sync(self) -> None:
        """Return once the broker handled everything sent before (a :meth:`whoami` round
        trip; see the module docstring)."""
        self.whoami()

    def close(self) -> None:
        """Close the socket; the broker still handles what was sent before. Never raises."""
        self._shut()

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Publish | ControlMessage | None:
        """The next packet from the broker (kept or read now), or None after ``timeout``
        seconds (None: wait as long as it takes; 0: only what is already here). Raises
        :class:`SbusConnectionClosed` when the connection ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._received:
            if not self._read(deadline):
                return None
        return self._received.popleft()

    def messages(self) -> Iterator[Publish | ControlMessage]:
        """Every packet, as it arrives, until the connection ends (then it raises)."""
        while True:
            packet = self.receive()
            if packet is not None:
                yield packet

    # -- plumbing ----------------------------------------------------------------------------

    def _send(self, packet: codec.Packet) -> None:
        data = codec.encode_packet(packet)  # ValueError for a NUL in a key
        if self.closed:
            raise SbusConnectionClosed("the connection is closed")
        self._sock.settimeout(self.timeout)
        try:
            self._sock.send(data)  # one packet: sent whole or not at all
        except TimeoutError:
            self._shut()
            raise TimeoutError(f"the broker took nothing for {self.timeout:g} s") from None
        except (BrokenPipeError, ConnectionResetError) as e:
            self._shut()
            raise SbusConnectionClosed("the broker closed the connection") from e
        except OSError as e:
            self._shut()
            raise SbusConnectionClosed(f"cannot send: {e.strerror or e}") from e

    def _read(self, deadline: float | None) -> bool:
        """Read one packet and file it; False when ``deadline`` passed first."""
        if self.closed:
            raise SbusConnectionClosed("the connection is closed")
        if deadline is None:
            self._sock.settimeout(None)
        else:
            # 0 when due: a non-blocking read still takes what is already here
            self._sock.settimeout(max(deadline - time.monotonic(), 0.0))
        try:
            data = self._sock.recv(self.max_packet + 1)
        except (TimeoutError, BlockingIOError):
            return False
        except ConnectionResetError as e:  # it closed with our packets still unread
            self._shut()
            raise SbusConnectionClosed("the broker closed the connection") from e
        except OSError as e:
            self._shut()
            raise SbusConnectionClosed(f"connection lost: {e.strerror or e}") from e
        if not data:
            self._shut()
            raise SbusConnectionClosed("the broker closed the connection")
        try:
            packet = server_packet(data, self.max_packet)
        except RemoteProtocolError as e:
            self._shut()
            raise SbusConnectionClosed(f"protocol error from the broker: {e}") from e
        if self._asked and isinstance(packet, ControlMessage) and packet.key == codec.WHOAMI:
            self._asked -= 1
            self._replies.append(packet.payload)
        else:
            self._received.append(packet)
        return True

    def _shut(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()


#: the name the sbus docs use
BlockingClient = BlockingSbusClient


def inherited_socket(fd: int) -> socket.socket:
    """A copy of the connected socket ``fd`` (``/dev/fd/N``: a parent process connected it)."""
    sock = socket.socket(fileno=os.dup(fd))
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
        sock.close()
        raise OSError(errno.EPROTOTYPE, f"/dev/fd/{fd} is not a unix seqpacket socket")
    return sock


def _connect(address: SeqpacketAddress, timeout: float | None) -> socket.socket:
    if address.fd is not None:
        return inherited_socket(address.fd)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(address.sockaddr())
    except BaseException:
        sock.close()
        raise
    return sock
