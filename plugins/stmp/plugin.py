"""The STMP plugin: the ``stmp`` (TCP, binary) and ``stmp-ws`` (WebSocket, text) protocols,
the router every plugin adds routes to (its hook, ``msgbroker_register_stmp_routes``, is in
:mod:`.hookspecs`), the built-in broker actions, and ``msgbroker stmp``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import hookimpl
from msgbroker.commands import LazyCommand

from . import hookspecs

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.commands import RegisterCommand
    from msgbroker.config import Listener
    from msgbroker.connection import StreamFactory
    from msgbroker.registry import ProtocolSpec

    from .router import ROUTER_STATE, Router, router_for

DEFAULT_ENDPOINT = "tcp:4445:interface=127.0.0.1"
DEFAULT_WS_ENDPOINT = "tcp:4446:interface=127.0.0.1"

# router_for and ROUTER_STATE live with the router now; importers of this module find them
# (through __getattr__: the router imports Twisted, which the command line does without)
__all__ = ["ROUTER_STATE", "router_for"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import router

        return getattr(router, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_factory(broker: Broker, listener: Listener) -> StreamFactory:
    from msgbroker.connection import StreamFactory

    from .protocol import STMPServerSession
    from .router import router_for

    router_for(broker)  # a bad route is a configuration error when the listener starts
    return StreamFactory(broker, STMPServerSession)


def build_ws_factory(broker: Broker, listener: Listener) -> Any:
    from .router import router_for
    from .websocket import STMPWebSocketFactory

    router_for(broker)
    return STMPWebSocketFactory(broker, listener)


#: ``msgbroker stmp``: the client (:mod:`.cli`) is imported only when it runs
COMMAND = LazyCommand(
    "stmp",
    "STMP 0.1 client: subscribe, publish, call an action (TCP or WebSocket)",
    "msgbroker.plugins.stmp.cli",
)


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    # the server side only here: the command line loads this module too, and needs none of it
    from msgbroker.registry import ProtocolSpec

    from .protocol import STMPServerSession
    from .websocket_session import STMPWebSocketSession

    register(
        ProtocolSpec(
            name="stmp",
            build_factory=build_factory,
            default_endpoint=DEFAULT_ENDPOINT,
            description="STMP 0.1, binary over TCP",
            session=STMPServerSession,
        )
    )
    register(
        ProtocolSpec(
            name="stmp-ws",
            build_factory=build_ws_factory,
            default_endpoint=DEFAULT_WS_ENDPOINT,
            description="STMP 0.1 over WebSocket",
            session=STMPWebSocketSession,
        )
    )


@hookimpl
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    add(hookspecs)


@hookimpl
def msgbroker_register_stmp_routes(router: Router) -> None:
    from . import actions

    actions.register(router)


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=20)
