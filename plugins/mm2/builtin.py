"""The built-in Micromessage2 extensions, registered through
``msgbroker_register_mm2_extensions`` exactly like a third-party one:

- ``pubsub``: the ``subscribe`` and ``unsubscribe`` commands (destination, queue group,
  filters; DECISIONS.md). Subscribing again to a destination replaces the subscription.
- ``ack`` and ``batch-ack`` (``max-count``, default 10): the client acknowledges our
  MESSAGEs with cumulative u16 acks and we stop at the window; we acknowledge the client's
  once per chunk read. An ack for a number never sent is a protocol error.
- ``json``: the client's payloads must parse as JSON.
- ``dotnet``: the client may send the type of the next MESSAGEs in an EXTENSION frame; the
  type travels with them, and a subscriber with ``dotnet`` gets its own type frame before a
  message whose type differs from the last it received.
- ``x-login`` (ours): the login scheme and credential, as properties of the step-3
  confirmation: ``x-login:scheme=password,credential=s3cret`` (URL-encoded). The server
  session reads them when it logs the identity in; the extension has no frames.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from msgbroker import hookimpl
from msgbroker.errors import (
    AlreadySubscribed,
    NotAllowed,
    NotAuthorized,
    NotSubscribed,
    RemoteProtocolError,
)

from . import codec
from .delivery import DOTNET_HINT
from .extensions import ExtensionContext, ExtensionHandler, ExtensionSpec
from .handshake import LOGIN_EXTENSION


class PubSub(ExtensionHandler):
    def command(self, command: codec.Command) -> None:
        request = codec.parse_pubsub(command)
        context = self.context
        session, broker = context.session, context.broker
        hub = broker.hub
        if isinstance(request, codec.Unsubscribe):
            with contextlib.suppress(NotSubscribed):  # nothing to undo; no reply either
                hub.unsubscribe(session, request.destination)
            return
        assert isinstance(request, codec.Subscribe)
        topic = request.destination
        if broker.authorizes and not broker.authorize(session, "subscribe", topic):
            raise NotAuthorized(f"not allowed to subscribe to {topic[:40]!r}")
        try:
            try:
                hub.subscribe(session, topic, filters=request.filters, queue=request.queue)
            except AlreadySubscribed:  # the new subscription replaces the old one
                hub.unsubscribe(session, topic)
                hub.subscribe(session, topic, filters=request.filters, queue=request.queue)
        except NotAllowed as e:
            # a limit (LimitExceeded) or the hub's own refusal: the "not allowed" ERROR,
            # then the close, as for an authorization refusal (docs/mm2.md, "Limits")
            raise RemoteProtocolError(f"not allowed to subscribe to {topic[:40]!r}: {e}") from None


class Acks(ExtensionHandler):
    """``ack`` (a window of 1) and ``batch-ack`` (``max-count``), both directions."""

    def __init__(self, context: ExtensionContext, window: int) -> None:
        super().__init__(context)
        connection = context.connection
        if connection.window is not None:
            raise RemoteProtocolError("ack and batch-ack cannot both be active")
        connection.window = window
        # the connection calls this once per chunk read: one cumulative ack for what came
        connection.acker = self._acknowledge
        self._acked_in = 0  # the last of the client's messages we acknowledged

    def extension_frame(self, payload: bytes) -> None:
        """The client acknowledges our messages up to a number (one never sent is its
        error: the window says so)."""
        seq = codec.parse_ack(codec.ExtensionFrame(self.context.ext_id, payload))
        self.context.connection.acked(seq)

    def _acknowledge(self) -> None:
        seq = self.context.connection.seq_in
        if seq != self._acked_in:
            self._acked_in = seq
            self.context.send_extension_frame(seq.to_bytes(2, "big"))


def _ack(context: ExtensionContext) -> ExtensionHandler:
    return Acks(context, 1)


def _batch_ack(context: ExtensionContext) -> ExtensionHandler:
    return Acks(context, codec.batch_ack_max_count(context.extension))


class Json(ExtensionHandler):
    def incoming(self, message: codec.MessageFrame) -> codec.MessageFrame | None:
        try:
            json.loads(message.payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise RemoteProtocolError(f"message {message.seq}: the payload is not JSON") from None
        return message


class DotNet(ExtensionHandler):
    """The client names the type of its next MESSAGEs in an EXTENSION frame; the type
    travels with each message (``Message.encoding``) until it names another, and reaches
    subscribers with ``dotnet`` active as their own type frame, only when it changes."""

    def __init__(self, context: ExtensionContext) -> None:
        super().__init__(context)
        context.connection.dotnet_id = context.ext_id

    def extension_frame(self, payload: bytes) -> None:
        try:
            name = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError("dotnet type name is not UTF-8") from None
        self.context.connection.encoding_hint = DOTNET_HINT + name


BUILTIN: tuple[ExtensionSpec, ...] = (
    ExtensionSpec("pubsub", PubSub, offer=True, commands=frozenset({"subscribe", "unsubscribe"})),
    ExtensionSpec("batch-ack", _batch_ack, offer=True),
    ExtensionSpec("ack", _ack),
    ExtensionSpec("json", Json),
    ExtensionSpec("dotnet", DotNet),
    ExtensionSpec(LOGIN_EXTENSION, ExtensionHandler),
)


# optional: this plugin loads (and does nothing) where the mm2 plugin is blocked
@hookimpl(optionalhook=True)
def msgbroker_register_mm2_extensions(register: Callable[[ExtensionSpec], None]) -> None:
    for spec in BUILTIN:
        register(spec)
