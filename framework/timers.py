"""A session's timers as deadlines, and the keepalive built on them.

A server session asks for calls (:meth:`Timers.call_later`); whoever runs it calls
:meth:`Timers.tick` — the connection adapter on the reactor, a test after advancing its
fake clock. Nothing here imports Twisted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any


class Timer:
    """One requested call (:meth:`Timers.call_later`); ``cancel()`` it when not needed."""

    __slots__ = ("at", "call", "timers")

    def __init__(self, timers: Timers, at: float, call: Callable[[], None]) -> None:
        self.timers = timers
        self.at = at
        self.call = call

    def cancel(self) -> None:
        self.timers.cancel(self)

    @property
    def active(self) -> bool:
        return self in self.timers.pending


class Timers:
    """A session's timers as deadlines: the session asks (:meth:`call_later`), whoever runs
    it calls :meth:`tick` at or after :attr:`deadline` — the connection adapter on the
    reactor, a test after advancing its fake clock. ``seconds()`` is the time now;
    ``wake(at)`` is told whenever the earliest deadline moves earlier."""

    __slots__ = ("pending", "seconds", "wake", "woken_for")

    def __init__(
        self, seconds: Callable[[], float], wake: Callable[[float], None] | None = None
    ) -> None:
        self.seconds = seconds
        self.wake = wake
        self.pending: list[Timer] = []
        #: the deadline ``wake`` was last told of
        self.woken_for: float | None = None

    def call_later(self, delay: float, call: Callable[[], None]) -> Timer:
        timer = Timer(self, self.seconds() + delay, call)
        self.pending.append(timer)
        woken_for = self.woken_for
        if woken_for is None or timer.at < woken_for:
            self.woken_for = timer.at
            if self.wake is not None:
                self.wake(timer.at)
        return timer

    def cancel(self, timer: Timer) -> None:
        # the adapter's wake-up, if it was for this one, finds nothing due and sleeps again
        with contextlib.suppress(ValueError):
            self.pending.remove(timer)

    @property
    def deadline(self) -> float | None:
        """When the next call is due, or None."""
        pending = self.pending
        return min(timer.at for timer in pending) if pending else None

    def tick(self) -> None:
        """Run every call that is due, earliest first."""
        now = self.seconds()
        due = sorted((t for t in self.pending if t.at <= now), key=_at)
        for timer in due:
            if timer in self.pending:  # an earlier call may have cancelled it
                self.pending.remove(timer)
                timer.call()
        deadline = self.deadline
        self.woken_for = deadline
        if deadline is not None and self.wake is not None:
            self.wake(deadline)

    def cancel_all(self) -> None:
        self.pending.clear()
        self.woken_for = None


def _at(timer: Timer) -> float:
    return timer.at


class Keepalive:
    """``interval`` s after the last activity call ``on_idle`` (send a ping); another
    ``interval`` s with no activity and call ``on_dead``.

    Activity is recorded by :meth:`touch` (once per input, not per message); the timer
    re-arms only when it fires, so a busy connection costs one clock read per input.
    ``held()`` is True while the broker itself stopped reading from the peer (flood control,
    a pending login): that silence is ours, so it counts as activity.
    """

    __slots__ = (
        "_held",
        "_interval",
        "_on_dead",
        "_on_idle",
        "_pinged_at",
        "_timer",
        "_timers",
        "last",
    )

    def __init__(
        self,
        timers: Timers,
        interval: float,
        on_idle: Callable[[], None],
        on_dead: Callable[[], None],
        held: Callable[[], bool] | None = None,
    ) -> None:
        self._timers = timers
        self._interval = interval
        self._on_idle = on_idle
        self._on_dead = on_dead
        self._held = held
        self._pinged_at: float | None = None
        self.last = timers.seconds()
        self._timer: Timer | None = timers.call_later(interval, self._check)

    def touch(self) -> None:
        self.last = self._timers.seconds()

    def _check(self) -> None:
        timers = self._timers
        now = timers.seconds()
        if self._held is not None and self._held():
            self.last = now
        idle = now - self.last
        if idle < self._interval:
            self._pinged_at = None
            self._timer = timers.call_later(self._interval - idle, self._check)
        elif self._pinged_at is not None and self.last < self._pinged_at:
            self._timer = None  # pinged, and nothing at all came back since
            self._on_dead()
        else:
            self._pinged_at = now
            self._timer = timers.call_later(self._interval, self._check)
            self._on_idle()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None


class ReactorTimer:
    """What autobahn wants of its batched timer (``call_later`` returning something to
    ``cancel``), on a given reactor. autobahn's own uses txaio's loop, the global reactor,
    whatever reactor its factory was given; the STMP WebSocket server and the client kit's
    WebSocket driver both give it this one."""

    __slots__ = ("reactor",)

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor

    def call_later(self, delay: float, fun: Any, *args: Any, **kwargs: Any) -> _Cancellable:
        return _Cancellable(self.reactor.callLater(delay, fun, *args, **kwargs))


class _Cancellable:
    __slots__ = ("call",)

    def __init__(self, call: Any) -> None:
        self.call = call

    def cancel(self) -> None:
        if self.call.active():
            self.call.cancel()
