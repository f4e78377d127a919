"""The ``cert`` scheme: the identity must be a name the verified client certificate proves
(its Common Name, or a DNS or email Subject Alternative Name), optionally followed by
``/`` and one or more SSMP ID characters, so one certificate can open several connections.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from msgbroker import hookimpl
from msgbroker.auth import Accept, AuthResult, AuthScheme, Deny, LoginRequest

_SUFFIX = re.compile(r"[A-Za-z0-9.:@/_\-+=~]+")


def identity_matches(identity: str, names: frozenset[str]) -> bool:
    if identity in names:
        return True
    # "name/suffix": the name itself may contain "/", so try every split point
    start = 0
    while (slash := identity.find("/", start)) >= 0:
        if identity[:slash] in names and _SUFFIX.fullmatch(identity[slash + 1 :]):
            return True
        start = slash + 1
    return False


class CertScheme:
    name = "cert"

    def authenticate(self, request: LoginRequest) -> AuthResult:
        if request.tls_names is None:
            return Deny("no verified client certificate")
        if identity_matches(request.identity, request.tls_names):
            return Accept(request.identity)
        return Deny(f"certificate does not name {request.identity!r}")


@hookimpl
def msgbroker_register_auth_schemes(register: Callable[[AuthScheme], None]) -> None:
    register(CertScheme())
