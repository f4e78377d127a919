"""What plugins register with a broker when it is made — wire protocols
(:class:`ProtocolSpec`), auth schemes, cluster engines — and which of them a configuration
picks: the auth schemes it enables, the engine ``--cluster`` names.

Split out of :mod:`msgbroker.broker`, which fills its ``protocols``, ``schemes`` and
``engines`` through these at start and asks for the enabled schemes again on a reload
(:mod:`msgbroker.reloading`). ``msgbroker`` exports :class:`ProtocolSpec`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from attrs import frozen
from twisted.logger import Logger

from .auth import AuthScheme, implied_by
from .config import BrokerConfig, Listener
from .connection import StreamFactory
from .engine import ClusterSettings, EngineSpec, redact_url, url_scheme
from .errors import ConfigError

if TYPE_CHECKING:
    from .broker import Broker
    from .connection import ServerSession

__all__ = ["ProtocolSpec", "add_by_name", "add_engine", "enabled_schemes", "engine_for"]

log = Logger(namespace="msgbroker")


@frozen
class ProtocolSpec:
    """A wire protocol, as a plugin registers it (``msgbroker_register_protocols``)."""

    #: the name ``--listen NAME=ENDPOINT`` uses
    name: str
    #: ``build_factory(broker, listener)`` -> a Twisted protocol factory for one listener;
    #: ``None``: ``session`` served over stream endpoints (tcp, tls, unix)
    build_factory: Callable[[Broker, Listener], Any] | None = None
    #: where the embedded default configuration listens, or ``None``
    default_endpoint: str | None = None
    description: str = ""
    #: ``build_endpoint(reactor, endpoint_text)`` -> a server endpoint, for a protocol
    #: whose listeners are no Twisted endpoint string (sbus: unix seqpacket sockets);
    #: ``None``: ``twisted.internet.endpoints.serverFromString``
    build_endpoint: Callable[[Any, str], Any] | None = None
    #: the protocol's server session (``msgbroker.connection.ServerSession``): what serves
    #: one connection, sans-IO
    session: type[ServerSession] | None = None

    def factory(self, broker: Broker, listener: Listener) -> Any:
        """The Twisted protocol factory for one of this protocol's listeners."""
        if self.build_factory is not None:
            return self.build_factory(broker, listener)
        if self.session is None:
            raise ConfigError(f"protocol {self.name!r} has neither a session nor a factory")
        return StreamFactory(broker, self.session)


class Named(Protocol):
    """A protocol or an auth scheme: registered under its name."""

    @property
    def name(self) -> str: ...


NamedT = TypeVar("NamedT", bound=Named)


def add_by_name(table: dict[str, NamedT], what: str) -> Callable[[NamedT], None]:
    """The ``register`` a registration hook is called with: it adds to ``table`` under
    the item's name; ConfigError when two plugins register one name (``what``: protocol,
    auth scheme)."""

    def register(item: NamedT) -> None:
        if item.name in table:
            raise ConfigError(f"two plugins register the {what} {item.name!r}")
        table[item.name] = item

    return register


def add_engine(engines: dict[str, EngineSpec]) -> Callable[[EngineSpec], None]:
    """``register`` for ``msgbroker_register_engines``: an engine under each of its URL
    schemes; ConfigError when two plugins register one scheme."""

    def register(spec: EngineSpec) -> None:
        for scheme in spec.schemes:
            if scheme in engines:
                raise ConfigError(f"two plugins register the engine URL scheme {scheme!r}")
            engines[scheme] = spec

    return register


def engine_for(engines: dict[str, EngineSpec], settings: ClusterSettings) -> EngineSpec | None:
    """The engine ``--cluster`` picks (None: the memory engine, a lone node); ConfigError
    for a scheme no plugin registers."""
    scheme = url_scheme(settings.url)
    spec = engines.get(scheme)
    if spec is None and scheme != "memory":
        known = ", ".join(sorted(engines)) or "none"
        raise ConfigError(
            f"no engine for --cluster {redact_url(settings.url)!r} (URL schemes: {known})"
        )
    return spec


def enabled_schemes(
    config: BrokerConfig,
    schemes: dict[str, AuthScheme],
    listeners: Iterable[Listener],
    warn: bool = True,
) -> tuple[str, ...]:
    """The auth schemes ``config`` enables among ``schemes`` (for a broker with these
    ``listeners``); ConfigError for one that is unknown or cannot work (``cert`` without
    ``--tls-ca``). ``warn``: log that TLS listeners without ``--tls-ca`` offer no ``cert``
    (once, at start; not on every reload)."""
    names = list(config.auth or ("open",))
    # SSMP: "All servers that accept connections over TLS MUST allow authentication
    # through client certificates."
    # It needs a CA to verify certificates against: without --tls-ca none is requested.
    has_tls = any(listener.is_tls for listener in listeners)
    if has_tls and config.tls_ca and "cert" not in names:
        names.append("cert")
    elif "cert" in names and not config.tls_ca:
        raise ConfigError("the cert scheme needs --tls-ca to verify client certificates")
    elif has_tls and not config.tls_ca and warn:
        log.warn(
            "TLS listeners without --tls-ca: client certificates cannot be verified, "
            "so the cert login scheme is not offered"
        )
    # a scheme its own settings enable (password with --users)
    names += [name for name, scheme in schemes.items() if implied_by(scheme, config)]
    for name in names:
        if name not in schemes:
            known = ", ".join(sorted(schemes)) or "none"
            raise ConfigError(f"unknown auth scheme {name!r} (available: {known})")
    return tuple(dict.fromkeys(names))
