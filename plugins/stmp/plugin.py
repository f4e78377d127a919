"""The STMP plugin: the ``stmp`` (TCP, binary) and ``stmp-ws`` (WebSocket, text) protocols,
the router every plugin adds routes to (its hook, ``msgbroker_register_stmp_routes``, is in
:mod:`.hookspecs`), the built-in broker actions, and ``msgbroker stmp``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import hookimpl
from msgbroker.broker import ProtocolSpec
from msgbroker.errors import ConfigError
from msgbroker.legacy import BrokerFactory

from . import actions, hookspecs
from .codec import DEFAULT_MAX_PAYLOAD
from .router import Router
from .tcp import STMPServerProtocol

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.commands import RegisterCommand
    from msgbroker.config import Listener

DEFAULT_ENDPOINT = "tcp:4445:interface=127.0.0.1"
DEFAULT_WS_ENDPOINT = "tcp:4446:interface=127.0.0.1"
#: where the broker keeps its router (``broker.plugins.state``)
ROUTER_STATE = "stmp.router"


def router_for(broker: Broker) -> Router:
    """The broker's STMP router, built once from ``msgbroker_register_stmp_routes``."""
    return broker.plugins.state(ROUTER_STATE, lambda: _build_router(broker))


def _build_router(broker: Broker) -> Router:
    router = Router()
    try:
        hookspecs.register_stmp_routes(broker.plugins, router)
    except ValueError as e:
        raise ConfigError(f"bad STMP route: {e}") from None
    return router


class STMPFactory(BrokerFactory):
    def __init__(self, broker: Broker, listener: Listener) -> None:
        super().__init__(STMPServerProtocol, broker, listener)
        self.router = router_for(broker)
        self.max_payload = DEFAULT_MAX_PAYLOAD


def build_factory(broker: Broker, listener: Listener) -> STMPFactory:
    return STMPFactory(broker, listener)


def build_ws_factory(broker: Broker, listener: Listener) -> Any:
    from .websocket import STMPWebSocketFactory

    return STMPWebSocketFactory(broker, listener, router_for(broker))


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    register(ProtocolSpec("stmp", build_factory, DEFAULT_ENDPOINT, "STMP 0.1, binary over TCP"))
    register(
        ProtocolSpec("stmp-ws", build_ws_factory, DEFAULT_WS_ENDPOINT, "STMP 0.1 over WebSocket")
    )


@hookimpl
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    add(hookspecs)


@hookimpl
def msgbroker_register_stmp_routes(router: Router) -> None:
    actions.register(router)


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    from . import cli

    register(cli, order=20)
