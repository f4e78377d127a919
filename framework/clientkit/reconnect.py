"""Reconnecting, once for every client and both drivers, with no Twisted and no sockets:
:class:`Reconnect` (the policy: when to try again, when to give up, whom to tell),
:class:`Replay` (one request that puts back part of what a lost session had set up) and
:class:`Backoff` (one client's attempts in a row).

A protocol's client session remembers its *restorable state* — its login and every
subscription the application made — and gives it as :meth:`ClientSession.replay
<msgbroker.clientkit.session.ClientSession.replay>`: :class:`Replay` items the driver asks of
the next connection's session, in order, login first. What is restored is only that: a
request in flight when the connection drops fails with the protocol's ``ConnectionClosed``
(a publish is at most once: it may or may not have reached the broker, and is never sent
again by the client), and deliveries routed while the client was away are lost.

The Twisted driver is :class:`~msgbroker.clientkit.reconnecting.ReconnectingClient`; the
blocking one is :class:`~msgbroker.clientkit.blocking.BlockingClient` with ``reconnect=``.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from attrs import field, frozen

__all__ = [
    "Backoff",
    "Reconnect",
    "Replay",
    "Restored",
    "gives_up",
    "reconnect_policy",
    "still_to_replay",
]


@frozen
class Replay:
    """One request that restores part of a session's state on a new session of the same
    protocol: ``ask(session, now)`` writes it and returns its token (None when nothing
    answers it: the protocol has no reply). ``what`` names it for logs ("subscribe news"),
    never with a credential; ``login`` marks the login, which the driver leaves out when
    the new connection logged in already."""

    what: str
    ask: Callable[[Any, float], int | None] = field(repr=False)
    login: bool = False


def still_to_replay(replay: Iterable[Replay], session: Any) -> list[Replay]:
    """``replay`` without its login when ``session`` logged in already (a Twisted client's
    ``prepare`` did)."""
    logged_in = any(item.login for item in session.replay())
    return [item for item in replay if not (item.login and logged_in)]


@frozen
class Restored:
    """What a reconnection restored: after ``attempts`` attempts (1: the first one worked),
    the requests of :attr:`replayed` (their :attr:`Replay.what`)."""

    attempts: int
    replayed: tuple[str, ...]


def _check_delay(instance: Any, attribute: Any, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be 0 or more seconds, not {value!r}")


@frozen
class Reconnect:
    """How a client reconnects: the ``reconnect=`` argument of the clients (``True`` for
    these defaults).

    The n-th attempt after a loss waits ``initial * factor ** (n - 1)`` seconds, at most
    ``max_delay``, less a random part of up to ``jitter`` of it (so that the clients of a
    restarted broker do not all come back at the same instant): with the defaults 0.25 to
    0.5 s, then up to 1, 2, 4, ... 30 s. A connection lost less than ``max_delay`` after it
    was made does not start the waits over: the first attempt waits one step more per such
    quick loss in a row (two clients that take one identity from each other slow down,
    instead of swapping it twice a second). ``attempts`` gives up after that many failed
    attempts in a row (None: never). A broker that *refuses* what is replayed (a login, a
    subscription) is not tried again: the client gives up with its error.

    ``on_lost(error)`` is called when a connection that was up is lost (reconnecting
    starts), ``on_restored(Restored)`` when a new one has the old one's login and
    subscriptions. ``random`` draws the jitter (tests pass a fixed one).
    """

    initial: float = field(default=0.5, validator=_check_delay)
    factor: float = 2.0
    max_delay: float = field(default=30.0, validator=_check_delay)
    jitter: float = 0.5
    attempts: int | None = None
    on_lost: Callable[[BaseException], object] | None = field(default=None, eq=False, repr=False)
    on_restored: Callable[[Restored], object] | None = field(
        default=None, eq=False, repr=False
    )
    random: Callable[[], float] = field(default=random.random, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.factor >= 1:
            raise ValueError(f"factor must be 1 or more, not {self.factor!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, not {self.jitter!r}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be 1 or more (or None), not {self.attempts!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before the ``attempt``-th attempt (1: the first after a loss)."""
        try:
            base = self.initial * self.factor ** max(attempt - 1, 0)
        except OverflowError:
            base = self.max_delay
        base = min(base, self.max_delay)
        return base * (1.0 - self.jitter * self.random())


def reconnect_policy(value: Reconnect | bool | None) -> Reconnect | None:
    """A client's ``reconnect`` argument as a policy: True is :class:`Reconnect`'s defaults,
    None or False no reconnecting."""
    if value is True:
        return Reconnect()
    if value is None or value is False:
        return None
    if not isinstance(value, Reconnect):
        raise TypeError(f"reconnect is True, False, None or a Reconnect, not {value!r}")
    return value


def gives_up(error: BaseException) -> bool:
    """Whether a failed attempt ends reconnecting: the broker refused (a login, a
    subscription: any error that is not a connection's), or it is not the broker it was
    (its certificate no longer verifies). Lost, refused and timed-out connections are tried
    again."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return True
    return not isinstance(error, OSError) and not getattr(error, "transient", False)


class Backoff:
    """One client's reconnecting: ``failures`` (failed attempts in a row since the
    connection was lost), ``quick`` (connections lost soon after they were made, in a row)
    and what to replay (the lost session's :meth:`replay`, kept until an attempt restores
    it). Times are the driver's clock's."""

    def __init__(self, policy: Reconnect) -> None:
        self.policy = policy
        self.failures = 0
        self.quick = 0
        self.replay: Sequence[Replay] = ()
        self._up_since: float | None = None

    def up(self, now: float) -> None:
        """A connection is up (the first one, or a restored one)."""
        self._up_since = now

    def lost(self, replay: Sequence[Replay], now: float) -> float:
        """A connection that was up is lost: remember what to replay; the wait before the
        first attempt."""
        self.replay = tuple(replay)
        self.failures = 0
        up_since = self._up_since
        if up_since is not None and now - up_since < self.policy.max_delay:
            self.quick += 1
        else:
            self.quick = 0
        self._up_since = None
        return self.policy.delay(1 + self.quick)

    def failed(self) -> float | None:
        """An attempt failed: the wait before the next one, or None to give up."""
        self.failures += 1
        limit = self.policy.attempts
        if limit is not None and self.failures >= limit:
            return None
        return self.policy.delay(self.failures + 1 + self.quick)

    def restored(self, replayed: Sequence[Replay], now: float) -> Restored:
        """An attempt restored everything: the news for :attr:`Reconnect.on_restored`."""
        done = Restored(self.failures + 1, tuple(item.what for item in replayed))
        self.failures = 0
        self.replay = ()
        self.up(now)
        return done

    def tell_lost(self, error: BaseException) -> None:
        if self.policy.on_lost is not None:
            self.policy.on_lost(error)

    def tell_restored(self, restored: Restored) -> None:
        if self.policy.on_restored is not None:
            self.policy.on_restored(restored)
