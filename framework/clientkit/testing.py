"""What client tests run against, once for every protocol: :class:`ReactorThread` (a private
reactor in a daemon thread, so tests use real sockets without the global reactor),
:class:`FakeServer` (a server that misbehaves on purpose, on a loopback TCP port — with TLS
or WebSocket — or a unix seqpacket socket) and :class:`Inbox` (an event handler to wait on).

A protocol's fake subclasses :class:`FakeServer` with its behaviour — :meth:`~FakeServer.
connected`, :meth:`~FakeServer.received`, :meth:`~FakeServer.lost`, run in the reactor
thread — and :meth:`~FakeServer.record`\\ s what the test should see; the test waits for it
with :meth:`~FakeServer.wait`, never a sleep::

    class EchoServer(FakeServer):
        def received(self, conn, data):
            self.record(conn, data)
            conn.write(data)

    with EchoServer(ReactorThread()) as server:
        client = BlockingLineClient(server.host, server.port)
        server.wait(lambda: server.logged(bytes))
"""

from __future__ import annotations

import os
import queue
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import defer
from twisted.internet.interfaces import IReadDescriptor
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from .twisted_ws import ReactorTimer

__all__ = [
    "WAIT",
    "FakeConnection",
    "FakeServer",
    "Inbox",
    "MemoryWire",
    "ReactorThread",
    "result",
]

#: how long a test waits for anything a server or a client should do promptly
WAIT = 10.0


