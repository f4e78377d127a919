"""Configuration: TOML file + command-line options -> one frozen :class:`BrokerConfig`.

The TOML file uses the long option names as keys (``secret-file`` or ``secret_file``);
repeatable options take a list or a single string. Options given on the command line
replace the file's value for that key.

Example::

    listen = ["ssmp=tcp:4444:interface=127.0.0.1", "ssmp=tls:4443"]
    auth = ["secret", "cert"]
    secret-file = "/etc/msgbroker/secret"
    tls-cert = "/etc/msgbroker/server.pem"
    tls-key = "/etc/msgbroker/server.key"
    tls-ca = "/etc/msgbroker/clients-ca.pem"
    max-backlog = 1048576
    slow-consumer = "disconnect"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

from attrs import evolve, field, frozen

from .errors import ConfigError

SLOW_CONSUMER_POLICIES = ("disconnect", "drop")


@frozen
class Listener:
    """One listening endpoint: ``protocol=endpoint`` on the command line."""

    protocol: str
    endpoint: str

    @classmethod
    def parse(cls, text: str) -> Listener:
        protocol, sep, endpoint = text.partition("=")
        if not sep or not protocol or not endpoint:
            raise ConfigError(
                f"bad listen value {text!r}: expected PROTOCOL=ENDPOINT, "
                "e.g. ssmp=tcp:4444:interface=127.0.0.1"
            )
        return cls(protocol.strip(), endpoint.strip())

    @property
    def is_tls(self) -> bool:
        return self.endpoint.startswith("tls:")

    def __str__(self) -> str:
        return f"{self.protocol}={self.endpoint}"


@frozen
class BrokerConfig:
    """Everything the broker is told. Empty ``listeners``/``auth`` mean the embedded default:
    every registered protocol on its default loopback endpoint, ``open`` login for loopback
    peers only."""

    listeners: tuple[Listener, ...] = ()
    auth: tuple[str, ...] = ()
    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    plugins: tuple[str, ...] = ()
    no_plugins: tuple[str, ...] = ()
    login_timeout: float = 10.0
    keepalive: float = 30.0
    #: generous by default: a healthy subscriber on a fresh connection (kernel buffers not
    #: yet grown) can fall a few MB behind a burst without being a stalled one
    max_backlog: int = 16 << 20
    slow_consumer: str = "disconnect"
    #: the journal (plugins/journal): where it writes (None: no journal), whether it keeps
    #: payload bytes, when it closes a segment (seconds, bytes), and how many records it
    #: holds in memory before it drops (and counts) new ones
    journal: str | None = None
    journal_payloads: bool = False
    journal_rotate_seconds: float = 10.0
    journal_rotate_bytes: int = 64 << 20
    journal_max_records: int = 1_000_000
    #: keys this module does not know, kept for plugins (``[plugin-name]`` tables)
    extra: Mapping[str, Any] = field(factory=dict)

    @property
    def is_default(self) -> bool:
        return not self.listeners

    def validate(self) -> BrokerConfig:
        if self.slow_consumer not in SLOW_CONSUMER_POLICIES:
            raise ConfigError(
                f"bad slow-consumer policy {self.slow_consumer!r}: "
                f"choose one of {', '.join(SLOW_CONSUMER_POLICIES)}"
            )
        for name, value in (("login-timeout", self.login_timeout), ("keepalive", self.keepalive)):
            if not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, not {value}")
        if self.max_backlog < 0:
            raise ConfigError(f"max-backlog must be >= 0 bytes, not {self.max_backlog}")
        if not self.journal_rotate_seconds > 0:
            raise ConfigError(
                f"journal-rotate-seconds must be positive, not {self.journal_rotate_seconds}"
            )
        for name, size in (
            ("journal-rotate-bytes", self.journal_rotate_bytes),
            ("journal-max-records", self.journal_max_records),
        ):
            if size < 1:
                raise ConfigError(f"{name} must be at least 1, not {size}")
        if any(listener.is_tls for listener in self.listeners) and not (
            self.tls_cert and self.tls_key
        ):
            raise ConfigError("a TLS listener needs --tls-cert and --tls-key")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_ca and not self.tls_cert:
            raise ConfigError("--tls-ca needs --tls-cert and --tls-key")
        if "secret" in self.auth and not self.secret_file:
            raise ConfigError("the secret scheme needs --secret-file")
        return self


_LIST_KEYS = {"listen": "listeners", "auth": "auth", "plugin": "plugins", "no-plugin": "no_plugins"}
_STR_KEYS = {"secret-file", "tls-cert", "tls-key", "tls-ca", "slow-consumer", "journal"}
_FLOAT_KEYS = {"login-timeout", "keepalive", "journal-rotate-seconds"}
_INT_KEYS = {"max-backlog", "journal-rotate-bytes", "journal-max-records"}
_BOOL_KEYS = {"journal-payloads"}
KNOWN_KEYS = frozenset(_LIST_KEYS) | _STR_KEYS | _FLOAT_KEYS | _INT_KEYS | _BOOL_KEYS


def _as_list(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{key} must be a string or a list of strings")


def from_mapping(values: Mapping[str, Any], base: BrokerConfig | None = None) -> BrokerConfig:
    """Apply ``values`` (option name -> value, dashes or underscores) over ``base``."""
    changes: dict[str, Any] = {}
    extra: dict[str, Any] = dict(base.extra) if base else {}
    for raw_key, value in values.items():
        key = raw_key.replace("_", "-")
        if isinstance(value, dict):
            extra[raw_key] = value  # a plugin's table
            continue
        if key in _LIST_KEYS:
            items = _as_list(key, value)
            if key == "listen":
                changes["listeners"] = tuple(Listener.parse(v) for v in items)
            else:
                changes[_LIST_KEYS[key]] = items
        elif key in _STR_KEYS:
            if not isinstance(value, str):
                raise ConfigError(f"{key} must be a string, not {value!r}")
            changes[key.replace("-", "_")] = value
        elif key in _FLOAT_KEYS:
            try:
                changes[key.replace("-", "_")] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{key} must be a number of seconds, not {value!r}") from None
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false, not {value!r}")
            changes[key.replace("-", "_")] = value
        elif key in _INT_KEYS:
            try:
                changes[key.replace("-", "_")] = _parse_size(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{key} must be a number of bytes, not {value!r}") from None
        else:
            raise ConfigError(f"unknown configuration key {raw_key!r}")
    return evolve(base or BrokerConfig(), extra=extra, **changes)


def _parse_size(value: Any) -> int:
    """Bytes, as an int or a string with an optional K/M/G suffix (powers of 1024)."""
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, int):
        return value
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    if scale != 1:
        text = text[:-1]
    return int(text) * scale


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def build_config(config_file: str | None, overrides: Mapping[str, Any]) -> BrokerConfig:
    """The file's values, then the command line's, validated."""
    base = from_mapping(load_file(config_file)) if config_file else BrokerConfig()
    return from_mapping(overrides, base).validate()
