"""Configuration: TOML file + command-line options -> one frozen :class:`BrokerConfig`.

The TOML file uses the long option names as keys (``secret-file`` or ``secret_file``);
repeatable options take a list or a single string. Options given on the command line
replace the file's value for that key.

Example::

    listen = ["ssmp=tcp:4444:interface=127.0.0.1", "ssmp=tls:4443"]
    auth = ["secret", "cert"]            # or, in an [auth] table: schemes = [...]
    secret-file = "/etc/msgbroker/secret"
    tls-cert = "/etc/msgbroker/server.pem"
    tls-key = "/etc/msgbroker/server.key"
    tls-ca = "/etc/msgbroker/clients-ca.pem"
    max-backlog = 1048576
    slow-consumer = "disconnect"

    [journal]                        # a plugin's section (the journal's, plugins/journal)
    directory = "/var/lib/msgbroker/journal"
    payloads = true

A plugin declares its section and options with ``msgbroker_register_config_sections``
(:class:`ConfigSection`): its keys go in the ``[name]`` table, and each option is also a
command-line option and a top-level key of its own (``--journal-payloads``,
``journal-payloads = true``: the option's *flag*, by default ``NAME-KEY``). The broker
turns a section's values into the plugin's frozen settings object
(:meth:`BrokerConfig.section`). Tables no plugin declares are kept as they are
(``config.sections["name"]``) for plugins that read them themselves.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from attrs import evolve, field, frozen

from .errors import ConfigError
from .nodes import check_node_name
from .options import Option, as_list, convert
from .sections import OPTION_TABLES, ConfigSection, check_sections

__all__ = [
    "OPTIONS",
    "BrokerConfig",
    "ConfigSection",
    "Listener",
    "Option",
    "build_config",
    "from_mapping",
    "load_file",
    "resolve_sections",
]

SLOW_CONSUMER_POLICIES = ("disconnect", "drop")

_Settings = TypeVar("_Settings")
LOG_LEVELS = ("debug", "info", "warn", "error")
#: text: twistd's lines; json: one JSON object per line (msgbroker.logs)
LOG_FORMATS = ("text", "json")


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
    log_format: str = "text"
    #: seconds connections get at shutdown to flush what they hold before they are cut
    shutdown_grace: float = 10.0
    #: this broker's name among several (``--node-name``, or ``[cluster] node-name``);
    #: None: the default, host name and first listener's port (:mod:`msgbroker.nodes`;
    #: ``Broker.node_name`` is the name in use)
    node_name: str | None = None
    #: the plugins' sections as given, section name -> key -> value: the TOML file's
    #: ``[name]`` tables and the plugins' options from the command line (or top-level keys),
    #: under their keys in the section. The broker turns each declared section into its
    #: settings object (:meth:`section`); tables no plugin declares stay here as they are.
    #: A value may also be the section's settings object itself (from Python).
    sections: Mapping[str, Any] = field(factory=dict)
    #: each declared section's settings object, made from ``sections`` by
    #: :func:`resolve_sections` (the broker does it when it is built); read it with
    #: :meth:`section`. Derived, so not compared.
    plugin_settings: Mapping[str, Any] = field(factory=dict, eq=False, repr=False)

    @property
    def is_default(self) -> bool:
        return not self.listeners

    @property
    def extra(self) -> Mapping[str, Any]:
        """The older name of :attr:`sections`."""
        return self.sections

    def section(self, name: str, kind: type[_Settings]) -> _Settings:
        """The settings object of the plugin section ``[name]``, checked to be a ``kind``
        (the settings class the plugin declared): what the TOML file and the command line
        said, over the class's defaults. Raises :class:`ConfigError` when no plugin declares
        the section (or the config was not resolved: the broker resolves its own)."""
        settings = self.plugin_settings.get(name)
        if settings is None:
            raise ConfigError(f"no plugin declares the configuration section [{name}]")
        if not isinstance(settings, kind):
            raise TypeError(f"the [{name}] settings are a {type(settings).__name__}, not {kind}")
        return settings

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
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"bad log-format {self.log_format!r}: choose one of {', '.join(LOG_FORMATS)}"
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
            ("shutdown-grace", self.shutdown_grace),
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
        if self.node_name is not None:
            check_node_name(self.node_name)
        if self.max_backlog < 0:
            raise ConfigError(f"max-backlog must be >= 0 bytes, not {self.max_backlog}")
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
    Option("log-format", "str", "text, or json: one JSON object per line [text]."),
    Option("shutdown-grace", "float", "Seconds connections get to flush at shutdown [10]."),
    Option("node-name", "str", "This broker's name among several nodes [HOST:PORT]."),
)
_BY_NAME = {option.name: option for option in OPTIONS}
KNOWN_KEYS = frozenset(_BY_NAME)


def from_mapping(
    values: Mapping[str, Any],
    base: BrokerConfig | None = None,
    sections: Sequence[ConfigSection[Any]] = (),
) -> BrokerConfig:
    """Apply ``values`` (option name -> value, dashes or underscores; a table -> a section)
    over ``base``. A plugin option's flag (of ``sections``) puts its value in its section;
    a section's key given here replaces the same key from ``base``. One key given twice
    here (a flag and its section's key) is an error."""
    changes: dict[str, Any] = {}
    tables: dict[str, Any] = dict(base.sections) if base else {}
    by_flag = {flag: (s, o) for s in sections for flag, o in s.flags().items()}
    declared = {s.name: s for s in sections}
    given: dict[tuple[str, str], str] = {}  # (section, key) -> how this layer spelled it

    def put(section: str, key: str, value: Any, spelled: str) -> None:
        if (section, key) in given:
            raise ConfigError(f"{given[section, key]} and {spelled} are one option: give it once")
        given[section, key] = spelled
        table = tables.get(section)
        # this layer's value replaces the key's, however the layer below spelled it
        kept = table.items() if isinstance(table, Mapping) else ()
        tables[section] = {**{k: v for k, v in kept if _key(k) != key}, key: value}

    spelled: dict[str, str] = {}  # broker option -> how this layer gave it

    def set_option(option: Option, value: Any, how: str) -> None:
        if option.name in spelled and spelled[option.name] != how:
            raise ConfigError(f"{spelled[option.name]} and {how} are one option: give it once")
        spelled[option.name] = how
        changes[option.field] = _convert_broker_option(option, value)

    for raw_key, value in values.items():
        if isinstance(value, Mapping) and _key(raw_key) in OPTION_TABLES:
            # [auth]: its schemes are the broker's option, the rest a plugin's section;
            # [cluster]: its node-name, and the rest the cluster engine's section
            taken = OPTION_TABLES[_key(raw_key)]
            for key, item in value.items():
                if _key(key) in taken:
                    set_option(_BY_NAME[taken[_key(key)]], item, f"[{raw_key}] {key}")
            value = {k: v for k, v in value.items() if _key(k) not in taken}  # noqa: PLW2901
            if not value:
                continue
        if isinstance(value, Mapping):  # a section's table
            if raw_key in declared:
                for key, item in value.items():
                    put(raw_key, _key(key), item, f"[{raw_key}] {key}")
            else:
                tables[raw_key] = value  # nobody declares it: kept as it is
            continue
        name = _key(raw_key)
        option = _BY_NAME.get(name)
        if option is not None:
            set_option(option, value, raw_key)
        elif name in by_flag:
            section, plugin_option = by_flag[name]
            put(section.name, plugin_option.name, value, raw_key)
        else:
            raise ConfigError(f"unknown configuration key {raw_key!r}")
    return evolve(base or BrokerConfig(), sections=tables, **changes)


def _key(key: Any) -> str:
    return str(key).replace("_", "-")


def resolve_sections(config: BrokerConfig, sections: Iterable[ConfigSection[Any]]) -> BrokerConfig:
    """``config`` with every declared section's settings object (``config.section(...)``),
    made from ``config.sections``; an unknown key or a bad value of a declared section is a
    :class:`ConfigError` naming it."""
    settings = {s.name: s.resolve(config.sections.get(s.name, {})) for s in sections}
    return evolve(config, plugin_settings=settings)


def _convert_broker_option(option: Option, value: Any) -> Any:
    if option.kind == "list" and option.name == "listen":
        return tuple(Listener.parse(v) for v in as_list(option.name, value))
    return convert(option.name, option.kind, value)


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


#: the plugin sections there are when the plugins ``plugins`` (module names) are loaded and
#: ``blocked`` are not (:func:`msgbroker.pluginmanager.declared_sections`)
SectionsOf = Callable[[Sequence[str], Sequence[str]], Sequence[ConfigSection[Any]]]


def _no_sections(plugins: Sequence[str], blocked: Sequence[str]) -> Sequence[ConfigSection[Any]]:
    return ()


def build_config(
    config_file: str | None, overrides: Mapping[str, Any], sections_of: SectionsOf = _no_sections
) -> BrokerConfig:
    """The file's values, then the command line's, validated, with the plugin sections
    resolved. Which sections there are depends on which plugins run, which the same file
    and command line say (``plugin``, ``no-plugin``): ``sections_of`` is asked for them."""
    file_values = load_file(config_file) if config_file else {}
    plugins = _last_given("plugin", file_values, overrides)
    blocked = _last_given("no-plugin", file_values, overrides)
    sections = check_sections(sections_of(plugins, blocked), KNOWN_KEYS)
    base = from_mapping(file_values, sections=sections)
    config = from_mapping(overrides, base, sections=sections).validate()
    return resolve_sections(config, sections)


def _last_given(name: str, *layers: Mapping[str, Any]) -> tuple[str, ...]:
    """A list option's value: the last layer that gives it wins, as :func:`from_mapping`
    applies them."""
    found: tuple[str, ...] = ()
    for layer in layers:
        for key, value in layer.items():
            if _key(key) == name:
                found = as_list(name, value)
    return found
