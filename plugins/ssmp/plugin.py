"""The SSMP plugin: registers the ``ssmp`` protocol (default: tcp 4444 on loopback) and
``msgbroker ssmp``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.commands import LazyCommand

if TYPE_CHECKING:
    from collections.abc import Callable

    from msgbroker.commands import RegisterCommand
    from msgbroker.registry import ProtocolSpec

DEFAULT_ENDPOINT = "tcp:4444:interface=127.0.0.1"


#: ``msgbroker ssmp``: the client (:mod:`.cli`) is imported only when it runs
COMMAND = LazyCommand(
    "ssmp",
    "SSMP 1.1 client: subscribe, publish, unicast, broadcast",
    "msgbroker.plugins.ssmp.cli",
)


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    # the server side only here: the command line loads this module too, and needs none of it
    from msgbroker.registry import ProtocolSpec

    from .protocol import SSMPServerSession

    register(
        ProtocolSpec(
            name="ssmp",
            session=SSMPServerSession,
            default_endpoint=DEFAULT_ENDPOINT,
            description="Stupid-Simple Messaging Protocol 1.1",
        )
    )


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=10)
