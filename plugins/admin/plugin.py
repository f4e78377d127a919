"""The admin plugin: ``--admin ENDPOINT`` (``[admin] endpoint``) serves ``/metrics``
(Prometheus), the JSON admin API (``/api``), the live dashboard (``/``, updated over
server-sent events from ``/events``), and publishes the ``_sys/broker/...`` topics. Its
options are the ``[admin]`` section (:mod:`.settings`); it adds the hook
``msgbroker_collect_metrics`` (:mod:`.hookspecs`).

Hot-path rule: without ``--admin`` this module only declares its section and its hook.
With it, the started hook registers an :class:`~.server.Admin` (whose only hook is
``msgbroker_session_closed``, once per connection, to list recent slow-consumer
disconnects) and listens; nothing is called per message: everything is read from counters
(:mod:`.sampler`, :mod:`.metrics`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgbroker import hookimpl

from . import hookspecs
from .settings import ACTIVE, SECTION, admin_settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from msgbroker import BrokerConfig, ConfigSection
    from msgbroker.broker import Broker

    from .server import Admin

__all__ = ["ACTIVE", "running_admin"]


def running_admin(broker: Broker) -> Admin | None:
    """The broker's running admin endpoint, or ``None`` (no ``--admin``, or not started)."""
    admin = broker.plugins.get(ACTIVE)
    if admin is None:
        return None
    from .server import Admin

    return admin if isinstance(admin, Admin) else None


@hookimpl
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    add(hookspecs)


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)


@hookimpl
def msgbroker_broker_started(broker: Broker) -> None:
    settings = admin_settings(broker.config)
    if not settings.endpoint or running_admin(broker) is not None:
        return
    from .server import Admin  # twisted.web and prometheus-client: only when it runs

    admin = Admin(broker, settings, settings.secret())
    admin.start()
    broker.add_plugin(admin, name=ACTIVE)


@hookimpl
def msgbroker_broker_stopped(broker: Broker) -> None:
    admin = running_admin(broker)
    if admin is None:
        return
    broker.remove_plugin(name=ACTIVE)
    admin.stop()


@hookimpl
def msgbroker_reload(broker: Broker, config: BrokerConfig) -> Callable[[], None] | None:
    """SIGHUP: the admin credential file is read again, and the intervals, the ranking and
    ``metrics-auth`` follow the new settings; a missing or empty secret file refuses the
    reload (the old credential stays). The endpoint itself changes at the next start."""
    admin = running_admin(broker)
    if admin is None:
        return None
    settings = admin_settings(config)
    secret = settings.secret()  # ConfigError: the reload is refused
    return lambda: admin.reconfigure(settings, secret)
