"""The ``password`` scheme: an identity and its password, checked against the password file.

Checking an argon2 hash takes tens of milliseconds of CPU on purpose, so it never runs on
the reactor: :class:`Verifier` runs it in a small thread pool of its own on the broker's
reactor (argon2 releases the GIL while it hashes) and the scheme answers with a Deferred
(:meth:`msgbroker.Broker.begin_login`). On a reactor without threads (a test's ``Clock``)
it checks at once.

The answer never tells an unknown identity from a wrong password, in what it says or in how
long it takes: an unknown identity's password is checked against a hash of a random
password made with the same parameters. The log (the broker's, not the client's) says which.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from msgbroker.auth import Accept, AuthResult, Deny, LoginRequest
from msgbroker.config import BrokerConfig

from . import passwords
from .settings import users_settings

#: at most this many passwords checked or waiting to be, in all; more are refused at once.
#: Each waiting check is a connection's one login, so connections (--max-connections, 10,000
#: by default) bound it too; this bounds it where they are not limited. A check costs about
#: 30 ms of a core: 10,000 waiting is minutes of work, past any login timeout
MAX_PENDING = 10_000


class Verifier:
    """Checks passwords off the reactor: ``threads`` at a time (one core each), at most
    ``max_pending`` checked or waiting; the rest are refused (None) without a check, so
    a flood of logins costs neither the reactor's time nor unbounded memory."""

    def __init__(self, reactor: Any, threads: int | None = None, max_pending: int = MAX_PENDING):
        self.reactor = reactor
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        self.max_pending = max_pending
        self.pending = 0
        self._pool: ThreadPool | None = None

    @property
    def in_threads(self) -> bool:
        return IReactorThreads.providedBy(self.reactor)

    def __call__(self, hashed: str, password: bytes) -> bool | Deferred[bool] | None:
        """Whether ``password`` matches ``hashed``: at once on a reactor without threads,
        else a Deferred; None when too many checks are under way already."""
        if not self.in_threads:
            return passwords.verify(hashed, password)
        if self.pending >= self.max_pending:
            return None
        self.pending += 1
        checked: Deferred[bool] = deferToThreadPool(
            self.reactor, self._started(), passwords.verify, hashed, password
        )

        def done(result: Any) -> Any:
            self.pending -= 1
            return result

        return checked.addBoth(done)

    def _started(self) -> ThreadPool:
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPool(0, self.threads, name="msgbroker-users")
            pool.start()
            self.reactor.addSystemEventTrigger("during", "shutdown", self.stop)
        return pool

    def stop(self) -> None:
        """Stop the threads (after the checks they are running)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()


_dummy_hash: str | None = None


def dummy_hash() -> str:
    """A hash of a random password, made once, with the parameters new hashes get."""
    global _dummy_hash
    if _dummy_hash is None:
        _dummy_hash = passwords.hash_password(os.urandom(16))
    return _dummy_hash


class PasswordScheme:
    """``password``: the credential is the identity's password in the ``--users`` file."""

    name = "password"

    def __init__(self, users: dict[str, str] | None, verifier: Verifier) -> None:
        #: identity -> hash, or None without ``--users``; a reload replaces it
        self.users = users
        self.verifier = verifier
        self.dummy = dummy_hash() if users is not None else ""

    def implied_by(self, config: BrokerConfig) -> bool:
        """``--users`` enables the scheme without ``--auth password``."""
        return users_settings(config).users is not None

    def replace_users(self, users: dict[str, str]) -> None:
        if not self.dummy:
            self.dummy = dummy_hash()
        self.users = users

    def authenticate(self, request: LoginRequest) -> AuthResult | Deferred[AuthResult]:
        users = self.users
        if users is None:
            return Deny("no password file (--users)")
        password = request.credential
        if not password:
            return Deny("no password")
        hashed = users.get(request.identity)
        known = hashed is not None

        def judge(right: bool) -> AuthResult:
            if right and known:
                return Accept(request.identity)
            return Deny("wrong password" if known else "unknown identity")

        checked = self.verifier(hashed if hashed is not None else self.dummy, password)
        if checked is None:
            return Deny("too many passwords being checked at once")
        if isinstance(checked, bool):
            return judge(checked)
        return checked.addCallback(judge)
