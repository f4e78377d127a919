"""Giving memory back after a burst, and reading how much the process holds.

Freeing Python objects returns their memory to the allocator, not always to the system:
glibc keeps freed heap pages for reuse, so after a flood of topics or of slow consumers'
backlogs the broker's resident size would stay at its peak long after the clients left.
``malloc_trim(0)`` hands the free pages back. Before it, a full garbage collection: a
closed connection's protocol, transport and decoder refer to one another, and the cyclic
collector's full pass (which frees them, and the caches they hold) is otherwise rare. Both
cost time, so they are not run per close: :class:`Trimmer` runs them once, shortly after a
large release (a slow consumer's backlog, a connection with many subscriptions, the topic
table rebuilt, many closes), and at most every :data:`TRIM_SPACING` seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from typing import Any

#: a trim follows the first large release by this long, so a burst of closes costs one
TRIM_DELAY = 1.0
#: and comes at most this often: its full garbage collection pauses the reactor (tens of
#: milliseconds), so constant churn must not pay it every second
TRIM_SPACING = 10.0
#: closes that count as a large release together
CLOSES_PER_TRIM = 256


def freeze_startup_heap() -> int:
    """Take what is alive now out of the cyclic collector's sight (``gc.freeze``), after one
    last full collection: modules, classes, plugins, the configuration — what lives as long
    as the process. A full collection (Python's own, every so often; the trimmer's, after a
    large release) then walks only what the broker made since: connections, topics. On the
    benchmark machine the started broker's own heap cost 25 ms per full collection, a
    pause every client would see in its latency. Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _load_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _load_trim()


def trim() -> bool:
    """Return free heap pages to the system; False where the C library cannot."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def resident_bytes() -> int:
    """The process's resident set size, or 0 where /proc does not say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Trimmer:
    """Schedules one :func:`trim` on ``clock`` after large releases."""

    def __init__(self, clock: Any, report: Any = None) -> None:
        self._clock = clock
        #: ``report(resident_before, resident_after)`` after each trim, in bytes
        self._report = report
        self._call: Any = None
        self._closes = 0
        self._last: float | None = None
        #: trims done (for tests and the status line)
        self.trims = 0

    def released(self) -> None:
        """Something large was freed: trim soon."""
        if self._call is None:
            delay = TRIM_DELAY
            if self._last is not None:
                delay = max(delay, self._last + TRIM_SPACING - self._clock.seconds())
            self._call = self._clock.callLater(delay, self._trim)

    def closed(self) -> None:
        """A connection closed; many of them add up to a large release."""
        self._closes += 1
        if self._closes >= CLOSES_PER_TRIM:
            self.released()

    def _trim(self) -> None:
        self._call = None
        self._closes = 0
        self._last = self._clock.seconds()
        self.trims += 1
        # a closed connection's protocol, transport and decoder refer to each other, so
        # they (and the caches they hold) wait for the cyclic collector's rare full pass
        before = resident_bytes()
        gc.collect()
        trim()
        if self._report is not None:
            self._report(before, resident_bytes())

    def cancel(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
