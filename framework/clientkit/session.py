"""The sans-IO half of every client: :class:`ClientSession`, the events it makes, and
:class:`Timers` for the sessions that keep time.

A protocol's client session is its codec plus the connection's rules (which reply answers
which request, keepalives, handshakes), with no Twisted, no sockets and no clock: what the
server sent goes in through :meth:`ClientSession.receive`, which returns events; what to
send accumulates for :meth:`ClientSession.outgoing`; time goes in as ``now`` (seconds, any
origin) and timers come out as :meth:`ClientSession.next_tick`, at which the driver calls
:meth:`ClientSession.tick`. The drivers, :mod:`msgbroker.clientkit.protocol` (Twisted) and
:mod:`msgbroker.clientkit.blocking` (a plain socket), own the transport and the waiting.

Requests are numbered by *tokens*: a session's request method returns one, and the answer
comes back as :class:`Answered` (or :class:`Failed`) carrying it. :class:`Ended` says the
session is over and why; everything else a session emits (deliveries, notices) is the
protocol's own value, which the driver hands to the application.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Any, ClassVar, Generic, TypeVar

from attrs import frozen

from msgbroker.errors import RemoteProtocolError

from .reconnect import Replay

__all__ = [
    "Answered",
    "ClientSession",
    "ConnectionClosed",
    "Ended",
    "Failed",
    "SessionAttribute",
    "Timers",
]


class ConnectionClosed(ConnectionError):
    """The connection ended (or was never usable) before the operation completed. Each
    protocol's own error (``SSMPConnectionClosed``, ...) subclasses it."""


@frozen
class Answered:
    """The request numbered ``token`` succeeded with ``value``."""

    token: int
    value: Any = None


@frozen
class Failed:
    """The request numbered ``token`` failed with ``error``."""

    token: int
    error: BaseException


@frozen
class Ended:
    """The session is over: ``error`` says why. ``abort``: the driver closes at once;
    False: it first sends what is written (a goodbye such as an ERROR frame)."""

    error: BaseException
    abort: bool = True


class SessionAttribute:
    """A client's read-only attribute that is its session's of the same name (its
    ``session`` attribute): ``identity = SessionAttribute("who the broker accepted")``."""

    def __init__(self, doc: str = "") -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, client: Any, owner: type | None = None) -> Any:
        return self if client is None else getattr(client.session, self.name)


K = TypeVar("K", bound=Hashable)


class Timers(Generic[K]):
    """Deadlines by key (a request id, ``"heartbeat"``, ...): :meth:`set` one, :meth:`cancel`
    it, take the :meth:`expired` ones; :meth:`next_due` is when the next one is. A heap, so
    thousands of pending requests cost no more than one."""

    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()

    def set(self, key: K, due: float) -> None:
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._order), key))

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def clear(self) -> None:
        self._due.clear()
        self._heap.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def next_due(self) -> float | None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # cancelled or set again since
        return heap[0][0] if heap else None

    def expired(self, now: float) -> list[K]:
        """The keys due at ``now``, soonest first, and forgotten."""
        out: list[K] = []
        while (due := self.next_due()) is not None and due <= now:
            key = heapq.heappop(self._heap)[2]
            del self._due[key]
            out.append(key)
        return out


