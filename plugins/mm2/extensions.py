"""Micromessage2 extensions as plugins: what an extension is to the server, and the
registry built from ``msgbroker_register_mm2_extensions``.

An extension plugin registers an :class:`ExtensionSpec`; when a connection's handshake
makes the extension active, the server calls ``spec.factory(context)`` for an
:class:`ExtensionHandler` that lives as long as the connection. The handler sees:

- its EXTENSION frames (:meth:`ExtensionHandler.extension_frame`);
- the COMMAND frames whose names the spec lists in ``commands``;
- each MESSAGE the client sends (:meth:`ExtensionHandler.incoming`), and each it is about
  to be sent (:meth:`ExtensionHandler.outgoing`) — only handlers that override these are
  called, so an extension that does not look at messages costs nothing per message;
- the handshake properties it was activated with (``context.extension``).

Handlers reach the connection through the context: send frames, report a protocol error
(an ERROR frame, then close), the session, the broker. Built-in extensions (``pubsub``,
``ack``, ``batch-ack``, ``json``, ``dotnet``; :mod:`.builtin`) register exactly like a
third-party ``x-...`` one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from attrs import frozen

from msgbroker.errors import ConfigError

from . import hookspecs
from .frames import MessageFrame
from .handshake import Extension
from .properties import Command

if TYPE_CHECKING:
    from msgbroker import Broker, Session
    from msgbroker.message import Message

#: where the broker keeps its extension registry (``broker.plugins.state``)
REGISTRY_STATE = "mm2.extensions"

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


class ExtensionHandler:
    """One active extension on one connection. Override what the extension needs; the
    defaults do nothing (and are never called per message unless overridden)."""

    def __init__(self, context: ExtensionContext) -> None:
        self.context = context

    def extension_frame(self, payload: bytes) -> None:
        """An EXTENSION frame with this extension's id. Default: the client sent a frame
        this extension does not define, which is its error."""
        self.context.protocol_error(f"{self.context.extension.name} takes no frames")

    def command(self, command: Command) -> None:
        """A COMMAND whose name the spec lists. It gets no reply (DECISIONS.md)."""

    def incoming(self, message: MessageFrame) -> MessageFrame | None:
        """A MESSAGE from the client, whole (fragments joined), before it is routed: return
        it (possibly changed), or None to drop it. Raise RemoteProtocolError to refuse it
        (an ERROR frame, then close)."""
        return message

    def outgoing(self, message: Message) -> bool:
        """A message about to be sent to the client: return False to hold the connection's
        output (flow control: :meth:`ExtensionContext.resume` lets it go on)."""
        return True

    def before_send(self, message: Message) -> bytes:
        """Frames to write just before ``message``'s MESSAGE frame (the ``dotnet`` type)."""
        return b""

    def closed(self) -> None:
        """The connection is gone."""


@frozen
class ExtensionSpec:
    """An extension the broker supports. ``offer``: list it among the server's optional
    extensions in the handshake (step 2); ``require``: among the required ones (a client
    without it is refused). ``commands``: the COMMAND names it handles."""

    name: str
    factory: Callable[[ExtensionContext], ExtensionHandler]
    offer: bool = False
    require: bool = False
    commands: frozenset[str] = frozenset()

    def __attrs_post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_CHARS:
            raise ValueError(f"extension names are [a-z0-9-]+: {self.name!r}")


class ExtensionContext:
    """What a handler may use of its connection."""

    def __init__(self, connection: Any, extension: Extension, ext_id: int) -> None:
        self.connection = connection
        #: the extension as confirmed in step 3, with its properties
        self.extension = extension
        #: the id of its EXTENSION frames
        self.ext_id = ext_id

    @property
    def session(self) -> Session:
        session: Session = self.connection.peer
        return session

    @property
    def broker(self) -> Broker:
        broker: Broker = self.connection.broker
        return broker

    def send_extension_frame(self, payload: bytes) -> None:
        self.connection.send_extension_frame(self.ext_id, payload)

    def protocol_error(self, text: str) -> None:
        """The client got the protocol wrong: ERROR frame with ``text``, then close."""
        self.connection.protocol_error(text)

    def resume(self) -> None:
        """Output held by :meth:`ExtensionHandler.outgoing` may go on (an ack came)."""
        self.connection.resume_output()


class Registry:
    """The extensions one broker supports, by name, and the handshake lists they make."""

    def __init__(self, specs: Iterable[ExtensionSpec] = ()) -> None:
        self.specs: dict[str, ExtensionSpec] = {}
        self.commands: dict[str, str] = {}  # command name -> extension name
        for spec in specs:
            self.register(spec)

    def register(self, spec: ExtensionSpec) -> None:
        if spec.name in self.specs:
            raise ValueError(f"two Micromessage2 extensions named {spec.name!r}")
        for name in spec.commands:
            if name in self.commands:
                raise ValueError(f"command {name!r} claimed by {self.commands[name]!r} too")
            self.commands[name] = spec.name
        self.specs[spec.name] = spec

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.specs)

    def required(self) -> tuple[Extension, ...]:
        return tuple(Extension(s.name) for s in self.specs.values() if s.require)

    def offered(self) -> tuple[Extension, ...]:
        return tuple(Extension(s.name) for s in self.specs.values() if s.offer and not s.require)


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
