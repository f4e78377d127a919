"""The Micromessage2 plugin: the ``mm2`` protocol (its server session served over TCP or
TLS by the framework's stream glue), the extension registry built from
``msgbroker_register_mm2_extensions`` (its hookspec is in :mod:`.hookspecs`; the built-in
extensions are in :mod:`.builtin`, registered through the same hook), and ``msgbroker
mm2``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.commands import LazyCommand

from . import hookspecs
from .extensions import registry_for

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.commands import RegisterCommand
    from msgbroker.config import Listener
    from msgbroker.connection import StreamFactory
    from msgbroker.registry import ProtocolSpec

__all__ = ["DEFAULT_ENDPOINT", "build_factory", "registry_for"]

DEFAULT_ENDPOINT = "tcp:4447:interface=127.0.0.1"


def build_factory(broker: Broker, listener: Listener) -> StreamFactory:
    # the registry is gathered as the first listener is built, so a bad extension (two with
    # one name) stops the broker at start, not at a client's first connection
    from msgbroker.connection import StreamFactory

    from .protocol import MM2ServerSession

    registry_for(broker)
    return StreamFactory(broker, MM2ServerSession)


#: ``msgbroker mm2``: the client (:mod:`.cli`) is imported only when it runs
COMMAND = LazyCommand(
    "mm2",
    "Micromessage2 client: subscribe (filters, queue groups), publish with properties",
    "msgbroker.plugins.mm2.cli",
)


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    # the server side only here: the command line loads this module too, and needs none of it
    from msgbroker.registry import ProtocolSpec

    from .protocol import MM2ServerSession

    register(
        ProtocolSpec(
            name="mm2",
            build_factory=build_factory,
            default_endpoint=DEFAULT_ENDPOINT,
            description="Micromessage2 over TCP",
            session=MM2ServerSession,
        )
    )


@hookimpl
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    add(hookspecs)


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=30)
