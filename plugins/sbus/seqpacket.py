"""AF_UNIX SOCK_SEQPACKET sockets in the Twisted reactor, which has no such transport.

A seqpacket socket keeps message boundaries: one ``recv`` is one packet, one ``send`` is
one packet. So the transport here speaks packets, not a byte stream:

- :class:`SeqpacketConnection` is a connected socket. Readable: it receives packets until
  ``EAGAIN`` (or until its protocol pauses it) and hands each to the protocol's
  ``packetReceived(data)``; end of stream is ``connectionLost``. ``write(packet)`` sends one
  packet through the connection's :class:`~.flood.Outbox`, which keeps what the socket does
  not take and sends it when the socket is writable.
- :class:`SeqpacketPort` listens: it accepts until ``EAGAIN``, reads each client's
  SO_PEERCRED credentials, can refuse clients by credentials (``sbusd -u``), and builds one
  protocol per client from a Twisted factory.
- :class:`SeqpacketServerEndpoint` makes a port out of an address as ``sbusd`` writes them
  (:func:`parse_address`), so ``--listen sbus=unix:PATH`` goes through the same service
  code as every other listener.

A packet that a peer sent before closing is received before the end of stream, so it is
never lost. An empty packet reads the same as the end of stream (``recv`` returns no
bytes either way); sbus treats both as the end of that client.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.internet import abstract, defer, error, main
from twisted.internet.address import UNIXAddress
from twisted.logger import Logger
from twisted.python.failure import Failure

from .flood import Outbox

log = Logger(namespace="msgbroker.sbus")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: how many clients one readable event of a listening socket accepts at most
_ACCEPTS_PER_EVENT = 64


@frozen
class Credentials:
    """A peer's SO_PEERCRED, as the kernel saw it when the socket was connected."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> Credentials:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return Credentials(pid, uid, gid)


# -- addresses -----------------------------------------------------------------------------


@frozen
class SeqpacketAddress:
    """Where an sbus bus is: a filesystem ``path``, an ``abstract`` name (bytes, without the
    leading NUL), or an inherited, already bound socket ``fd`` (``/dev/fd/N``)."""

    path: str | None = None
    abstract: bytes | None = None
    fd: int | None = None

    def sockaddr(self) -> str | bytes:
        if self.abstract is not None:
            return b"\0" + self.abstract
        if self.path is None:
            raise ValueError("an inherited socket has no address to bind or connect to")
        return self.path

    def __str__(self) -> str:
        if self.abstract is not None:
            return "/dev/unix/abstract/" + self.abstract.hex()
        if self.fd is not None:
            return f"/dev/fd/{self.fd}"
        return self.path or ""


def parse_address(text: str) -> SeqpacketAddress:
    """An address as ``sbusd -a`` takes it: a path; ``/dev/fd/N`` (an inherited socket);
    ``/dev/unix/abstract`` (a random abstract name); ``/dev/unix/abstract/<hex>`` (that
    abstract name); or ``@name`` (an abstract name in text, as Twisted writes them)."""
    if text.startswith("/dev/fd/"):
        number = text[len("/dev/fd/") :]
        if not number.isdigit():
            raise ValueError(f"bad file descriptor address {text!r}")
        return SeqpacketAddress(fd=int(number))
    if text == "/dev/unix/abstract":
        return SeqpacketAddress(abstract=os.urandom(8).hex().encode())
    if text.startswith("/dev/unix/abstract/"):
        try:
            return SeqpacketAddress(abstract=bytes.fromhex(text[len("/dev/unix/abstract/") :]))
        except ValueError:
            raise ValueError(f"bad abstract address {text!r}: not hexadecimal") from None
    if text.startswith("@"):
        return SeqpacketAddress(abstract=text[1:].encode())
    if not text:
        raise ValueError("empty socket address")
    return SeqpacketAddress(path=text)


def new_socket() -> socket.socket:
    return socket.socket(
        socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    )


def bind(
    address: SeqpacketAddress, mode: int = 0o700, replace: bool = False, backlog: int = 128
) -> socket.socket:
    """A listening socket at ``address``. A socket file gets ``mode`` before ``listen``, so
    no client can connect while it is still more open than asked. An existing socket file
    is replaced when ``replace`` is set, or when it is stale (nobody accepts on it: a
    broker that was killed); a live one is ``EADDRINUSE``."""
    if address.fd is not None:
        sock = socket.socket(fileno=os.dup(address.fd))
        if sock.type != socket.SOCK_SEQPACKET or sock.family != socket.AF_UNIX:
            sock.close()
            raise OSError(errno.EINVAL, f"/dev/fd/{address.fd} is not a unix seqpacket socket")
        sock.setblocking(False)
        sock.listen(backlog)  # harmless if it listens already
        return sock
    sock = new_socket()
    try:
        if (
            address.path is not None
            and os.path.exists(address.path)
            and (replace or _stale(address.path))
        ):
            os.unlink(address.path)
        sock.bind(address.sockaddr())
        if address.path is not None:
            os.chmod(address.path, mode)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _stale(path: str) -> bool:
    import stat

    if not stat.S_ISSOCK(os.stat(path).st_mode):
        return False  # never remove what is not a socket
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


