"""The Micromessage2 plugin: the ``mm2`` protocol (TCP or TLS), the extension registry
built from ``msgbroker_register_mm2_extensions`` (its hookspec is in :mod:`.hookspecs`; the
built-in extensions are in :mod:`.builtin`, registered through the same hook), and
``msgbroker mm2``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.broker import ProtocolSpec
from msgbroker.errors import ConfigError
from msgbroker.legacy import BrokerFactory

from . import hookspecs
from .extensions import Registry
from .fragments import DEFAULT_MAX_MESSAGE
from .frames import DEFAULT_MAX_PAYLOAD
from .protocol import MM2ServerProtocol

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.commands import RegisterCommand
    from msgbroker.config import Listener

DEFAULT_ENDPOINT = "tcp:4447:interface=127.0.0.1"
#: where the broker keeps its extension registry (``broker.plugins.state``)
REGISTRY_STATE = "mm2.extensions"


def registry_for(broker: Broker) -> Registry:
    """The broker's Micromessage2 extensions, gathered once from the hook."""
    return broker.plugins.state(REGISTRY_STATE, lambda: _build_registry(broker))


def _build_registry(broker: Broker) -> Registry:
    registry = Registry()
    try:
        hookspecs.register_mm2_extensions(broker.plugins, registry.register)
    except ValueError as e:
        raise ConfigError(f"bad Micromessage2 extension: {e}") from None
    return registry


class MM2Factory(BrokerFactory):
    def __init__(self, broker: Broker, listener: Listener) -> None:
        super().__init__(MM2ServerProtocol, broker, listener)
        self.registry = registry_for(broker)
        self.max_payload = DEFAULT_MAX_PAYLOAD
        self.max_message = DEFAULT_MAX_MESSAGE


def build_factory(broker: Broker, listener: Listener) -> MM2Factory:
    return MM2Factory(broker, listener)


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    register(ProtocolSpec("mm2", build_factory, DEFAULT_ENDPOINT, "Micromessage2 over TCP"))


@hookimpl
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    add(hookspecs)


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    from . import cli

    register(cli, order=30)
