"""The broker's defences against abuse that are not routing: how many connections, from
where, how fast failed logins may come, and log lines an attacker cannot turn into a flood.

No Twisted, no I/O: the time is passed in (``now``, seconds from any monotonic origin), so
every rule here is tested with plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import define, field


@define
class RateLimitedLog:
    """Says at most one line per ``key`` per ``interval`` seconds: ``emit(text, more)``,
    where ``more`` counts the lines suppressed since the last one said for that key.

    With ``later`` (``later(delay, call)``: a reactor's ``callLater``), what was suppressed
    is also said when the key's interval ends, as the last suppressed line with the count
    of the others, instead of waiting for a next line that may never come: a burst costs
    one line when it starts and one per interval while it lasts. :meth:`flush` says what
    is pending at once (the broker stops)."""

    emit: Callable[[str, int], None]
    interval: float = 10.0
    later: Callable[[float, Callable[[], None]], Any] | None = None
    _last: dict[str, float] = field(factory=dict)
    _suppressed: dict[str, int] = field(factory=dict)
    #: key -> the latest line suppressed, said when the interval ends (with ``later``)
    _latest: dict[str, str] = field(factory=dict)
    #: key -> the pending call that says it
    _scheduled: dict[str, Any] = field(factory=dict)

    def __call__(self, key: str, now: float, text: str) -> None:
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            if self.later is not None:
                self._latest[key] = text
                if key not in self._scheduled:
                    due = last + self.interval
                    self._scheduled[key] = self.later(
                        max(0.0, due - now), lambda: self._interval_ended(key, due)
                    )
            return
        if len(self._last) > 10_000:  # keys are bounded by what is configured, but be safe
            self.flush()
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        self._latest.pop(key, None)
        call = self._scheduled.pop(key, None)
        if call is not None:
            call.cancel()
        self.emit(text, self._suppressed.pop(key, 0))

    def _interval_ended(self, key: str, due: float) -> None:
        self._scheduled.pop(key, None)
        text = self._latest.pop(key, None)
        if text is None:
            return
        self._last[key] = due  # the next interval starts with this line
        self.emit(text, self._suppressed.pop(key, 1) - 1)

    def flush(self) -> None:
        """Say every suppressed line still pending now (the broker stops)."""
        for key, call in list(self._scheduled.items()):
            call.cancel()
            text = self._latest.pop(key, None)
            if text is not None:
                self.emit(text, self._suppressed.pop(key, 1) - 1)
        self._scheduled.clear()


@define
class LoginThrottle:
    """Failed logins per peer address: a token bucket of ``rate`` attempts a second that
    holds at most ``burst`` (``max(rate, 1)``). A failure takes a token; while the
    address has none left, its logins are refused before any credential is checked.
    Successful logins cost nothing, so a burst of honest clients is never slowed.
    ``rate`` 0 switches the throttle off.

    A login whose check takes a while (a password hash, verified in a thread) holds a
    token while it is checked (:meth:`checking`, then :meth:`checked`), and another such
    check from the address starts only when a token is free (:meth:`room`; the broker
    keeps the login waiting meanwhile, it does not refuse it): without that, an address
    could have any number of guesses checked at once, all allowed before the first one
    failed. Once decided it costs what any login costs: nothing when it succeeded, a token
    when it failed."""

    rate: float
    #: address -> (tokens, when they were counted)
    _buckets: dict[str, tuple[float, float]] = field(factory=dict)
    #: address -> logins from it being checked now
    _checking: dict[str, int] = field(factory=dict)

    def _tokens(self, host: str, now: float) -> float:
        burst = max(self.rate, 1.0)
        entry = self._buckets.get(host)
        if entry is None:
            return burst
        tokens, then = entry
        return min(burst, tokens + (now - then) * self.rate)

    def allows(self, host: str, now: float) -> bool:
        """Whether a login from ``host`` may be tried now (else it is refused unheard)."""
        return not self.rate or self._tokens(host, now) >= 1.0

    def room(self, host: str, now: float) -> bool:
        """Whether a login from ``host`` may start being checked now: a token is left that
        no check under way holds (else it waits for one)."""
        if not self.rate:
            return True
        return self._tokens(host, now) - self._checking.get(host, 0) >= 1.0

    def checking(self, host: str) -> None:
        """A login from ``host`` is being checked: it holds a token until :meth:`checked`."""
        if self.rate:
            self._checking[host] = self._checking.get(host, 0) + 1

    def checked(self, host: str) -> None:
        """The login :meth:`checking` announced is decided (call :meth:`failed` too when
        it failed)."""
        left = self._checking.get(host, 0) - 1
        if left > 0:
            self._checking[host] = left
        else:
            self._checking.pop(host, None)

    def failed(self, host: str, now: float) -> None:
        """A login from ``host`` failed (or was refused by the throttle)."""
        if not self.rate:
            return
        tokens = self._tokens(host, now)
        buckets = self._buckets
        if len(buckets) >= 65_536:  # forget addresses whose buckets are full again
            burst = max(self.rate, 1.0)
            for address, (left, then) in list(buckets.items()):
                if left + (now - then) * self.rate >= burst:
                    del buckets[address]
        buckets[host] = (max(0.0, tokens - 1.0), now)


@define
class ConnectionLimits:
    """Open connections in all and per peer address (0: no limit)."""

    max_total: int = 0
    max_per_address: int = 0
    total: int = 0
    by_address: dict[str, int] = field(factory=dict)

    def refusal(self, host: str) -> str | None:
        """Why a new connection from ``host`` is refused (the limit's name), or None."""
        if self.max_total and self.total >= self.max_total:
            return "max-connections"
        if self.max_per_address and host and self.by_address.get(host, 0) >= self.max_per_address:
            return "max-connections-per-address"
        return None

    def opened(self, host: str) -> None:
        self.total += 1
        if host:
            self.by_address[host] = self.by_address.get(host, 0) + 1

    def closed(self, host: str) -> None:
        self.total -= 1
        if host:
            left = self.by_address.get(host, 0) - 1
            if left > 0:
                self.by_address[host] = left
            else:
                self.by_address.pop(host, None)
