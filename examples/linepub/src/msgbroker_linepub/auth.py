"""The ``token`` login scheme: a per-identity token from ``[linepub] token-file``, compared
in constant time. Registered like the built-in schemes; enable it with ``--auth token``.
It serves every protocol, not only linepub (``LOGIN alice token s3cret`` in SSMP)."""

from __future__ import annotations

import hmac

from msgbroker import Accept, Deny, LoginRequest
from msgbroker.auth import AuthResult


class TokenScheme:
    name = "token"

    def __init__(self, tokens: dict[str, bytes]) -> None:
        self._tokens = tokens

    def authenticate(self, request: LoginRequest) -> AuthResult:
        expected = self._tokens.get(request.identity)
        if expected is None or request.credential is None:
            return Deny("no token for this identity")
        if hmac.compare_digest(expected, request.credential):
            return Accept(request.identity)
        return Deny("wrong token")