# -- connections -------------------------------------------------------------------------


class SeqpacketConnection(abstract.FileDescriptor):
    """One connected seqpacket socket (server or client side). See the module docstring.

    ``max_packet``: the largest packet received; a larger one is passed on one byte longer
    than the bound (so the protocol sees it is too long) and never read in full.
    ``max_backlog`` bounds the outbox (see :mod:`.flood`).
    """

    def __init__(
        self,
        sock: socket.socket,
        protocol: Any,
        reactor: Any,
        credentials: Credentials | None = None,
        max_packet: int = 212_960,
        max_backlog: int = 16 << 20,
        source: Callable[[], Any] = lambda: None,
        address: str = "",
    ) -> None:
        super().__init__(reactor)
        self.socket = sock
        self.fileno = sock.fileno  # type: ignore[method-assign]
        self.protocol = protocol
        self.credentials = credentials
        self.address = address
        self.connected = 1
        self.paused = False
        self._buffer = bytearray(max_packet + 1)
        self._view = memoryview(self._buffer)
        self.outbox = Outbox(
            sock.send, self._want_writable, self._outbox_error, max_backlog, source
        )

    # -- reading -----------------------------------------------------------------------------

    def doRead(self) -> Any:
        recv_into, view = self.socket.recv_into, self._view
        received = self.protocol.packetReceived
        while not self.paused and self.connected and not self.disconnecting:
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
            received(view[:size].tobytes())
        return None

    def pauseProducing(self) -> None:
        """Stop reading (also in the middle of a burst: the rest waits in the kernel)."""
        self.paused = True
        self.stopReading()

    def resumeProducing(self) -> None:
        if self.paused and self.connected and not self.disconnecting:
            self.paused = False
            self.startReading()
            # packets may already wait: read them now rather than on the next poll
            self.reactor.callLater(0, self._resume_read)

    def _resume_read(self) -> None:
        if self.connected and not self.paused and not self.disconnecting:
            why = self.doRead()
            if why is not None:
                self.connectionLost(Failure(why))

    def stopProducing(self) -> None:
        self.loseConnection()

    # -- writing -----------------------------------------------------------------------------

    def write(self, packet: bytes) -> None:
        """Send one packet (through the outbox and its flood-control policy)."""
        self.outbox.offer(packet)

    def writeSequence(self, packets: Any) -> None:
        for packet in packets:
            self.outbox.offer(packet)

    def _want_writable(self, want: bool) -> None:
        if self.connected:
            if want:
                self.startWriting()
            else:
                self.stopWriting()

    def doWrite(self) -> Any:
        self.outbox.drain()
        if self.disconnecting and not self.outbox.backlog:
            return main.CONNECTION_DONE
        return None

    def _outbox_error(self, reason: str) -> None:
        closer = getattr(self.protocol, "flood_error", None)
        if closer is not None:
            closer(reason)
        else:
            self.abortConnection()

    # -- ending ------------------------------------------------------------------------------

    def loseConnection(self, _connDone: Any = main.CONNECTION_DONE) -> None:
        """Close once what waits in the outbox is sent."""
        if not self.connected or self.disconnecting:
            return
        self.disconnecting = True
        self.stopReading()
        if self.outbox.backlog:
            self.startWriting()
        else:
            self.reactor.callLater(0, self._close_now, _connDone)

    def abortConnection(self) -> None:
        """Close now, dropping what waits."""
        if not self.connected:
            return
        self.outbox.close()
        self.disconnecting = True
        self.stopReading()
        self.stopWriting()
        self.reactor.callLater(0, self._close_now, main.CONNECTION_LOST)

    def _close_now(self, why: Any) -> None:
        if self.connected:
            self.connectionLost(Failure(why))

    def connectionLost(self, reason: Failure) -> None:
        if self.disconnected:
            return
        super().connectionLost(reason)
        self.outbox.close()
        with contextlib.suppress(OSError):
            self.socket.close()
        protocol, self.protocol = self.protocol, None
        if protocol is not None:
            protocol.connectionLost(reason)

    # -- ITransport odds and ends ------------------------------------------------------------

    def getPeer(self) -> UNIXAddress:
        return UNIXAddress(None)

    def getHost(self) -> UNIXAddress:
        return UNIXAddress(self.address or None)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        # sbus output goes through the outbox, which never asks a producer to pause
        pass

    def unregisterProducer(self) -> None:
        pass

    def logPrefix(self) -> str:
        return "SeqpacketConnection"


# -- listening -----------------------------------------------------------------------------