class ClientSession:
    """Base class of a protocol's sans-IO client session (see the module docstring).

    A subclass implements :meth:`_received` (and :meth:`_started`, :meth:`_tick`,
    :meth:`next_tick` when it keeps time) and calls :meth:`_send`, :meth:`_emit`,
    :meth:`_answer`, :meth:`_fail` and :meth:`_end`. What travels is the transport's unit:
    bytes on a stream, one packet on a packet socket, ``(is_binary, payload)`` on a
    WebSocket; :meth:`receive` takes one, :meth:`outgoing` gives a list of them.
    """

    #: the protocol's :class:`ConnectionClosed`, raised once the session is over
    closed_error: ClassVar[type[ConnectionClosed]] = ConnectionClosed

    def __init__(self) -> None:
        self._out: list[Any] = []
        self._events: list[Any] = []
        self._tokens = itertools.count(1)
        self._started_at: float | None = None
        #: why the session is over (None while it is not)
        self.error: BaseException | None = None

    # -- for drivers -------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.error is not None

    @property
    def started(self) -> bool:
        return self._started_at is not None

    def start(self, now: float) -> list[Any]:
        """The transport is open (connected; for a WebSocket, the handshake done)."""
        if self._started_at is None and not self.ended:
            self._started_at = now
            self._started(now)
        return self.events()

    def receive(self, data: Any, now: float = 0.0) -> list[Any]:
        """Handle one unit from the server (``now`` matters to sessions that keep time);
        the events it makes, in order. An :class:`Ended` is the last one; after it the
        session ignores input."""
        if self.ended:
            return []
        try:
            self._received(data, now)
        except RemoteProtocolError as e:
            self._protocol_error(e)
        return self.events()

    def tick(self, now: float) -> list[Any]:
        """Run the timers due at ``now`` (see :meth:`next_tick`); the events they make."""
        if not self.ended:
            self._tick(now)
        return self.events()

    def next_tick(self) -> float | None:
        """When :meth:`tick` wants to be called next (None: no timer is set)."""
        return None

    def events(self) -> list[Any]:
        """The events made since the last call (by a request answered at once, say)."""
        events, self._events = self._events, []
        return events

    def outgoing(self) -> list[Any]:
        """What to send now, in order (and forget)."""
        out, self._out = self._out, []
        return out

    def lost(self, error: BaseException) -> None:
        """The transport is gone (``error`` says why, unless the session ended first)."""
        if self.error is None:
            self.error = error

    def close(self) -> None:
        """The application closes: the session ends with "closed by the client"."""
        if self.error is None:
            self.error = self.closed_error("closed by the client")

    def closed(self) -> ConnectionClosed:
        """The error for using the session once it is over: :attr:`error` when it is the
        protocol's :attr:`closed_error`, else one that says it."""
        error = self.error
        if isinstance(error, self.closed_error):
            return error
        return self.closed_error("the connection is closed" + (f": {error}" if error else ""))

    def pending_error(self) -> BaseException:
        """What the requests still pending fail with when the session ends: why it ended
        (a protocol may say :meth:`closed` instead)."""
        return self.error if self.error is not None else self.closed()

    def check_open(self) -> None:
        """Raise :meth:`closed` once the session is over."""
        if self.error is not None:
            raise self.closed()

    def replay(self) -> list[Replay]:
        """The session's restorable state, as the requests that put it back on a new
        session of the protocol (:mod:`msgbroker.clientkit.reconnect`): the login first
        (``login=True``), then every subscription in force, in the order they were made.
        A protocol records them as the server accepts them (or, with no replies, as they
        are written). Default: nothing to restore."""
        return []

    # -- for subclasses ----------------------------------------------------------------------

    def _started(self, now: float) -> None:
        """Hook: write a greeting, start timers."""

    def _received(self, data: Any, now: float) -> None:
        raise NotImplementedError

    def _tick(self, now: float) -> None:
        """Hook: the timers due at ``now``."""

    def _protocol_error(self, error: RemoteProtocolError) -> None:
        """The server broke the protocol; by default the session ends with ``error``."""
        self._end(error)

    def _send(self, unit: Any) -> None:
        self._out.append(unit)

    def _send_first(self, units: list[Any]) -> None:
        """Send ``units`` before what is already written (a greeting that must go first,
        when requests were asked before the transport opened)."""
        self._out[:0] = units

    def _token(self) -> int:
        return next(self._tokens)

    def _emit(self, event: Any) -> None:
        self._events.append(event)

    def _answer(self, token: int, value: Any = None) -> None:
        self._events.append(Answered(token, value))

    def _fail(self, token: int, error: BaseException) -> None:
        self._events.append(Failed(token, error))

    def _end(self, error: BaseException, abort: bool = True) -> None:
        if self.error is None:
            self.error = error
            self._events.append(Ended(error, abort))

