"""Deciding a login, for :meth:`Broker.login` and :meth:`Broker.begin_login`: the throttle,
the scheme (which may answer later), the hub, the log and ``msgbroker_session_login``.

A scheme whose check is slow (``password``: a memory-hard hash, tens of milliseconds)
answers with a Deferred instead of blocking the reactor; the login is then decided when it
fires, on the reactor. While it is checked it holds one of its address's throttle tokens
(:meth:`~msgbroker.limits.LoginThrottle.checking`), so one address cannot have more
guesses checked at once than it may fail in a burst.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from .auth import Accept, AuthResult, Deny, LoginRequest

if TYPE_CHECKING:
    from .broker import Broker
    from .session import Session

log = Logger(namespace="msgbroker")


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
    if not throttle.allows(request.host, broker.reactor.seconds()):
        # too many failures from this address: refused unheard, logged rate-limited
        result: AuthResult = Deny("too many failed logins from this address")
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
    throttle.checking(request.host)  # holds a token while it is checked

    def answered(result: Any) -> None:
        throttle.checked(request.host)
        if not isinstance(result, Accept | Deny):
            log.error(
                "auth scheme {scheme} answered {result!r}", scheme=request.scheme, result=result
            )
            result = Deny("auth scheme answered no result")
        if session not in broker.sessions:  # gone meanwhile: nothing to log in
            if isinstance(result, Deny):
                throttle.failed(request.host, broker.reactor.seconds())
            return
        decided(login_decided(broker, session, request, result))

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
        broker.hub.login(session, result.identity)
        broker.batcher.flush()  # presence events of a kicked holder
    else:
        broker.login_throttle.failed(request.host, broker.reactor.seconds())
        log.info(
            "{protocol} login refused for {identity!r} from {host} ({scheme}): {reason}",
            protocol=request.protocol,
            identity=request.identity,
            host=request.host or "local",
            scheme=request.scheme,
            reason=result.reason,
        )
    if broker._login is not None:
        broker._login(session=session, request=request, result=result)
    return result
