"""The blocking half of every client: sockets (:func:`open_tcp`, :func:`open_unix`,
:func:`adopt_socket`), the channels that carry a session's units on them
(:class:`StreamChannel`, :class:`PacketChannel`, and the WebSocket one in
:mod:`msgbroker.clientkit.websocket`), and :class:`BlockingClient`, which runs a sans-IO
:class:`~msgbroker.clientkit.session.ClientSession` on a channel with no reactor: one loop
that sends, reads with a deadline, runs the session's timers while it reads, and closes.

A protocol's blocking client subclasses :class:`BlockingClient` with the protocol's API:
each request asks the session for a token and waits for its answer
(:meth:`BlockingClient._wait`); deliveries are queued by :meth:`BlockingClient._event` for
the ``next_...`` methods (:meth:`BlockingClient._next`). Timers (keepalives, request
timeouts) run only while the client reads; :meth:`BlockingClient.poll` reads without
waiting, for a program that is busy elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

from msgbroker.errors import RemoteProtocolError

from .session import Answered, ClientSession, ConnectionClosed, Ended, Failed

T = TypeVar("T")

__all__ = [
    "BlockingClient",
    "PacketChannel",
    "StreamChannel",
    "adopt_socket",
    "open_tcp",
    "open_unix",
]


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


class BlockingClient:
    """Runs :attr:`session` on ``channel`` (see the module docstring). Not thread-safe.

    ``timeout`` bounds each send (the peer must take what is written: ``TimeoutError``
    otherwise); ``clock`` is where the time comes from (``time.monotonic``; tests pass a
    fake). Errors name the other side :attr:`peer` ("the broker closed the connection").
    When the session ends the socket is closed and its error raised — a protocol error as
    the protocol's :class:`~msgbroker.clientkit.session.ConnectionClosed`; later calls
    raise :meth:`ClientSession.closed`.
    """

    #: how errors name the other side
    peer: ClassVar[str] = "server"

    def __init__(
        self,
        session: ClientSession,
        channel: StreamChannel,
        *,
        timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.timeout = timeout
        self.closed = False
        self._channel = channel
        self._now = clock
        self._answers: dict[int, Answered | Failed] = {}
        try:
            self._handle(session.start(self._now()))
            self._flush()
            early = channel.leftover()
            if early:
                self._feed(early)
        except BaseException:
            self._shut()
            raise

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def socket(self) -> socket.socket:
        """The connected socket (an ``ssl.SSLSocket`` with TLS)."""
        return self._channel.sock

    def close(self) -> None:
        """Say goodbye as the protocol does (:meth:`_goodbye`), close the socket. Never
        raises; does nothing when already closed."""
        if self.closed:
            return
        try:
            self._goodbye()
        except (OSError, RemoteProtocolError):
            pass
        finally:
            self._shut()

    def poll(self) -> None:
        """Handle whatever already arrived and run the timers that are due, without
        waiting. Raises the protocol's ``ConnectionClosed`` if the connection ended."""
        while self._receive(self._now(), poll=True):
            pass

    # -- for protocol subclasses ---------------------------------------------------------------

    def _event(self, event: Any) -> None:
        """An event of the protocol's own (a delivery): queue it."""

    def _goodbye(self) -> None:
        """Before the socket closes: the transport's closing handshake, by default (a
        WebSocket close, awaited up to 2 s)."""
        if self._channel.goodbye():
            deadline = self._now() + min(self.timeout or 2.0, 2.0)
            while not self._channel.peer_closed and self._receive(deadline):
                pass

    def _wait(self, token: int, timeout: float | None = None, what: str = "reply") -> Any:
        """Send what the session wrote and read until the request ``token`` is answered;
        its value, or its error raised. ``timeout``: give up after that long — the
        connection is closed (a late answer would be taken for the next one's) and
        ``TimeoutError("no {what} within ...")`` raised."""
        deadline = None if timeout is None else self._now() + timeout
        if not self._read_until(lambda: token in self._answers, deadline):
            self._shut()
            raise TimeoutError(f"no {what} within {timeout:g} s")
        answer = self._answers.pop(token)
        if isinstance(answer, Failed):
            raise answer.error
        return answer.value

    def _read_until(self, done: Callable[[], bool], deadline: float | None = None) -> bool:
        """Send what the session wrote and read until ``done()``; False if ``deadline``
        passed first."""
        self._sent()
        while not done():
            if not self._receive(deadline):
                return False
        return True

    def _sent(self) -> None:
        """Send what the session wrote (a request that gets no answer)."""
        self._handle(self.session.events())
        self._flush()

    def _next(self, queue: deque[Any], timeout: float | None) -> Any:
        """The next item of ``queue`` (queued or read now), or None after ``timeout``
        seconds (None: as long as it takes; 0: only what has already arrived)."""
        deadline = None if timeout is None else self._now() + timeout
        while not queue:
            if not self._receive(deadline, poll=timeout == 0):
                return None
        return queue.popleft()

    def _every(self, take: Callable[[], T | None]) -> Iterator[T]:
        """Everything ``take()`` (a ``next_...`` method, waiting as long as it takes) gives,
        until the connection ends (which raises)."""
        while True:
            item = take()
            if item is not None:
                yield item

    def _check_open(self) -> None:
        if self.closed:
            raise self.session.closed()

    # -- plumbing ----------------------------------------------------------------------------

    def _receive(self, deadline: float | None, poll: bool = False) -> bool:
        """Read and handle one chunk, or run the session's timers that are due; False if
        ``deadline`` passed first (``poll``: only what is there now)."""
        while True:
            self._check_open()
            now = self._now()
            due = self.session.next_tick()
            if due is not None and now >= due:
                self._handle(self.session.tick(now))
                self._flush()
                return True  # the caller sees what the timers did (a request timed out)
            if not poll and deadline is not None and now >= deadline:
                return False
            wait: float | None = 0.0
            if not poll:
                wakes = [t for t in (due, deadline) if t is not None]
                wait = max(min(wakes) - now, 0.001) if wakes else None
            sock = self._channel.sock
            sock.settimeout(wait)
            try:
                data = sock.recv(self._channel.recv_size)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                if poll:
                    return False
                continue
            except ConnectionResetError as e:  # it closed with our data still unread
                self._shut()
                raise self._lost(f"the {self.peer} closed the connection") from e
            except OSError as e:
                self._shut()
                raise self._lost(f"connection lost: {e.strerror or e}") from e
            if not data:
                self._shut()
                raise self._lost(f"the {self.peer} closed the connection")
            self._feed(data)
            return True

    def _feed(self, data: bytes) -> None:
        for unit in self._channel.received(data):
            self._handle(self.session.receive(unit, self._now()))
        self._flush()
        if self._channel.peer_closed:  # an answer it carried may still be taken
            self._shut(self._lost(f"the {self.peer} closed the connection"))

    def _handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, Answered | Failed):
                self._answers[event.token] = event
            elif isinstance(event, Ended):
                self._ended(event)
            else:
                self._event(event)

    def _ended(self, ended: Ended) -> None:
        if not ended.abort:
            with contextlib.suppress(ConnectionClosed):
                self._flush()  # the goodbye (an ERROR frame)
        error = ended.error
        self._shut()
        if isinstance(error, RemoteProtocolError):
            raise self._lost(f"protocol error from the {self.peer}: {error}") from error
        raise error

    def _flush(self) -> None:
        units = self.session.outgoing()
        if not units or self.closed:
            return
        self._channel.sock.settimeout(self.timeout)
        try:
            self._channel.send(units)
        except TimeoutError:
            self._shut()
            raise TimeoutError(f"the {self.peer} took nothing for {self.timeout:g} s") from None
        except (BrokenPipeError, ConnectionResetError) as e:
            self._shut()
            raise self._lost(f"the {self.peer} closed the connection") from e
        except OSError as e:
            self._shut()
            raise self._lost(f"cannot send: {e.strerror or e}") from e

    def _lost(self, text: str) -> ConnectionClosed:
        error = self.session.closed_error(text)
        self.session.lost(error)
        return error

    def _shut(self, error: BaseException | None = None) -> None:
        if not self.closed:
            self.closed = True
            self._channel.sock.close()
            self.session.lost(error or self.session.closed_error("the connection is closed"))
