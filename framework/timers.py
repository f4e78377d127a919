"""A session's timers as deadlines, the keepalive built on them, and one queue for all.

A server session asks for calls (:meth:`Timers.call_later`); the calls wait on a
:class:`TimerQueue`, a heap of deadlines. The broker's queue holds every connection's timers
and runs on its reactor through one reactor call for the earliest deadline
(:meth:`TimerQueue.run_on`), not one per connection: a Twisted ``DelayedCall`` and what it
holds are about 600 bytes per connection. A session driven by a test has a queue of its own,
ticked (:meth:`Timers.tick`) after the test advances its fake clock. Nothing here imports
Twisted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Protocol


class Timer:
    """One requested call (:meth:`Timers.call_later`); ``cancel()`` it when not needed.

    Ordered by deadline, then by when it was asked for (a queue is a heap of them)."""

    __slots__ = ("at", "call", "seq", "timers")

    def __init__(self, at: float, call: Callable[[], None] | None) -> None:
        self.at = at
        self.call = call
        #: the session's timers while pending; None once it ran or was cancelled
        self.timers: Timers | None = None
        self.seq = 0

    def __lt__(self, other: Timer) -> bool:
        at, other_at = self.at, other.at
        return at < other_at or (at == other_at and self.seq < other.seq)

    def cancel(self) -> None:
        timers = self.timers
        if timers is not None:
            timers.cancel(self)

    @property
    def active(self) -> bool:
        return self.timers is not None

    def release(self) -> None:
        """Cancelled: let go of what it would have called now, not when its deadline comes
        up in the queue (it may wait there until then)."""
        self.call = None

    def fire(self) -> None:
        """Its time came (it is no longer pending)."""
        call = self.call
        self.call = None
        if call is not None:
            call()


class TimerQueue:
    """Timers of any number of sessions on one heap, earliest first.

    ``seconds()`` is the time now. A cancelled timer stays in the heap, marked, until its
    deadline comes up or until cancelled ones are half the heap (then the heap is rebuilt
    without them): cancelling is O(1), and a login timer cancelled at login costs nothing
    more than its slot meanwhile. ``wake(at)`` is told whenever the earliest deadline moves
    earlier (``wake(None)``: nothing is pending any more); whoever runs the queue calls
    :meth:`tick` at or after it."""

    __slots__ = ("_cancelled", "_heap", "_seq", "seconds", "wake", "woken_for")

    def __init__(
        self, seconds: Callable[[], float], wake: Callable[[float | None], None] | None = None
    ) -> None:
        self.seconds = seconds
        self.wake = wake
        self._heap: list[Timer] = []
        self._seq = 0
        self._cancelled = 0
        #: the deadline ``wake`` was last told of
        self.woken_for: float | None = None

    def __len__(self) -> int:
        """Pending timers (cancelled ones not counted)."""
        return len(self._heap) - self._cancelled

    def push(self, timer: Timer) -> None:
        self._seq = seq = self._seq + 1
        timer.seq = seq
        heapq.heappush(self._heap, timer)
        woken_for = self.woken_for
        if woken_for is None or timer.at < woken_for:
            self.woken_for = timer.at
            if self.wake is not None:
                self.wake(timer.at)

    def discard(self, timer: Timer) -> None:
        """``timer`` (in the heap) was cancelled."""
        timer.timers = None
        timer.release()
        self._cancelled += 1
        heap = self._heap
        if self._cancelled == len(heap):  # nothing pending: nothing to wake up for
            heap.clear()
            self._cancelled = 0
            self.woken_for = None
            if self.wake is not None:
                self.wake(None)
        elif self._cancelled > 64 and 2 * self._cancelled >= len(heap):
            # in place: a tick under way (this cancel comes from a call it runs) holds it
            heap[:] = [t for t in heap if t.timers is not None]
            heapq.heapify(heap)
            self._cancelled = 0

    @property
    def deadline(self) -> float | None:
        """When the next call is due, or None."""
        heap = self._heap
        while heap and heap[0].timers is None:  # cancelled
            heapq.heappop(heap)
            self._cancelled -= 1
        return heap[0].at if heap else None

    def tick(self) -> None:
        """Run every call that is due, earliest first (not those asked for meanwhile: they
        wait for the next tick, as they would for their own reactor call)."""
        now = self.seconds()
        heap = self._heap
        asked_before = self._seq + 1
        pop = heapq.heappop
        while heap:
            timer = heap[0]
            if timer.at > now or timer.seq >= asked_before:
                break
            pop(heap)
            timers = timer.timers
            if timers is None:  # cancelled
                self._cancelled -= 1
                continue
            timer.timers = None
            timers.forget(timer)
            timer.fire()
        deadline = self.deadline
        self.woken_for = deadline
        if deadline is not None and self.wake is not None:
            self.wake(deadline)

    def run_on(self, reactor: Any, after_tick: Callable[[], None] | None = None) -> None:
        """Tick on ``reactor``: one reactor call, for the earliest deadline, moved only when
        a deadline comes earlier; ``after_tick()`` after each tick (the broker flushes the
        batch of what the calls wrote)."""
        waker = _ReactorWaker(self, reactor, after_tick)
        self.wake = waker.wake


class _ReactorWaker:
    __slots__ = ("after_tick", "call", "queue", "reactor")

    def __init__(
        self, queue: TimerQueue, reactor: Any, after_tick: Callable[[], None] | None
    ) -> None:
        self.queue = queue
        self.reactor = reactor
        self.after_tick = after_tick
        self.call: Any = None

    def wake(self, at: float | None) -> None:
        call = self.call
        if at is None:
            if call is not None and call.active():
                call.cancel()
            self.call = None
            return
        delay = max(0.0, at - self.reactor.seconds())
        if call is not None and call.active():
            if call.getTime() <= at:
                return
            call.reset(delay)
            return
        self.call = self.reactor.callLater(delay, self.tick)

    def tick(self) -> None:
        self.call = None
        self.queue.tick()
        if self.after_tick is not None:
            self.after_tick()


class Timers:
    """One session's timers: it asks (:meth:`call_later`); they wait on ``queue`` (the
    broker's, shared by every connection) or, made without one, on a queue of their own
    that :meth:`tick` runs — a test's, after advancing its fake clock. ``seconds()`` is the
    time now."""

    __slots__ = ("_pending", "queue", "seconds")

    def __init__(self, seconds: Callable[[], float], queue: TimerQueue | None = None) -> None:
        if queue is None:
            queue = TimerQueue(seconds)
        self.queue = queue
        # the queue's clock (one object for every session), not another bound method each
        self.seconds = queue.seconds
        # this session's pending timers (so that closing cancels them all): None, the one
        # timer (an idle connection has its keepalive alone: no list), or a list of them
        self._pending: Timer | list[Timer] | None = None

    @property
    def pending(self) -> list[Timer]:
        """This session's pending timers."""
        pending = self._pending
        if pending is None:
            return []
        return list(pending) if isinstance(pending, list) else [pending]

    def call_later(self, delay: float, call: Callable[[], None]) -> Timer:
        timer = Timer(self.seconds() + delay, call)
        self.add(timer)
        return timer

    def add(self, timer: Timer) -> None:
        """Put ``timer`` (not pending) on this session's queue, for ``timer.at``."""
        timer.timers = self
        pending = self._pending
        if pending is None:
            self._pending = timer
        elif isinstance(pending, list):
            pending.append(timer)
        else:
            self._pending = [pending, timer]
        self.queue.push(timer)

    def forget(self, timer: Timer) -> None:
        """``timer`` is no longer pending (it runs now, or was cancelled)."""
        pending = self._pending
        if pending is timer:
            self._pending = None
        elif isinstance(pending, list):
            pending.remove(timer)
            if len(pending) == 1:
                self._pending = pending[0]

    def cancel(self, timer: Timer) -> None:
        if timer.timers is self:
            self.forget(timer)
            self.queue.discard(timer)

    @property
    def deadline(self) -> float | None:
        """When this session's next call is due, or None."""
        pending = self.pending
        return min(timer.at for timer in pending) if pending else None

    def tick(self) -> None:
        """Run every due call of the queue (a test's session, alone on its own queue)."""
        self.queue.tick()

    def cancel_all(self) -> None:
        pending = self.pending
        self._pending = None
        discard = self.queue.discard
        for timer in pending:
            discard(timer)


