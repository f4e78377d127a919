"""The Twisted STMP client over WebSocket (on autobahn): :class:`STMPWebSocketClientProtocol`
and its factory. :mod:`.client` re-exports both; import from there.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.python.failure import Failure

from msgbroker.errors import RemoteProtocolError

from . import codec
from .client_base import STMPClientBase
from .codec import Message
from .common import STMPConnectionClosed
from .websocket import ReactorTimer


class STMPWebSocketClientProtocol(STMPClientBase, WebSocketClientProtocol):  # type: ignore[misc]
    """An STMP client over WebSocket (autobahn): text frames — a binary payload (msgpack,
    raw) as the text header plus one binary frame — or, with ``binary_frames=True``, one
    binary-serialized message (without PS) per binary frame. See :class:`STMPClientBase`.
    The version check starts once the WebSocket handshake is done."""

    def __init__(
        self,
        *args: Any,
        binary_frames: bool = False,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.binary_frames = binary_frames
        self.text_mode = not binary_frames
        self._text_decoder = codec.TextDecoder(max_payload)

    def onOpen(self) -> None:
        self._stmp_open()

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if self._lost:
            return
        try:
            if isBinary:
                message: Message | None = self._text_decoder.binary_frame(payload)
            else:
                message = self._text_decoder.text_frame(payload.decode("utf-8"))
        except (RemoteProtocolError, UnicodeDecodeError, ValueError) as e:
            self._protocol_error(RemoteProtocolError(str(e)))
            return
        if message is not None:
            self._stmp_received(message)

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        if self._failure is None and not self._opened:
            self._failure = STMPConnectionClosed(f"WebSocket handshake failed: {reason or code}")

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        super().connectionLost(reason)
        self._stmp_lost(reason)

    def _write(self, message: Message, inline: bool | None) -> None:
        if self.binary_frames:
            self.sendMessage(codec.encode_binary(message, with_ps=False), isBinary=True)
            return
        text, followup = codec.encode_text(message, inline)
        self.sendMessage(text.encode("utf-8"), isBinary=False)
        if followup is not None:
            self.sendMessage(followup, isBinary=True)

    def _drop(self, abort: bool) -> None:
        if abort or not self._opened:
            self.dropConnection(abort=True)
        else:
            self.sendClose(1000)


class STMPWebSocketClientFactory(WebSocketClientFactory):
    """Builds :class:`STMPWebSocketClientProtocol` (or ``protocol_class``) for ``url``
    with the given options."""

    def __init__(
        self,
        url: str,
        protocol_class: type[STMPWebSocketClientProtocol] = STMPWebSocketClientProtocol,
        reactor: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(url, reactor=reactor)
        if reactor is not None:
            # autobahn's handshake and close timers run on txaio's loop (the global reactor):
            # put them on ours. (Its wait for the server to drop the TCP connection after a
            # close handshake still uses txaio's loop.)
            self._batched_timer = ReactorTimer(reactor)
        self.protocol_class = protocol_class
        self.options = options

    def buildProtocol(self, addr: Any) -> STMPWebSocketClientProtocol:
        proto = self.protocol_class(**self.options)
        proto.factory = self
        return proto
