"""The NATS engine's URL: ``nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]``, ``tls://`` or
``nats+tls://`` for TLS (port 4222 by default). The password (or token) may come from the
``[cluster]`` password options instead: with a user in the URL it is that user's password,
without one it is a token. Secrets never reach a log: :attr:`NatsAddress.redacted` is the
URL without them (a token, unlike a Redis user name, is a secret)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from attrs import field, frozen

from msgbroker import ConfigError

SCHEMES = ("nats", "tls", "nats+tls")
DEFAULT_PORT = 4222


@frozen
class NatsAddress:
    host: str
    port: int
    tls: bool
    redacted: str
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def credentials(self) -> dict[str, Any]:
        """CONNECT's fields for them."""
        if self.user is not None:
            return {"user": self.user, "pass": self.password or ""}
        if self.token is not None:
            return {"auth_token": self.token}
        return {}


def redact(url: str) -> str:
    """``url`` with its password or token as ``***``."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        host = f"{host}:{port}"
    user = "***" if parts.password is None else f"{parts.username or ''}:***"
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def parse_url(url: str, password: str | None) -> NatsAddress:
    """``url`` read; ``password`` from the ``[cluster]`` options (``None``: none given)."""
    parts = urlsplit(url)
    redacted = redact(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"not a NATS URL: {redacted!r}")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"bad NATS URL {redacted!r}") from None
    if parts.path.strip("/") or parts.query:
        raise ConfigError(f"a NATS URL has no path or query: {redacted!r}")
    user = unquote(parts.username) if parts.username else None
    secret = password if password is not None else (
        unquote(parts.password) if parts.password is not None else None
    )
    token = None
    if user is not None and secret is None:
        user, token = None, user  # nats://TOKEN@host
    elif user is None and secret is not None:
        token, secret = secret, None
    return NatsAddress(
        host=parts.hostname or "127.0.0.1",
        port=port,
        tls=scheme != "nats",
        redacted=redacted,
        user=user,
        password=secret,
        token=token,
    )
