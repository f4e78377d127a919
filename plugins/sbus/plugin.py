"""The sbus plugin: the ``sbus`` protocol on unix seqpacket sockets.

``--listen sbus=unix:PATH`` (also ``sbus=PATH``, and every address ``sbusd -a`` takes:
``/dev/fd/N``, ``/dev/unix/abstract[/HEX]``), with options ``mode=0700`` (the socket
file's permissions) and ``max-packet=N`` (the largest packet a client may send). The
embedded default listens at ``$XDG_RUNTIME_DIR/msgbroker/sbus.socket``, or under the
temporary directory when there is no runtime directory. ``msgbroker sbus`` is its client.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import hookimpl
from msgbroker.commands import LazyCommand

from .addresses import default_path

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.commands import RegisterCommand
    from msgbroker.config import Listener
    from msgbroker.registry import ProtocolSpec

    from .seqpacket import SeqpacketServerEndpoint
    from .server import SbusFactory


def build_endpoint(reactor: Any, text: str) -> SeqpacketServerEndpoint:
    from .seqpacket import parse_endpoint

    endpoint = parse_endpoint(reactor, text)
    if text == "unix:" + default_path():
        os.makedirs(os.path.dirname(default_path()), mode=0o700, exist_ok=True)
    return endpoint


def build_factory(broker: Broker, listener: Listener) -> SbusFactory:
    from .seqpacket import parse_endpoint
    from .server import SbusFactory

    # the same parse as the endpoint's: the session checks the size the port reads
    return SbusFactory(broker, parse_endpoint(None, listener.endpoint).max_packet)


#: ``msgbroker sbus``: the client (:mod:`.cli`) is imported only when it runs
COMMAND = LazyCommand(
    "sbus",
    "sbus client: subscribe to key patterns, publish, ask for credentials",
    "msgbroker.plugins.sbus.cli",
)


@hookimpl
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    # the server side only here: the command line loads this module too, and needs none of it
    from msgbroker.registry import ProtocolSpec

    from .protocol import SbusServerSession

    register(
        ProtocolSpec(
            name="sbus",
            build_factory=build_factory,
            default_endpoint="unix:" + default_path(),
            description="sbus on a unix seqpacket socket",
            build_endpoint=build_endpoint,
            session=SbusServerSession,
        )
    )


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=40)
