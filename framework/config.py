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
LOG_LEVELS = ("debug", "info", "warn", "error")


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
    #: limits (docs/operations.md, "Limits"); for counts and rates 0 means no limit.
    #: all slow consumers' queued output together; past it the largest backlogs are cut
    max_output: int = 256 << 20
    #: topics, patterns and filtered subscriptions one connection may hold
    max_subscriptions: int = 10_000
    #: distinct topics in the broker
    max_topics: int = 100_000
    max_connections: int = 10_000
    max_connections_per_address: int = 1_000
    #: failed logins per peer address per second; further attempts are refused unheard
    login_attempts: float = 5.0
    #: a refused login is answered this late, so one connection cannot try fast
    login_failure_delay: float = 1.0
    #: the largest frame (or WebSocket request head, or handshake) before login
    prelogin_max_frame: int = 16 << 10
    #: bytes one Micromessage2 queue group holds for members without a free ack window
    mm2_queue_backlog: int = 16 << 20
    #: how long sbus ``blocking/*/block`` may pause a publisher before the slow client's
    #: fallback (its hard policy: cut or discard) applies
    block_timeout: float = 1.0
    #: the accept backlog of every listener (the kernel caps it at net.core.somaxconn)
    listen_backlog: int = 1024
    log_level: str = "info"
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
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"bad log-level {self.log_level!r}: choose one of {', '.join(LOG_LEVELS)}"
            )
        for name, value in (
            ("login-timeout", self.login_timeout),
            ("keepalive", self.keepalive),
            ("block-timeout", self.block_timeout),
        ):
            if not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, not {value}")
        for name, value in (
            ("max-output", self.max_output),
            ("max-subscriptions", self.max_subscriptions),
            ("max-topics", self.max_topics),
            ("max-connections", self.max_connections),
            ("max-connections-per-address", self.max_connections_per_address),
            ("login-attempts", self.login_attempts),
            ("login-failure-delay", self.login_failure_delay),
        ):
            if value < 0:
                raise ConfigError(f"{name} must be 0 or more, not {value}")
        for name, size in (
            ("prelogin-max-frame", self.prelogin_max_frame),
            ("mm2-queue-backlog", self.mm2_queue_backlog),
            ("listen-backlog", self.listen_backlog),
        ):
            if size < 1:
                raise ConfigError(f"{name} must be at least 1, not {size}")
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


@frozen
class Option:
    """One setting: its option/TOML name, its kind, and its help line (tap.py builds the
    ``twistd msgbroker`` options from :data:`OPTIONS`, so a setting is declared once)."""

    name: str
    #: ``list`` (repeatable), ``str``, ``float`` (seconds or a rate), ``size`` (bytes, K/M/G
    #: suffixes), ``count`` (a whole number), ``bool`` (a flag)
    kind: str
    help: str
    #: the BrokerConfig attribute (the name with underscores by default)
    attribute: str = ""

    @property
    def field(self) -> str:
        return self.attribute or self.name.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("listen", "list", "PROTOCOL=ENDPOINT to listen on, repeatable.", "listeners"),
    Option("auth", "list", "Enable an auth scheme, repeatable: open, secret, cert, a plugin's."),
    Option("plugin", "list", "Load a plugin module by import name, repeatable.", "plugins"),
    Option("no-plugin", "list", "Block a plugin by name, repeatable.", "no_plugins"),
    Option("secret-file", "str", "File holding the shared secret of the secret scheme."),
    Option("tls-cert", "str", "Server certificate (PEM) for TLS listeners."),
    Option("tls-key", "str", "Server private key (PEM) for TLS listeners."),
    Option("tls-ca", "str", "CA certificate(s) (PEM) that client certificates must chain to."),
    Option("login-timeout", "float", "Seconds a connection may take to log in [10]."),
    Option("keepalive", "float", "Seconds of silence before the broker pings [30]."),
    Option("max-backlog", "size", "Bytes queued for one slow consumer before its policy [16M]."),
    Option("slow-consumer", "str", "Policy past the backlog: disconnect or drop [disconnect]."),
    Option("max-output", "size", "Bytes queued for all slow consumers together [256M]; 0: none."),
    Option("max-subscriptions", "count", "Topics, patterns, filters per connection [10000]."),
    Option("max-topics", "count", "Topics in the broker [100000]; 0: no limit."),
    Option("max-connections", "count", "Open connections in all [10000]; 0: no limit."),
    Option("max-connections-per-address", "count", "Connections from one address [1000]."),
    Option("login-attempts", "float", "Failed logins per address per second [5]; 0: no limit."),
    Option("login-failure-delay", "float", "Seconds before a refused login is answered [1]."),
    Option("prelogin-max-frame", "size", "Largest frame or header before login [16K]."),
    Option("mm2-queue-backlog", "size", "Bytes a Micromessage2 queue group holds [16M]."),
    Option("block-timeout", "float", "Seconds sbus block may pause a publisher [1]."),
    Option("listen-backlog", "count", "Pending connections each listener queues [1024]."),
    Option("log-level", "str", "debug, info, warn or error [info]."),
    Option("journal", "str", "Write the journal of routed messages and sessions there."),
    Option("journal-payloads", "bool", "Keep payload bytes in the journal."),
    Option("journal-rotate-seconds", "float", "Close a journal segment after this long [10]."),
    Option("journal-rotate-bytes", "size", "Close a journal segment at about this size [64M]."),
    Option("journal-max-records", "count", "Records held before new ones are dropped [1000000]."),
)
_BY_NAME = {option.name: option for option in OPTIONS}
KNOWN_KEYS = frozenset(_BY_NAME)


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
        if isinstance(value, dict):
            extra[raw_key] = value  # a plugin's table
            continue
        option = _BY_NAME.get(raw_key.replace("_", "-"))
        if option is None:
            raise ConfigError(f"unknown configuration key {raw_key!r}")
        changes[option.field] = _convert(option, value)
    return evolve(base or BrokerConfig(), extra=extra, **changes)


def _convert(option: Option, value: Any) -> Any:
    key, kind = option.name, option.kind
    if kind == "list":
        items = _as_list(key, value)
        return tuple(Listener.parse(v) for v in items) if key == "listen" else items
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, not {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, not {value!r}")
        return value
    what = {"float": "a number", "count": "a whole number"}.get(kind, "a number of bytes")
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be {what}, not {value!r}")
    try:
        if kind == "float":
            return float(value)
        if kind == "count":
            return int(value)
        return _parse_size(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be {what}, not {value!r}") from None


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
