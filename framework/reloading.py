"""A reload (SIGHUP): what the framework itself takes from a configuration read again, and
what waits for the next start.

:meth:`msgbroker.Broker.reload` runs in two steps, so that a bad file changes nothing: every
participant first reads and checks what it needs (raising
:class:`~msgbroker.errors.ConfigError` to refuse), and only when all have accepted does each
put its new settings in place. The framework is the first participant (:func:`prepare`);
the plugins follow through ``msgbroker_reload``.

Settings read where they are used (the login timeout, the keepalive, the login failure
delay, the pre-login frame bound, sbus's block timeout) apply from the reload on, to new
connections or new logins. Settings that shaped what was built at start (listeners, the
plugins, the output policy and budget, the listen backlog, queue groups' backlog, the node
name) keep their
running values: :data:`RESTART_ONLY`, and one log line names those that changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from attrs import evolve

from .config import BrokerConfig
from .tls import ServerTLS
from .topics import HubLimits

if TYPE_CHECKING:
    from .broker import Broker

#: (BrokerConfig attribute, option name) of the settings a reload does not change
RESTART_ONLY: tuple[tuple[str, str], ...] = (
    ("listeners", "listen"),
    ("plugins", "plugin"),
    ("no_plugins", "no-plugin"),
    ("max_backlog", "max-backlog"),
    ("slow_consumer", "slow-consumer"),
    ("max_output", "max-output"),
    ("mm2_queue_backlog", "mm2-queue-backlog"),
    ("listen_backlog", "listen-backlog"),
    # the journal's files and the cluster's keys are named after it
    ("node_name", "node-name"),
)


def keep_restart_only(running: BrokerConfig, new: BrokerConfig) -> tuple[BrokerConfig, list[str]]:
    """``new`` with the running values of :data:`RESTART_ONLY`, and the names of the
    options among them whose new value differs (they take effect at the next start)."""
    changed = [
        name for field, name in RESTART_ONLY if getattr(new, field) != getattr(running, field)
    ]
    kept = {field: getattr(running, field) for field, _ in RESTART_ONLY}
    return evolve(new, **kept), changed


def prepare(broker: Broker, config: BrokerConfig) -> Callable[[], None]:
    """Check what the framework takes from ``config`` — the enabled auth schemes, the TLS
    certificate, key and CA (read and checked now, when there is a TLS listener) — and
    return what puts it in place; ConfigError when something cannot be used."""
    schemes = broker.enabled_schemes_for(config, warn=False)
    tls = None
    if broker.tls is not None and config.tls_cert and config.tls_key:
        tls = ServerTLS.load(config.tls_cert, config.tls_key, config.tls_ca)

    def commit() -> None:
        broker.enabled_schemes = schemes
        if tls is not None and broker.tls is not None:
            broker.tls.options = tls.options  # new connections; made ones keep theirs
        broker.login_throttle.rate = config.login_attempts
        broker.connections.max_total = config.max_connections
        broker.connections.max_per_address = config.max_connections_per_address
        broker.hub.limits = HubLimits(
            max_subscriptions=config.max_subscriptions,
            max_topics=config.max_topics,
            queue_backlog=broker.hub.limits.queue_backlog,
        )
        from .logs import set_level

        set_level(config.log_level)

    return commit
