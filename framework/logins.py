"""Deciding a login, for :meth:`Broker.login` and :meth:`Broker.begin_login`: the throttle,
the scheme (which may answer later), the hub, the log and ``msgbroker_session_login``.

A scheme whose check is slow (``password``: a memory-hard hash, tens of milliseconds)
answers with a Deferred instead of blocking the reactor; the login is then decided when it
fires, on the reactor. While it is checked it holds one of its address's throttle tokens
(:meth:`~msgbroker.limits.LoginThrottle.checking`), so one address cannot have more
guesses checked at once than it may fail in a burst; a login from an address whose tokens
are all held waits (:class:`WaitingLogins`) until a check ends, so a burst of honest
clients behind one address is served in turn, never refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from .auth import Accept, AuthResult, Deny, LoginRequest

if TYPE_CHECKING:
    from .broker import Broker
    from .session import Session

log = Logger(namespace="msgbroker")

#: logins from one address that may wait for a check to end; more are refused unheard
MAX_WAITING = 10_000


class WaitingLogins:
    """Per address, the logins waiting for one of its checks under way to end."""

    def __init__(self) -> None:
        self._by_host: dict[str, deque[tuple[Session, Callable[[], None]]]] = {}

    def add(self, host: str, session: Session, start: Callable[[], None]) -> bool:
        """Keep ``start`` for later; False when the address has too many waiting."""
        waiting = self._by_host.setdefault(host, deque())
        if len(waiting) >= MAX_WAITING:
            return False
        waiting.append((session, start))
        return True

    def next(self, host: str, broker: Broker) -> None:
        """A check from ``host`` ended: start the waiting logins whose sessions are still
        open, oldest first, until the checks under way hold every token again (a login
        refused meanwhile by an empty bucket is answered at once, as any would be)."""
        waiting = self._by_host.get(host)
        throttle = broker.login_throttle
        while waiting:
            now = broker.reactor.seconds()
            if throttle.allows(host, now) and not throttle.room(host, now):
                break
            session, start = waiting.popleft()
            if session in broker.sessions:
                start()
        if not waiting:
            self._by_host.pop(host, None)


def start_login(
    broker: Broker,
    session: Session,
    request: LoginRequest,
    decided: Callable[[AuthResult], None],
    wait: bool,
) -> None:
    """Decide ``request`` and call ``decided(result)`` once (see
    :meth:`Broker.begin_login`); without ``wait``, at once: a scheme that answers later is
    refused."""
    throttle = broker.login_throttle
    host, now = request.host, broker.reactor.seconds()
    allowed = throttle.allows(host, now)
    if allowed and wait and not throttle.room(host, now):
        # its address's checks under way hold every token it has: wait for one to end

        def start() -> None:
            start_login(broker, session, request, decided, wait)

        if broker.waiting_logins.add(host, session, start):
            return
        allowed = False
    if not allowed:
        # too many failures from this address: refused unheard, logged rate-limited
        result: AuthResult = Deny("too many failed logins from this address")
        broker.counters.login_failures += 1
        broker.limited("login-attempts", f"refused a login from {request.host or 'local'}")
        if broker._login is not None:
            broker._login(session=session, request=request, result=result)
        decided(result)
        return
    try:
        outcome = broker.authenticate(request)
    except Exception:
        log.failure("auth scheme {scheme} failed", scheme=request.scheme)
        outcome = Deny("auth scheme raised")
    if isinstance(outcome, Accept | Deny):
        decided(login_decided(broker, session, request, outcome))
        return
    if not wait:
        outcome.addErrback(lambda _: None)
        outcome.cancel()
        refused = Deny(f"the {request.scheme} scheme answers later: use Broker.begin_login")
        decided(login_decided(broker, session, request, refused))
        return
    throttle.checking(host)  # holds a token while it is checked

    def answered(result: Any) -> None:
        throttle.checked(host)
        if not isinstance(result, Accept | Deny):
            log.error(
                "auth scheme {scheme} answered {result!r}", scheme=request.scheme, result=result
            )
            result = Deny("auth scheme answered no result")
        if session in broker.sessions:
            decided(login_decided(broker, session, request, result))
        elif isinstance(result, Deny):  # gone meanwhile: nothing to log in, but it counts
            broker.counters.login_failures += 1
            throttle.failed(host, broker.reactor.seconds())
        broker.waiting_logins.next(host, broker)

    def failed(failure: Failure) -> None:
        log.failure("auth scheme {scheme} failed", failure, scheme=request.scheme)
        answered(Deny("auth scheme failed"))

    outcome.addCallbacks(answered, failed)


def login_decided(
    broker: Broker, session: Session, request: LoginRequest, result: AuthResult
) -> AuthResult:
    """Act on a decided login: register the identity (accepted) or count and log the
    failure (refused); then ``msgbroker_session_login``."""
    if isinstance(result, Accept):
        broker.counters.logins += 1
        broker.hub.login(session, result.identity)
        broker.batcher.flush()  # presence events of a kicked holder
    else:
        broker.counters.login_failures += 1
        now = broker.reactor.seconds()
        broker.login_throttle.failed(request.host, now)
        # one line per address per 10 s: the first refusal, then how many followed
        host = request.host or "local"
        broker.rate_limited_log(
            f"login-refused {host}",
            now,
            f"{request.protocol} login refused for {request.identity!r} from {host} "
            f"({request.scheme}): {result.reason}",
        )
    if broker._login is not None:
        broker._login(session=session, request=request, result=result)
    return result
