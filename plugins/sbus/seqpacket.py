"""AF_UNIX SOCK_SEQPACKET sockets in the Twisted reactor, which has no such transport.

A seqpacket socket keeps message boundaries: one ``recv`` is one packet, one ``send`` is
one packet. So the transport here speaks packets, not a byte stream:

- :class:`SeqpacketConnection` is a connected socket. Readable: it receives packets until
  ``EAGAIN`` (or until its protocol pauses it), in slices of at most 256 packets per
  reactor turn, so one busy publisher never keeps the reactor from writing to the
  subscribers or reading others, and hands them to the protocol: the whole slice, read
  lazily, to ``packets_received(packets)`` if it has one (the server's glue, which passes it
  to its :class:`~msgbroker.connection.Connection`), else each to ``packetReceived(data)``;
  end of stream is ``connectionLost``. It receives into the reactor's one shared buffer
  (:func:`receive_buffer`), so an idle connection holds no buffer of its own.
  ``write(packet)`` sends one packet through the connection's :class:`~.flood.Outbox`,
  which keeps what the socket does not take and sends it when the socket is writable: its
  own (a client's), or the one a server session chose as its output
  (:meth:`~SeqpacketConnection.write_through`).
- :class:`SeqpacketPort` listens: it accepts until ``EAGAIN``, reads each client's
  SO_PEERCRED credentials, can refuse clients by credentials (``sbusd -u``), and builds one
  protocol per client from a Twisted factory.
- :class:`SeqpacketServerEndpoint` makes a port out of an address as ``sbusd`` writes them
  (:func:`~.addresses.parse_address`, re-exported here with the rest of
  :mod:`.addresses`), so ``--listen sbus=unix:PATH`` goes through the same service
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
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from attrs import frozen
from twisted.internet import abstract, defer, error, main
from twisted.internet.address import UNIXAddress
from twisted.logger import Logger
from twisted.python.failure import Failure

from . import mmsg
from .addresses import (
    Credentials,
    SeqpacketAddress,
    bind,
    connect,
    new_socket,
    parse_address,
    peer_credentials,
)
from .flood import Outbox

__all__ = [
    "Credentials",
    "SeqpacketAddress",
    "SeqpacketConnection",
    "SeqpacketPort",
    "SeqpacketServerEndpoint",
    "bind",
    "connect",
    "new_socket",
    "parse_address",
    "parse_endpoint",
    "peer_credentials",
    "receive_buffer",
]

log = Logger(namespace="msgbroker.sbus")

#: how many clients one readable event of a listening socket accepts at most
_ACCEPTS_PER_EVENT = 64
#: the accept queue's length when neither the endpoint (``backlog=N``) nor the factory
#: (``listen_backlog``: the broker's ``--listen-backlog``) says (the kernel caps it at
#: net.core.somaxconn); a burst of clients connecting at once waits there, not in EAGAIN
DEFAULT_LISTEN_BACKLOG = 1024
#: how many packets one readable event of a connection reads at most; the socket stays
#: readable, so the reactor comes back to it after one turn of everything else
PACKETS_PER_EVENT = 256

#: each reactor's receive buffer, shared by all its connections (see receive_buffer)
_receive_buffers: weakref.WeakKeyDictionary[Any, memoryview] = weakref.WeakKeyDictionary()


def receive_buffer(reactor: Any, size: int) -> memoryview:
    """``size`` bytes of ``reactor``'s receive buffer, for one ``recv_into``.

    One buffer serves every connection of a reactor (it grows to the largest size asked):
    a reactor reads one socket at a time, and every reader copies a packet out
    (``tobytes()``) right after its ``recv_into`` and before anything else runs, so no
    packet is ever overwritten while in use. A buffer per connection cost 212,961 bytes
    of resident memory for each idle client. The view is valid until the next read on
    that reactor: never keep it.
    """
    view = _receive_buffers.get(reactor)
    if view is None or len(view) < size:
        view = _receive_buffers[reactor] = memoryview(bytearray(size))
    return view[:size]


# -- connections -------------------------------------------------------------------------


class SeqpacketConnection(abstract.FileDescriptor):
    """One connected seqpacket socket (server or client side). See the module docstring.

    ``max_packet``: the largest packet received; a larger one is passed on one byte longer
    than the bound (so the protocol sees it is too long) and never read in full.
    ``max_backlog`` bounds the connection's own outbox (see :mod:`.flood`).
    """

    def __init__(
        self,
        sock: socket.socket,
        protocol: Any,
        reactor: Any,
        credentials: Credentials | None = None,
        max_packet: int = 212_960,
        max_backlog: int = 16 << 20,
        address: str = "",
    ) -> None:
        super().__init__(reactor)
        self.socket = sock
        self.fileno = sock.fileno  # type: ignore[method-assign]
        self.protocol = protocol
        #: a protocol may take a whole slice at once (see the module docstring)
        self._packets_received = getattr(protocol, "packets_received", None)
        self.credentials = credentials
        self.address = address
        self.connected = 1
        self.paused = False
        #: one byte more than the largest packet, so a packet over it shows (it is cut)
        self.receive_size = max_packet + 1
        self.max_backlog = max_backlog
        #: what the current read ended with, for doRead to return (None: go on)
        self._read_end: Any = None
        self._outbox: Outbox | None = None

    @property
    def outbox(self) -> Outbox:
        """What this connection writes through: a server session's output, or its own
        (made when first asked for)."""
        if self._outbox is None:
            self._outbox = Outbox(
                self.socket.send, self.want_writable, self._outbox_error, self.max_backlog
            )
        return self._outbox

    def write_through(self, outbox: Outbox) -> None:
        """Write and drain through ``outbox`` (made on :attr:`send_packet` and
        :meth:`want_writable`): a server session's output, chosen when it opened."""
        self._outbox = outbox

    # -- reading -----------------------------------------------------------------------------

    def doRead(self) -> Any:
        self._read_end = None
        packets = self._receive()
        if self._packets_received is not None:
            self._packets_received(packets)
        else:
            received = self.protocol.packetReceived
            for packet in packets:
                received(packet)
        return self._read_end

    def _receive(self) -> Iterator[bytes]:
        """One slice of packets, read as they are asked for: it ends at ``EAGAIN``, at the
        end of the stream or an error (kept for :meth:`doRead` to return), or as soon as
        the connection is paused or closing. A slice at a time: a publisher that keeps its
        socket full must not keep the reactor from sending (the recipients' backlogs wait
        for it) or from reading others."""
        recv_into, view = self.socket.recv_into, self.receive_view()
        for _ in range(PACKETS_PER_EVENT):
            if self.paused or not self.connected or self.disconnecting:
                return
            try:
                size = recv_into(view)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as e:
                self._read_end = main.CONNECTION_LOST if e.errno != errno.ECONNRESET else e
                return
            if not size:
                self._read_end = main.CONNECTION_DONE
                return
            yield view[:size].tobytes()  # copied out before the next read reuses it

    def receive_view(self) -> memoryview:
        """The buffer to receive into, shared with the reactor's other connections: copy
        each packet out before the next ``recv_into`` (see :func:`receive_buffer`)."""
        return receive_buffer(self.reactor, self.receive_size)

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

    @property
    def send_packet(self) -> Callable[[bytes], int]:
        """Sends one packet now: the socket's ``send`` (``BlockingIOError`` when full)."""
        return self.socket.send

    @property
    def send_packets(self) -> Callable[[list[bytes]], int] | None:
        """Sends several packets in one system call (``sendmmsg``): how many went; None
        where there is no ``sendmmsg`` (see :mod:`.mmsg`)."""
        send = mmsg.sender()
        return None if send is None else partial(send, self.socket.fileno())

    def want_writable(self, want: bool) -> None:
        """Whether to be told (the outbox drained) when the socket is writable."""
        if self.connected:
            if want:
                self.startWriting()
            else:
                self.stopWriting()

    def doWrite(self) -> Any:
        outbox = self._outbox
        if outbox is not None:
            outbox.drain()
            if outbox.backlog:
                return None
        return main.CONNECTION_DONE if self.disconnecting else None

    def _outbox_error(self, reason: Any, detail: str) -> None:
        closer = getattr(self.protocol, "flood_error", None)
        if closer is not None:
            closer(detail)
        else:
            self.abortConnection()

    # -- ending ------------------------------------------------------------------------------

    def loseConnection(self, _connDone: Any = main.CONNECTION_DONE) -> None:
        """Close once what waits in the outbox is sent."""
        if not self.connected or self.disconnecting:
            return
        if self._outbox is not None:
            self._outbox.flush()  # what it gathered joins its backlog, if it must wait
        self.disconnecting = True
        self.stopReading()
        if self._outbox is not None and self._outbox.backlog:
            self.startWriting()
        else:
            self.reactor.callLater(0, self._close_now, _connDone)

    def abortConnection(self) -> None:
        """Close now, dropping what waits."""
        if not self.connected:
            return
        if self._outbox is not None:
            self._outbox.close()
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
        if self._outbox is not None:
            self._outbox.close()
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
        # sbus output goes through an outbox, which never asks a producer to pause
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
        owns_path: bool = True,
    ) -> None:
        super().__init__(reactor)
        self.socket = sock
        self.fileno = sock.fileno  # type: ignore[method-assign]
        self.factory = factory
        self.address = address
        self.allow = allow
        self.max_packet = max_packet
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
            conn, protocol, self.reactor, credentials, self.max_packet, address=str(self.address)
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
    """A server endpoint for a seqpacket address; ``listen`` binds synchronously. The
    accept queue is ``backlog`` long, or the factory's ``listen_backlog`` (an sbus factory
    gives the broker's ``--listen-backlog``), or :data:`DEFAULT_LISTEN_BACKLOG`."""

    reactor: Any
    address: SeqpacketAddress
    mode: int = 0o700
    replace: bool = False
    allow: Callable[[Credentials], bool] | None = None
    max_packet: int = 212_960
    backlog: int | None = None

    def listen(self, factory: Any) -> defer.Deferred[SeqpacketPort]:
        backlog = self.backlog
        if backlog is None:
            backlog = getattr(factory, "listen_backlog", DEFAULT_LISTEN_BACKLOG)
        try:
            sock = bind(self.address, self.mode, self.replace, backlog)
        except OSError as e:
            return defer.fail(error.CannotListenError(str(self.address), 0, e))
        port = SeqpacketPort(
            sock,
            factory,
            self.reactor,
            self.address,
            self.allow,
            self.max_packet,
            owns_path=self.address.fd is None,
        )
        port.startListening()
        return defer.succeed(port)


def parse_endpoint(reactor: Any, text: str, **overrides: Any) -> SeqpacketServerEndpoint:
    """``unix:ADDRESS[:mode=0700][:max-packet=N][:backlog=N]`` (or just ``ADDRESS``) as a
    server endpoint; ADDRESS as :func:`parse_address` reads it. Twisted's ``address=``
    keyword form is accepted too (its ``lockfile=`` is ignored)."""
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
    if "backlog" in options:
        settings["backlog"] = int(options["backlog"])
        if settings["backlog"] < 1:
            raise ValueError("backlog must be at least 1")
    settings.update(overrides)
    return SeqpacketServerEndpoint(reactor, **settings)
