"""Authentication: the scheme interface, the login request a scheme judges, and results.

A scheme is an object with a ``name`` and an ``authenticate(request)`` method returning
:class:`Accept` or :class:`Deny` — or, for a scheme whose check is slow (``password``
hashes a password for tens of milliseconds), a Twisted ``Deferred`` that fires with one
later, so that the reactor never waits for it (:meth:`msgbroker.Broker.begin_login`).
Plugins register schemes through the ``msgbroker_register_auth_schemes`` hook; the
built-in ``open``, ``secret`` and ``cert`` schemes, and ``password`` (the users plugin),
are plugins like any other (``msgbroker.plugins.auth``, ``msgbroker.plugins.users``).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Protocol

from attrs import frozen

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from .config import BrokerConfig


@frozen
class LoginRequest:
    """One login attempt, whatever the protocol.

    ``tls_names`` holds the names a verified client certificate proves (its Common Name and
    DNS/email Subject Alternative Names), or ``None`` when the connection has no verified
    certificate. ``host`` is the peer's address (``""`` when unknown, e.g. a unix socket).
    """

    protocol: str
    identity: str
    scheme: str
    credential: bytes | None
    host: str
    tls_names: frozenset[str] | None = None

    @property
    def is_loopback(self) -> bool:
        """True for 127.0.0.0/8, ::1 and local (unix) sockets."""
        if not self.host:
            return True
        try:
            return ipaddress.ip_address(self.host.split("%")[0]).is_loopback
        except ValueError:
            return False


@frozen
class Accept:
    """Login accepted for ``identity``."""

    identity: str


@frozen
class Deny:
    """Login refused; ``reason`` is for the log, never sent to the peer."""

    reason: str


AuthResult = Accept | Deny


class AuthScheme(Protocol):
    """An authentication scheme, such as ``secret``.

    A scheme may also have an ``implied_by(config) -> bool`` method: True when ``config``
    enables it without ``--auth`` naming it (``password`` with ``--users``, as ``cert`` is
    with a TLS listener and ``--tls-ca``)."""

    #: the scheme's name as it appears on the wire (1+ SSMP ID characters)
    name: str

    def authenticate(self, request: LoginRequest) -> AuthResult | Deferred[AuthResult]:
        """Judge ``request`` (its ``scheme`` is this scheme's name): the result, or a
        Deferred that fires with it (never fails: a scheme that cannot decide denies)."""


def implied_by(scheme: AuthScheme, config: BrokerConfig) -> bool:
    """Whether ``config`` enables ``scheme`` without ``--auth`` naming it."""
    implied = getattr(scheme, "implied_by", None)
    return bool(implied(config)) if implied is not None else False
