"""The ``open`` scheme: any identity, no credential (the credential is ignored).

Off unless enabled with ``--auth open``; the embedded default enables it for loopback peers
only. Enabling it on a listener that is not on loopback logs a warning.
"""

from __future__ import annotations

from collections.abc import Callable

from msgbroker import hookimpl
from msgbroker.auth import Accept, AuthResult, AuthScheme, LoginRequest


class OpenScheme:
    name = "open"

    def authenticate(self, request: LoginRequest) -> AuthResult:
        return Accept(request.identity)


@hookimpl
def msgbroker_register_auth_schemes(register: Callable[[AuthScheme], None]) -> None:
    register(OpenScheme())
