"""The blocking half of every client: sockets (:func:`open_tcp`, :func:`open_unix`,
:func:`adopt_socket`) and the channels that carry a session's units on them
(:class:`StreamChannel`, :class:`PacketChannel`; both from :mod:`.channels`, the
WebSocket one in :mod:`msgbroker.clientkit.websocket`), and :class:`BlockingClient`,
which runs a sans-IO :class:`~msgbroker.clientkit.session.ClientSession` on a channel with
no reactor: one loop that sends, reads with a deadline, runs the session's timers while it
reads, and closes.

A protocol's blocking client subclasses :class:`BlockingClient` with the protocol's API:
each request asks the session for a token and waits for its answer
(:meth:`BlockingClient._wait`); deliveries are queued by :meth:`BlockingClient._event` for
the ``next_...`` methods (:meth:`BlockingClient._next`). Timers (keepalives, request
timeouts) run only while the client reads; :meth:`BlockingClient.poll` reads without
waiting, for a program that is busy elsewhere.

With ``reconnect=``, a lost connection is restored (:meth:`BlockingClient._reopen`, the
session's replay) inside the call that finds it lost — there is no thread: a wait for
deliveries goes on, a request waits for it up to its timeout; a request in flight when the
connection drops raises ``ConnectionClosed`` and is never sent again (docs/clientkit.md).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

from msgbroker.errors import RemoteProtocolError

from .channels import PacketChannel, StreamChannel, adopt_socket, open_tcp, open_unix
from .reconnect import Backoff, Reconnect, gives_up, reconnect_policy, still_to_replay
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


class BlockingClient:
    """Runs :attr:`session` on ``channel`` (see the module docstring). Not thread-safe.

    ``timeout`` bounds each send (the peer must take what is written: ``TimeoutError``
    otherwise); ``clock`` is where the time comes from (``time.monotonic``; tests pass a
    fake). Errors name the other side :attr:`peer` ("the broker closed the connection").
    When the session ends the socket is closed and its error raised — a protocol error as
    the protocol's :class:`~msgbroker.clientkit.session.ConnectionClosed`; later calls
    raise :meth:`ClientSession.closed`.

    ``reconnect`` (True or a :class:`~msgbroker.clientkit.reconnect.Reconnect`) needs a
    subclass with :meth:`_reopen` that calls :meth:`_opened` once its first connection is
    ready; ``sleep`` waits between attempts (tests pass one that moves their clock).
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
        reconnect: Reconnect | bool | None = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.session = session
        self.timeout = timeout
        self.closed = False
        self._channel = channel
        self._now = clock
        self._sleep = sleep
        self._answers: dict[int, Answered | Failed] = {}
        self._backoff: Backoff | None = None
        self._live = False  # up and ready (after _opened): its loss starts reconnecting
        self._lost_live = False  # a live connection was lost and is not restored yet
        self.set_reconnect(reconnect)
        self._closing = False  # close() was called: never reconnect
        self._due = 0.0  # when the next attempt to reconnect may start
        try:
            self._start()
        except BaseException:
            self._shut()
            raise

    def _start(self) -> None:
        self._handle(self.session.start(self._now()))
        self._flush()
        early = self._channel.leftover()
        if early:
            self._feed(early)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def socket(self) -> socket.socket:
        """The connected socket (an ``ssl.SSLSocket`` with TLS)."""
        return self._channel.sock

    @property
    def reconnecting(self) -> bool:
        """Whether the connection is lost and the next call reconnects (``reconnect=``)."""
        return self._lost_live

    def set_reconnect(self, reconnect: Reconnect | bool | None) -> None:
        """Reconnect from now on as ``reconnect=`` says (None: no more): for a program whose
        first steps (a subscription the broker may refuse by closing) should end it."""
        policy = reconnect_policy(reconnect)
        if policy is not None and type(self)._reopen is BlockingClient._reopen:
            raise TypeError(f"{type(self).__name__} cannot reconnect: it has no _reopen()")
        self._backoff = Backoff(policy) if policy is not None else None
        if self._backoff is None:
            self._lost_live = False
        elif self._live:
            self._backoff.up(self._now())

    def close(self) -> None:
        """Say goodbye as the protocol does (:meth:`_goodbye`), close the socket (and stop
        reconnecting). Never raises; does nothing when already closed."""
        self._closing = True
        self._lost_live = False
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
        waiting. Raises the protocol's ``ConnectionClosed`` if the connection ended (with
        ``reconnect=``: reconnects when an attempt is due, else returns)."""
        if self._lost_live and not self._restore(self._now()):
            return
        self._take_arrived()

    def _take_arrived(self) -> None:
        """Handle what already arrived; a loss it shows (with ``reconnect=``) is left for
        the next call to restore."""
        try:
            while self._receive(self._now(), poll=True):
                pass
        except Exception:
            if not self._lost_live:
                raise

    # -- for protocol subclasses ---------------------------------------------------------------

    def _event(self, event: Any) -> None:
        """An event of the protocol's own (a delivery): queue it."""

    def _reopen(self) -> tuple[ClientSession, StreamChannel]:
        """A new connection for reconnecting: a fresh session of the protocol, with the same
        settings, and a connected channel (``OSError`` when it cannot connect)."""
        raise NotImplementedError

    def _opening(self) -> None:
        """After :meth:`_reopen`: wait for the protocol's opening exchange (a version
        check, a handshake) — not the login, which the session's replay does."""

    def _opened(self) -> None:
        """The first connection is ready (logged in): from now on its loss is reconnected,
        with ``reconnect=``."""
        self._live = True
        if self._backoff is not None:
            self._backoff.up(self._now())

    def _usable(self, timeout: float | None = None) -> None:
        """Before a request or a send: the connection, reconnected first when it is lost
        (waiting up to ``timeout``, default the client's); else the protocol's
        ``ConnectionClosed``."""
        if not self.closed and self._backoff is not None:
            self._take_arrived()  # a connection already closed by the peer: not for this
        if not self.closed:
            return
        if not self._lost_live:
            raise self.session.closed()
        wait = self.timeout if timeout is None else timeout
        if not self._restore(None if wait is None else self._now() + wait):
            raise self.session.closed_error(
                f"not connected: the {self.peer} did not come back within {wait:g} s"
            )

    def _ask(
        self, ask: Callable[[], int], timeout: float | None = None, what: str = "reply"
    ) -> Any:
        """A request: :meth:`_usable` (up to ``timeout``, default the client's), then
        ``ask()`` its token and :meth:`_wait` for the answer (``timeout``: for the answer
        too, what is left of it)."""
        start = self._now()
        self._usable(timeout)
        token = ask()
        if timeout is not None:
            timeout = max(timeout - (self._now() - start), 0.0)
        return self._wait(token, timeout, what)

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
            text = f"no {what} within {timeout:g} s"
            self._shut(self.session.closed_error(text))
            raise TimeoutError(text)
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
        seconds (None: as long as it takes; 0: only what has already arrived). With
        ``reconnect=``, a lost connection is restored meanwhile, within that time."""
        deadline = None if timeout is None else self._now() + timeout
        while not queue:
            if self._lost_live:
                if not self._restore(self._now() if timeout == 0 else deadline):
                    return None
                continue
            try:
                if not self._receive(deadline, poll=timeout == 0):
                    return None
            except Exception:
                if not self._lost_live:
                    raise
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
                raise self._lost(f"the {self.peer} closed the connection") from e
            except OSError as e:
                raise self._lost(f"connection lost: {e.strerror or e}") from e
            if not data:
                raise self._lost(f"the {self.peer} closed the connection")
            self._feed(data)
            return True

    def _feed(self, data: bytes) -> None:
        for unit in self._channel.received(data):
            self._handle(self.session.receive(unit, self._now()))
        self._flush()
        if self._channel.peer_closed:  # an answer it carried may still be taken
            self._lost(f"the {self.peer} closed the connection")

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
            text = f"the {self.peer} took nothing for {self.timeout:g} s"
            self._shut(self.session.closed_error(text))
            raise TimeoutError(text) from None
        except (BrokenPipeError, ConnectionResetError) as e:
            raise self._lost(f"the {self.peer} closed the connection") from e
        except OSError as e:
            raise self._lost(f"cannot send: {e.strerror or e}") from e

    def _lost(self, text: str) -> ConnectionClosed:
        """Close with the protocol's ``ConnectionClosed(text)``, which is returned."""
        error = self.session.closed_error(text)
        self._shut(error)
        return error

    def _shut(self, error: BaseException | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self._channel.sock.close()
        self.session.lost(error or self.session.closed_error("the connection is closed"))
        if not self._live:
            return
        self._live = False
        backoff = self._backoff
        if backoff is not None and not self._closing:
            self._lost_live = True
            now = self._now()
            self._due = now + backoff.lost(self.session.replay(), now)
            backoff.tell_lost(self.session.error or self.session.closed())

    # -- reconnecting -------------------------------------------------------------------------

    def _restore(self, deadline: float | None) -> bool:
        """Reconnect, replaying the lost session's login and subscriptions, attempt after
        attempt (with the policy's waits) until one works (True) or ``deadline`` comes
        first (False; the next call goes on). Raises the error that ends reconnecting: a
        refusal, or the last failure once the policy's attempts are spent."""
        backoff = self._backoff
        assert backoff is not None
        while True:
            now = self._now()
            if deadline is not None and self._due > deadline:
                if deadline > now:
                    self._sleep(deadline - now)
                return False
            if self._due > now:
                self._sleep(self._due - now)
            try:
                self._attempt(backoff)
            except Exception as e:
                self._shut()  # this attempt's connection (not a live one)
                if gives_up(e):
                    self._lost_live = False
                    raise
                wait = backoff.failed()
                if wait is None:
                    self._lost_live = False
                    raise self.session.closed_error(
                        f"gave up reconnecting after {backoff.failures} attempts: {e}"
                    ) from e
                self._due = self._now() + wait
                continue
            return True

    def _attempt(self, backoff: Backoff) -> None:
        session, channel = self._reopen()
        self.session, self._channel, self.closed = session, channel, False
        self._answers.clear()
        self._start()
        self._opening()
        replay = still_to_replay(backoff.replay, session)
        tokens = [item.ask(session, self._now()) for item in replay]
        self._sent()
        for token in tokens:
            if token is not None:
                self._wait(token, self.timeout, "reply while reconnecting")
        self._live, self._lost_live = True, False
        backoff.tell_restored(backoff.restored(replay, self._now()))