class SeqpacketPort(abstract.FileDescriptor):
    """A listening seqpacket socket (an ``IListeningPort``). ``allow(credentials)`` decides
    whether a client may stay (``sbusd -u``); refused clients are closed at once. The socket
    file is removed when the port stops, if this port created it."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Any,
        reactor: Any,
        address: SeqpacketAddress,
        allow: Callable[[Credentials], bool] | None = None,
        max_packet: int = 212_960,
        max_backlog: int = 16 << 20,
        owns_path: bool = True,
    ) -> None:
        super().__init__(reactor)
        self.socket = sock
        self.fileno = sock.fileno  # type: ignore[method-assign]
        self.factory = factory
        self.address = address
        self.allow = allow
        self.max_packet = max_packet
        self.max_backlog = max_backlog
        self.owns_path = owns_path and address.path is not None
        self.connected = 1
        self._stopped: defer.Deferred[None] | None = None

    def startListening(self) -> None:
        self.factory.doStart()
        self.startReading()

    def doRead(self) -> None:
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                conn, _ = self.socket.accept()
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warn("sbus: cannot accept a client: {error}", error=e.strerror)
                    return
                raise
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        credentials = peer_credentials(conn)
        if self.allow is not None and not self.allow(credentials):
            log.info("sbus: refused a client of uid {uid}", uid=credentials.uid)
            conn.close()
            return
        protocol = self.factory.buildProtocol(UNIXAddress(None))
        if protocol is None:
            conn.close()
            return
        transport = SeqpacketConnection(
            conn,
            protocol,
            self.reactor,
            credentials,
            self.max_packet,
            self.max_backlog,
            source=getattr(self.factory, "source", lambda: None),
            address=str(self.address),
        )
        protocol.makeConnection(transport)
        if transport.connected and not transport.disconnecting and not transport.paused:
            transport.startReading()

    def stopListening(self) -> defer.Deferred[None]:
        if self._stopped is None:
            self._stopped = defer.Deferred()
            self.reactor.callLater(0, self.connectionLost, Failure(error.ConnectionDone()))
        return self._stopped

    loseConnection = stopListening

    def connectionLost(self, reason: Failure) -> None:
        if self.disconnected:
            return
        super().connectionLost(reason)
        if self.owns_path and self.address.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)
        self.socket.close()
        self.factory.doStop()
        stopped = self._stopped
        if stopped is not None:
            stopped.callback(None)

    def getHost(self) -> UNIXAddress:
        return UNIXAddress(str(self.address))

    def logPrefix(self) -> str:
        return "SeqpacketPort"


@frozen
class SeqpacketServerEndpoint:
    """A server endpoint for a seqpacket address; ``listen`` binds synchronously."""

    reactor: Any
    address: SeqpacketAddress
    mode: int = 0o700
    replace: bool = False
    allow: Callable[[Credentials], bool] | None = None
    max_packet: int = 212_960
    max_backlog: int = 16 << 20

    def listen(self, factory: Any) -> defer.Deferred[SeqpacketPort]:
        try:
            sock = bind(self.address, self.mode, self.replace)
        except OSError as e:
            return defer.fail(error.CannotListenError(str(self.address), 0, e))
        port = SeqpacketPort(
            sock,
            factory,
            self.reactor,
            self.address,
            self.allow,
            self.max_packet,
            self.max_backlog,
            owns_path=self.address.fd is None,
        )
        port.startListening()
        return defer.succeed(port)


def parse_endpoint(reactor: Any, text: str, **overrides: Any) -> SeqpacketServerEndpoint:
    """``unix:ADDRESS[:mode=0700][:max-packet=N]`` (or just ``ADDRESS``) as a server
    endpoint; ADDRESS as :func:`parse_address` reads it. Twisted's ``address=`` keyword
    form is accepted too."""
    body = text[len("unix:") :] if text.startswith("unix:") else text
    parts = body.split(":")
    options: dict[str, str] = {}
    positional: list[str] = []
    for part in parts:
        name, eq, value = part.partition("=")
        if eq and name in ("address", "mode", "max-packet", "lockfile", "backlog"):
            options[name] = value
        else:
            positional.append(part)
    address_text = options.get("address") or ":".join(positional)
    settings: dict[str, Any] = {"address": parse_address(address_text)}
    if "mode" in options:
        settings["mode"] = int(options["mode"], 8)
    if "max-packet" in options:
        settings["max_packet"] = int(options["max-packet"])
        if settings["max_packet"] < 1:
            raise ValueError("max-packet must be at least 1 byte")
    settings.update(overrides)
    return SeqpacketServerEndpoint(reactor, **settings)


def connect(address: SeqpacketAddress | str, timeout: float | None = None) -> socket.socket:
    """A blocking client socket connected to ``address`` (for clients and tools)."""
    if isinstance(address, str):
        address = parse_address(address)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        if address.fd is not None:
            sock.close()
            sock = socket.socket(fileno=os.dup(address.fd))
        else:
            sock.connect(address.sockaddr())
    except BaseException:
        sock.close()
        raise
    return sock