class KeepaliveOwner(Protocol):
    """What a :class:`Keepalive` calls (a server session)."""

    def send_keepalive(self) -> None: ...

    def keepalive_expired(self) -> None: ...

    @property
    def keepalive_held(self) -> bool: ...


class Keepalive(Timer):
    """``interval`` s after the last activity call ``owner.send_keepalive()`` (send a ping);
    another ``interval`` s with no activity and call ``owner.keepalive_expired()``.

    Activity is recorded by :meth:`touch` (once per input, not per message); the timer
    re-arms only when it fires, so a busy connection costs one clock read per input.
    ``owner.keepalive_held`` is True while the broker itself stopped reading from the peer
    (flood control, a pending login): that silence is ours, so it counts as activity.

    It is its own timer, and calls its owner's methods rather than holding bound methods or
    a closure: a few hundred bytes less per idle connection. Once cancelled it stays so.
    """

    __slots__ = ("_clock", "_interval", "_owner", "_pinged_at", "last")

    def __init__(self, timers: Timers, interval: float, owner: KeepaliveOwner) -> None:
        super().__init__(timers.seconds() + interval, None)
        self._clock = timers
        self._interval = interval
        self._owner = owner
        self._pinged_at: float | None = None
        self.last = timers.seconds()
        timers.add(self)

    def touch(self) -> None:
        self.last = self._clock.seconds()

    def fire(self) -> None:
        timers = self._clock
        now = timers.seconds()
        owner = self._owner
        if owner.keepalive_held:
            self.last = now
        idle = now - self.last
        if idle < self._interval:
            self._pinged_at = None
            self._rearm(now + self._interval - idle)
        elif self._pinged_at is not None and self.last < self._pinged_at:
            owner.keepalive_expired()  # pinged, and nothing at all came back since
        else:
            self._pinged_at = now
            self._rearm(now + self._interval)
            owner.send_keepalive()

    def release(self) -> None:
        # a closed connection's keepalive may wait in the queue until its deadline: it must
        # not keep the session (and all it holds) alive that long
        self._owner = _NO_OWNER
        self._clock = _NO_CLOCK

    def _rearm(self, at: float) -> None:
        self.at = at
        self._clock.add(self)


class _NoOwner:
    keepalive_held = False

    def send_keepalive(self) -> None:
        pass

    def keepalive_expired(self) -> None:
        pass


_NO_OWNER = _NoOwner()
_NO_CLOCK = Timers(lambda: 0.0)


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
