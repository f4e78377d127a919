"""The sockets a blocking client opens (:func:`open_tcp`, :func:`open_unix`,
:func:`adopt_socket`) and the channels that carry a session's units on them
(:class:`StreamChannel`, :class:`PacketChannel`; the WebSocket one is in
:mod:`msgbroker.clientkit.websocket`). :mod:`msgbroker.clientkit.blocking` exports them
too, with :class:`~msgbroker.clientkit.blocking.BlockingClient`, which drives a session on
one.
"""

from __future__ import annotations

import errno
import socket
import ssl
from typing import Any

__all__ = ["PacketChannel", "StreamChannel", "adopt_socket", "open_tcp", "open_unix"]


def open_tcp(
    host: str,
    port: int,
    *,
    timeout: float | None,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> socket.socket:
    """A connected TCP socket, wrapped in TLS with ``ssl_context`` (the server verified as
    ``server_hostname``, default ``host``). ``OSError`` (``ssl.SSLError``) when it fails."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
    except BaseException:
        sock.close()
        raise
    return sock


def open_unix(
    address: str | bytes, *, kind: int = socket.SOCK_STREAM, timeout: float | None
) -> socket.socket:
    """A unix socket of ``kind`` (``SOCK_STREAM``, ``SOCK_SEQPACKET``) connected to
    ``address`` (a path, or ``b"\\0name"`` for the abstract namespace)."""
    sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def adopt_socket(fd: int, *, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A copy of the connected unix socket ``fd`` (a parent process connected it: ``/dev/fd/N``);
    ``OSError`` (EPROTOTYPE) when it is not a unix socket of ``kind``."""
    sock = socket.socket(fileno=socket.dup(fd))
    if sock.family != socket.AF_UNIX or sock.type != kind:
        sock.close()
        what = "seqpacket" if kind == socket.SOCK_SEQPACKET else "stream"
        raise OSError(errno.EPROTOTYPE, f"/dev/fd/{fd} is not a unix {what} socket")
    return sock


class StreamChannel:
    """A connected stream socket (TCP, TLS, unix) carrying bytes."""

    #: the most read at once
    recv_size = 65536

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: set once the peer closed in the protocol's own way (a WebSocket close frame)
        self.peer_closed = False

    def send(self, units: list[Any]) -> None:
        self.sock.sendall(b"".join(units))

    def received(self, data: bytes) -> list[Any]:
        """The units in ``data`` (what the socket gave)."""
        return [data]

    def leftover(self) -> bytes:
        """What the channel read while opening that belongs to the session."""
        return b""

    def goodbye(self) -> bool:
        """Start the transport's closing handshake, if it has one; True when the peer's
        answer is worth waiting for."""
        return False


class PacketChannel(StreamChannel):
    """A connected packet socket (unix ``SOCK_SEQPACKET``): one unit a packet, up to
    ``max_packet`` bytes (a longer one reads as ``max_packet + 1``, for the session to
    refuse)."""

    def __init__(self, sock: socket.socket, max_packet: int) -> None:
        super().__init__(sock)
        self.recv_size = max_packet + 1

    def send(self, units: list[Any]) -> None:
        for packet in units:
            self.sock.sendall(packet)  # one packet: whole or not at all
