"""The users plugin's hooks: its ``[auth]`` settings, the ``password`` scheme, reloading
the password file on SIGHUP, and the ``msgbroker users`` command. The scheme and the hashing
are imported when a broker is built, so that ``msgbroker`` commands do not load them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import hookimpl
from msgbroker.commands import LazyCommand

if TYPE_CHECKING:
    from msgbroker import Broker, BrokerConfig, ConfigSection
    from msgbroker.auth import AuthScheme
    from msgbroker.commands import RegisterCommand

from .settings import SECTION, users_settings

#: ``msgbroker users``: its module (:mod:`.cli`) is imported only when it runs
COMMAND = LazyCommand(
    "users",
    "add, remove and list the users of a password file (--users)",
    "msgbroker.plugins.users.cli",
)

#: where a broker keeps its password scheme (``broker.plugins.state``)
STATE = "users.scheme"


def load_users(config: BrokerConfig) -> dict[str, str] | None:
    """identity -> hash from the configured password file, None without one;
    ConfigError (one line) when it cannot be read or used."""
    from .passwords import PasswordFile

    path = users_settings(config).users
    return None if path is None else PasswordFile.read(path).hashes()


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)


@hookimpl
def msgbroker_register_auth_schemes(
    register: Callable[[AuthScheme], None], config: BrokerConfig, broker: Broker
) -> None:
    from .scheme import PasswordScheme, Verifier

    users = load_users(config)
    scheme = broker.plugins.state(STATE, lambda: PasswordScheme(users, Verifier(broker.reactor)))
    register(scheme)


@hookimpl
def msgbroker_reload(broker: Broker, config: BrokerConfig) -> Callable[[], None] | None:
    """The password file read again (its path may have changed); a file that cannot be
    used refuses the reload, and the users stay as they were."""
    from .scheme import PasswordScheme

    users = load_users(config)
    scheme = broker.plugins.state(STATE, lambda: None)
    if not isinstance(scheme, PasswordScheme):
        return None

    def commit() -> None:
        if users is None:
            scheme.users = None
        else:
            scheme.replace_users(users)

    return commit


@hookimpl
def msgbroker_broker_stopped(broker: Broker) -> None:
    from .scheme import PasswordScheme

    scheme = broker.plugins.state(STATE, lambda: None)
    if isinstance(scheme, PasswordScheme):
        scheme.verifier.stop()


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=80)
