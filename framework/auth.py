"""Authentication: the scheme interface, the login request a scheme judges, and results.

A scheme is an object with a ``name`` and an ``authenticate(request)`` method returning
:class:`Accept` or :class:`Deny`. Plugins register schemes through the
``msgbroker_register_auth_schemes`` hook; the built-in ``open``, ``secret`` and ``cert``
schemes are plugins like any other (``msgbroker.plugins.auth``).
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from attrs import frozen


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
    """An authentication scheme, such as ``secret``."""

    #: the scheme's name as it appears on the wire (1+ SSMP ID characters)
    name: str

    def authenticate(self, request: LoginRequest) -> AuthResult:
        """Judge ``request`` (its ``scheme`` is this scheme's name)."""
