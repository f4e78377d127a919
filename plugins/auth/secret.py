"""The ``secret`` scheme: a pre-shared secret, compared in constant time.

The secret is the contents of ``--secret-file`` with one trailing newline stripped; it is
read when the broker starts, and again on SIGHUP (a file that cannot be used refuses the
reload, and the old secret stays).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.auth import Accept, AuthResult, AuthScheme, Deny, LoginRequest
from msgbroker.config import BrokerConfig
from msgbroker.errors import ConfigError

if TYPE_CHECKING:
    from msgbroker import Broker


def read_secret(path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read secret file {path}: {e.strerror}") from None
    secret = data.removesuffix(b"\n").removesuffix(b"\r")
    if not secret:
        raise ConfigError(f"secret file {path} is empty")
    return secret


class SecretScheme:
    name = "secret"

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret

    def authenticate(self, request: LoginRequest) -> AuthResult:
        if self.secret is None:
            return Deny("no secret configured")
        if request.credential is None:
            return Deny("no credential")
        if hmac.compare_digest(request.credential, self.secret):
            return Accept(request.identity)
        return Deny("wrong secret")


#: where a broker keeps its secret scheme (``broker.plugins.state``)
STATE = "auth-secret.scheme"


@hookimpl
def msgbroker_register_auth_schemes(
    register: Callable[[AuthScheme], None], config: BrokerConfig, broker: Broker
) -> None:
    secret = read_secret(config.secret_file) if config.secret_file else None
    register(broker.plugins.state(STATE, lambda: SecretScheme(secret)))


@hookimpl
def msgbroker_reload(broker: Broker, config: BrokerConfig) -> Callable[[], None] | None:
    scheme = broker.plugins.state(STATE, lambda: None)
    if not isinstance(scheme, SecretScheme):
        return None
    secret = read_secret(config.secret_file) if config.secret_file else None

    def commit() -> None:
        scheme.secret = secret

    return commit