class ReactorThread:
    """A private reactor running in a daemon thread."""

    def __init__(self) -> None:
        from twisted.internet.selectreactor import SelectReactor

        # a SelectReactor instance that is never installed as the global reactor
        self.reactor: Any = SelectReactor()
        self._thread = threading.Thread(
            target=self.reactor.run,
            kwargs={"installSignalHandlers": False},
            name="e2e-reactor",
            daemon=True,
        )
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = WAIT, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in the reactor thread; return its (Deferred's) result or
        raise its exception. Raises ``TimeoutError`` if it takes longer than ``timeout``."""
        results: queue.Queue[Any] = queue.Queue()

        def run() -> None:
            defer.maybeDeferred(fn, *args, **kwargs).addBoth(results.put)

        self.reactor.callFromThread(run)
        try:
            result = results.get(timeout=timeout)
        except queue.Empty:
            name = getattr(fn, "__name__", fn)
            raise TimeoutError(f"{name} took more than {timeout} s") from None
        if isinstance(result, Failure):
            result.raiseException()
        return result


class Inbox:
    """A callable that collects what it is called with; :meth:`get` is a Deferred of the
    next item (use it in the reactor thread, e.g. as ``on_message=inbox``)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waiters: list[defer.Deferred[Any]] = []
        self._next = 0

    def __call__(self, item: Any) -> None:
        self.items.append(item)
        if self._waiters:
            self._next += 1
            self._waiters.pop(0).callback(item)

    def get(self) -> defer.Deferred[Any]:
        if self._next < len(self.items):
            item = self.items[self._next]
            self._next += 1
            return defer.succeed(item)
        d: defer.Deferred[Any] = defer.Deferred()
        self._waiters.append(d)
        return d


class MemoryWire:
    """A Twisted client (``proto``, built on ``clock``) connected to a StringTransport, no
    sockets: the test plays the server, reading what the client wrote with :meth:`sent`
    (``decode``: the protocol's decoder, fed the bytes) and answering with :meth:`feed`
    (``encode``: one item to bytes), and drives the client's timers with :attr:`clock`."""

    def __init__(
        self,
        proto: Any,
        clock: Any,
        decode: Callable[[bytes], Iterable[Any]] = lambda data: [data],
        encode: Callable[[Any], bytes] = bytes,
    ) -> None:
        from twisted.internet.testing import StringTransport

        self.proto = proto
        self.clock = clock
        self.transport = StringTransport()
        self._decode = decode
        self._encode = encode
        proto.makeConnection(self.transport)

    def sent(self) -> list[Any]:
        """What the client wrote since the last call, decoded."""
        data = self.transport.value()
        self.transport.clear()
        return list(self._decode(data))

    def feed(self, *items: Any) -> None:
        self.proto.dataReceived(b"".join(self._encode(item) for item in items))

    def lose(self) -> None:
        from twisted.internet.error import ConnectionDone

        self.proto.connectionLost(Failure(ConnectionDone("gone")))

    @property
    def closed(self) -> bool:
        """Whether the client closed (or aborted) the connection."""
        return bool(self.transport.disconnecting)


def result(d: defer.Deferred[Any]) -> Any:
    """The result of a Deferred that has fired (raising its failure)."""
    box: list[Any] = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    if isinstance(box[0], Failure):
        box[0].raiseException()
    return box[0]


class FakeConnection:
    """One client connection of a :class:`FakeServer` (lives in the reactor thread).
    :meth:`write` sends one unit — bytes on TCP, a packet on seqpacket, ``(is_binary,
    payload)`` on a WebSocket; :meth:`drop` closes as a server does (a WebSocket with the
    close handshake), :meth:`abort` at once. Subclasses keep a protocol's state."""

    def __init__(self, server: FakeServer, transport: Any) -> None:
        self.server = server
        self.index = len(server.connections)
        self.transport = transport
        self.closed = False

    def write(self, unit: Any) -> None:
        if not self.closed:
            self.transport.send_unit(unit)

    def drop(self) -> None:
        if not self.closed:
            self.transport.drop(abort=False)

    def abort(self) -> None:
        if not self.closed:
            self.transport.drop(abort=True)


class FakeServer:
    """A server for client tests on ``127.0.0.1`` (TCP; ``tls``: a server context factory
    such as :func:`msgbroker.tls.server_context_factory`'s; ``ws``: WebSocket) or, with
    ``seqpacket``, on a unix seqpacket socket at :attr:`path`; its reactor is ``thread``'s
    (a :class:`ReactorThread`). Use it as a context manager (or :meth:`start`/:meth:`stop`).

    :attr:`log` is what happened, ``(connection index, item)`` in order — the behaviour
    :meth:`record`\\ s items, and the end of a connection is ``None`` (:meth:`ended`).
    Subclasses override :meth:`connected`, :meth:`received` and :meth:`lost` and may set
    :attr:`connection_class`."""

    connection_class: type[FakeConnection] = FakeConnection

    def __init__(
        self, thread: Any, *, tls: Any = None, ws: bool = False, seqpacket: bool = False
    ) -> None:
        self.thread = thread
        self.tls = tls
        self.ws = ws
        self.seqpacket = seqpacket
        self.connections: list[Any] = []
        self.log: list[tuple[int, Any]] = []
        self.host = "127.0.0.1"
        self.port = 0
        self.path = ""
        self._changed = threading.Condition()
        self._port: Any = None

    # -- the behaviour (reactor thread; override) ----------------------------------------------

    def connected(self, conn: Any) -> None:
        """A client connected (for a WebSocket: the handshake is done)."""

    def received(self, conn: Any, unit: Any) -> None:
        """``conn`` sent ``unit`` (bytes, a packet, or ``(is_binary, payload)``)."""

    def lost(self, conn: Any) -> None:
        """``conn`` is gone (already in the log as ``None``)."""

    # -- for tests -------------------------------------------------------------------------------

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._port = self.thread.call(self._listen)
        if self.seqpacket:
            self.path = self._port.path
        else:
            self.port = self._port.getHost().port

    def stop(self) -> None:
        def stop() -> Any:
            for conn in self.connections:
                if not conn.closed:
                    conn.drop()
            return self.stop_listening()

        self.thread.call(stop)

    def stop_listening(self) -> Any:
        """Accept no more clients (in the reactor thread)."""
        port, self._port = self._port, None
        return None if port is None else port.stopListening()

    def record(self, conn: Any, item: Any) -> None:
        with self._changed:
            self.log.append((conn.index, item))
            self._changed.notify_all()

    def wait(self, predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
        """Wait (in the test's thread) until ``predicate()`` is true; its value."""
        with self._changed:
            result = self._changed.wait_for(predicate, timeout)
        assert result, "the fake server did not see what was expected in time"
        return result

    def logged(self, kind: type | None = None, conn: int | None = None) -> list[Any]:
        """The items recorded (of exactly type ``kind``; of connection ``conn``), in order."""
        return [
            item
            for i, item in list(self.log)
            if item is not None and (kind is None or type(item) is kind) and conn in (None, i)
        ]

    def ended(self, conn: int = 0) -> bool:
        return (conn, None) in self.log

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the reactor thread."""
        return self.thread.call(fn, *args)

    # -- plumbing (reactor thread) -----------------------------------------------------------------

    def _listen(self) -> Any:
        reactor = self.thread.reactor
        if self.seqpacket:
            return _PacketPort(self, reactor)
        factory: Any
        if self.ws:
            factory = WebSocketServerFactory(reactor=reactor)
            factory._batched_timer = ReactorTimer(reactor)
            factory.protocol = _WebSocket
        else:
            factory = Factory.forProtocol(_Stream)
        factory.server = self
        if self.tls is not None:  # TLS flushes on our reactor, not the global one
            from twisted.protocols.tls import TLSMemoryBIOFactory

            factory = TLSMemoryBIOFactory(self.tls, False, factory, clock=reactor)
        return reactor.listenTCP(0, factory, interface=self.host)

    def _opened(self, transport: Any) -> Any:
        conn = self.connection_class(self, transport)
        self.connections.append(conn)
        self.connected(conn)
        return conn

    def _closed(self, conn: Any) -> None:
        conn.closed = True
        self.record(conn, None)
        self.lost(conn)


class _Stream(Protocol):
    transport: Any

    def connectionMade(self) -> None:
        self.conn = self.factory.server._opened(self)

    def dataReceived(self, data: bytes) -> None:
        self.conn.server.received(self.conn, data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.conn.server._closed(self.conn)

    def send_unit(self, unit: bytes) -> None:
        self.transport.write(unit)

    def drop(self, abort: bool) -> None:
        if abort:
            self.transport.abortConnection()
        else:
            self.transport.loseConnection()


class _WebSocket(WebSocketServerProtocol):
    conn: Any = None

    def onOpen(self) -> None:
        self.conn = self.factory.server._opened(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.conn.server.received(self.conn, (isBinary, payload))

    def connectionLost(self, reason: Any = None) -> None:
        super().connectionLost(reason)
        if self.conn is not None:
            self.conn.server._closed(self.conn)

    def send_unit(self, unit: tuple[bool, bytes]) -> None:
        binary, payload = unit
        self.sendMessage(payload, isBinary=binary)

    def drop(self, abort: bool) -> None:
        if abort:
            self.dropConnection(abort=True)
        else:
            self.sendClose(1000)


@implementer(IReadDescriptor)
class _Reader:
    """A socket the reactor reads (it has no seqpacket transport)."""

    sock: socket.socket

    def fileno(self) -> int:
        return self.sock.fileno()

    def logPrefix(self) -> str:
        return "FakeServer"


class _PacketPort(_Reader):
    """A listening unix seqpacket socket in a temporary directory: each client becomes a
    :class:`_Packets`."""

    def __init__(self, server: FakeServer, reactor: Any) -> None:
        self.server = server
        self.reactor = reactor
        self.directory = tempfile.mkdtemp(prefix="fake", dir="/tmp")  # short: sun_path
        self.path = os.path.join(self.directory, "socket")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
        self.sock.bind(self.path)
        self.sock.listen(16)
        reactor.addReader(self)

    def doRead(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except BlockingIOError:
                return
            _Packets(self.server, self.reactor, sock)

    def connectionLost(self, reason: Failure) -> None:
        self.stopListening()

    def stopListening(self) -> None:
        if self.sock.fileno() != -1:
            self.reactor.removeReader(self)
            self.sock.close()
            os.unlink(self.path)
            os.rmdir(self.directory)


class _Packets(_Reader):
    """One client of a :class:`_PacketPort`: a packet a read, a packet a write (test
    packets are small, so a blocking send is fine)."""

    def __init__(self, server: FakeServer, reactor: Any, sock: socket.socket) -> None:
        self.reactor = reactor
        self.sock = sock
        sock.setblocking(False)
        self.conn = server._opened(self)
        reactor.addReader(self)

    def doRead(self) -> None:
        while not self.conn.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.drop(abort=True)
                return
            self.conn.server.received(self.conn, data)

    def connectionLost(self, reason: Failure) -> None:
        self.drop(abort=True)

    def send_unit(self, unit: bytes) -> None:
        self.sock.setblocking(True)
        try:
            self.sock.send(unit)
        finally:
            self.sock.setblocking(False)

    def drop(self, abort: bool) -> None:
        if not self.conn.closed:
            self.reactor.removeReader(self)
            self.sock.close()
            self.conn.server._closed(self.conn)
