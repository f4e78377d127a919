"""The linepub plugin: everything a built-in plugin does, through msgbroker's public API.

Found through the ``msgbroker`` entry point of this distribution (pyproject.toml); each
``@hookimpl`` below is one way of extending the broker (docs/hooks.md in msgbroker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import BrokerConfig, ConfigSection, ProtocolSpec, hookimpl
from msgbroker.auth import AuthScheme
from msgbroker.commands import LazyCommand

from . import hookspecs
from .auth import TokenScheme
from .extras import STATUS_ACTION, MessageCounter, linepub_status
from .protocol import LineServerSession
from .settings import SECTION, linepub_settings, read_tokens

if TYPE_CHECKING:
    from msgbroker.commands import RegisterCommand

DEFAULT_ENDPOINT = "tcp:4450:interface=127.0.0.1"


@hookimpl
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    add(hookspecs)  # msgbroker_linepub_motd: what linepub says after a login


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)  # [linepub] in the TOML file; --linepub-* on the command line


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    register(
        ProtocolSpec(
            name="linepub",
            session=LineServerSession,
            default_endpoint=DEFAULT_ENDPOINT,
            description="linepub, the example line protocol",
        )
    )


@hookimpl
def msgbroker_register_auth_schemes(
    register: Callable[[AuthScheme], None], config: BrokerConfig
) -> None:
    token_file = linepub_settings(config).token_file
    register(TokenScheme(read_tokens(token_file) if token_file else {}))


# optionalhook: the plugin still loads where the protocol that declares the hook is blocked
@hookimpl(optionalhook=True)
def msgbroker_register_mm2_extensions(register: Callable[[Any], None]) -> None:
    from msgbroker.plugins.mm2.extensions import ExtensionSpec

    register(
        ExtensionSpec(
            "x-linepub-count", MessageCounter, offer=True, commands=frozenset({"linepub-count"})
        )
    )


@hookimpl(optionalhook=True)
def msgbroker_register_stmp_routes(router: Any) -> None:
    router.add(STATUS_ACTION, linepub_status)


#: ``msgbroker linepub``: named here, its module imported only when the command runs (so
#: neither a broker nor another command imports the client)
COMMAND = LazyCommand(
    "linepub",
    "linepub client (the example plugin): subscribe, publish",
    "msgbroker_linepub.cli",
)


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=50)
