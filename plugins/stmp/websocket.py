"""STMP over WebSocket (``stmp-ws`` listeners), on autobahn.

Clients speak the text serialization (text frames; a binary payload as a text header plus
one binary frame) or send binary frames (one binary-serialized message each, without PS).
Replies use the form of the request; deliveries the form of the login request.

What the broker sends is encoded straight into WebSocket frames (server frames are not
masked, and no extension is negotiated), so a delivery is encoded once per group of
recipients — frames included — and written to each TCP transport as is.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.logger import Logger

from msgbroker.connection import no_delay
from msgbroker.errors import RemoteProtocolError
from msgbroker.tls import peer_names

from . import codec
from .codec import Encoding
from .protocol import STMPConnection, delivery_encoder, register_serializer

log = Logger(namespace="msgbroker.stmp")

_TEXT, _BINARY = 0x1, 0x2


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, unfragmented server frame."""
    size = len(payload)
    if size < 126:
        head = bytes((0x80 | opcode, size))
    elif size < 1 << 16:
        head = bytes((0x80 | opcode, 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 127)) + size.to_bytes(8, "big")
    return head + payload


def text_frames(message: codec.Message, inline: bool | None = None) -> bytes:
    text, follow = codec.encode_text(message, inline)
    frames = ws_frame(_TEXT, text.encode("utf-8"))
    if follow is not None:
        frames += ws_frame(_BINARY, follow)
    return frames


def binary_frame(message: codec.Message, inline: bool | None = None) -> bytes:
    return ws_frame(_BINARY, codec.encode_binary(message, with_ps=False))


register_serializer("text", text_frames)
register_serializer("frame", binary_frame)


class STMPWebSocketProtocol(WebSocketServerProtocol):
    """One WebSocket connection: autobahn does the handshake and framing of what arrives;
    the STMP logic is :class:`STMPConnection`, as on TCP."""

    stmp: STMPConnection | None = None
    session: Any = None

    def onOpen(self) -> None:
        factory: Any = self.factory
        broker = factory.broker
        no_delay(self.transport)
        transport: Any = self.transport
        peer = transport.getPeer()
        self.session = broker.open_session(
            protocol="stmp",
            encode=delivery_encoder("text", Encoding.JSON),
            transport=self.transport,
            closer=self._close,
            host=getattr(peer, "host", "") or "",
        )
        self._decoder = codec.TextDecoder(factory.max_payload)
        self.stmp = STMPConnection(
            broker, factory.router, self.session, "text", lambda: peer_names(self.transport)
        )

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        stmp = self.stmp
        if stmp is None or stmp.closed:
            return
        try:
            paired = False
            if isBinary:
                paired = self._decoder.waiting_for_payload
                framing = "text" if paired else "frame"
                message: codec.Message | None = self._decoder.binary_frame(payload)
            else:
                framing = "text"
                message = self._decoder.text_frame(payload.decode("utf-8"))
            if message is None:  # a header; its payload is the next (binary) frame
                stmp.received(codec.PING, "text")  # still activity for the heartbeat
                return
        except RemoteProtocolError as e:
            log.debug("stmp-ws {host}: protocol error: {why}", host=self.session.host, why=e)
            stmp.close(f"protocol error: {e}")
            return
        stmp.received(message, framing, payload_frame=paired)
        self.factory.broker.batcher.flush()

    def _close(self, reason: str) -> None:
        # Nothing may follow our close frame (RFC 6455): leave the hub now rather than when
        # the closing handshake ends, so no delivery is written after it.
        factory: Any = self.factory
        factory.broker.session_closed(self.session, reason)
        self.transport.unregisterProducer()  # type: ignore[union-attr]
        if reason == "slow consumer":
            self.transport.abortConnection()  # type: ignore[union-attr]
        elif reason.startswith("protocol error"):
            # 1002 is not a code the application API may send; failing the connection is
            # what autobahn does itself for a peer that breaks the protocol
            self._fail_connection(1002, reason[:120])
        else:
            self.sendClose(1000)

    def connectionLost(self, reason: Any = None) -> None:
        super().connectionLost(reason)
        if self.stmp is not None:
            self.stmp.lost()
        if self.session is not None:
            factory: Any = self.factory
            factory.broker.session_closed(self.session, "closed by peer")
            callbacks, self.session.on_lost = self.session.on_lost, []
            for callback in callbacks:
                callback()


class ReactorTimer:
    """What autobahn wants of its timer (``call_later`` returning something to ``cancel``),
    on a given reactor. autobahn's own batched timer uses txaio's loop, the global reactor,
    whatever reactor the factory was given."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def call_later(self, delay: float, fun: Any, *args: Any, **kwargs: Any) -> Any:
        return _Cancellable(self._reactor.callLater(delay, fun, *args, **kwargs))


class _Cancellable:
    def __init__(self, call: Any) -> None:
        self._call = call

    def cancel(self) -> None:
        if self._call.active():
            self._call.cancel()


class STMPWebSocketFactory(WebSocketServerFactory):
    protocol = STMPWebSocketProtocol

    def __init__(self, broker: Any, listener: Any, router: Any) -> None:
        super().__init__(reactor=broker.reactor)
        # handshake, close and ping timers on the broker's reactor, not txaio's global one
        self._batched_timer = ReactorTimer(broker.reactor)
        self.broker = broker
        self.listener = listener
        self.router = router
        self.max_payload = codec.DEFAULT_MAX_PAYLOAD
        self.setProtocolOptions(
            maxMessagePayloadSize=self.max_payload + 64,
            openHandshakeTimeout=broker.config.login_timeout,
            closeHandshakeTimeout=2,
            failByDrop=False,  # a failed connection still gets its close frame (1002)
            perMessageCompressionAccept=lambda offers: None,  # frames are pre-encoded
        )
        self.noisy = False
