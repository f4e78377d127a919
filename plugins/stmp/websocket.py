"""STMP over WebSocket (``stmp-ws`` listeners), on autobahn.

Clients speak the text serialization (text frames; a binary payload as a text header plus
one binary frame) or send binary frames (one binary-serialized message each, without PS).
Replies use the form of the request; deliveries the form of the login request.

What the broker sends is encoded straight into WebSocket frames (server frames are not
masked, and no extension is negotiated), so a delivery is encoded once per group of
recipients — frames included — and written to each TCP transport as is.

Before login, ``prelogin-max-frame`` bounds what a peer can make the broker buffer: the
HTTP request head of the handshake (a longer one is answered ``431`` and the connection
closed), and each WebSocket message (autobahn refuses a larger one from its frame header,
close code 1009). The head is searched for its end only in the bytes that just arrived,
so a head that trickles in costs linear time. The session opens with the TCP
connection, so a connection still in its handshake counts against the connection limits.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.logger import Logger

from msgbroker.connection import no_delay
from msgbroker.errors import RemoteProtocolError
from msgbroker.legacy import open_legacy_session
from msgbroker.tls import peer_names

from . import codec
from .codec import Encoding
from .encoders import delivery_encoder, register_serializer
from .protocol import STMPConnection

log = Logger(namespace="msgbroker.stmp")

_TEXT, _BINARY = 0x1, 0x2
_CONNECTING, _OPEN = WebSocketProtocol.STATE_CONNECTING, WebSocketProtocol.STATE_OPEN
_END_OF_HEAD = b"\r\n\r\n"
#: close code for a message over the size limit (RFC 6455 "message too big")
_TOO_BIG = 1009


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
    #: the close code a protocol error gets (1002; 1009 for a message over the limit)
    _fail_code = 1002
    #: the request head was over the limit: the handshake is refused with 431
    _head_refused = False

    def connectionMade(self) -> None:
        super().connectionMade()
        factory: Any = self.factory
        broker = factory.broker
        no_delay(self.transport)
        transport: Any = self.transport
        peer = transport.getPeer()
        # from the TCP connection on, not the WebSocket's open: connections in their
        # handshake count against the limits, and shutdown finds them
        self.session = open_legacy_session(
            broker,
            "stmp",
            delivery_encoder("text", Encoding.JSON),
            self.transport,
            self._close,
            getattr(peer, "host", "") or "",
        )
        self._head_limit = broker.config.prelogin_max_frame
        self._head: list[bytes] = []  # the request head so far, in chunks
        self._head_size = 0
        self._head_tail = b""  # its last 3 bytes: the end may straddle two chunks
        # autobahn took its limits from the factory above; until login, a message (all its
        # frames) may be at most prelogin-max-frame bytes
        self.maxFramePayloadSize = self.maxMessagePayloadSize = self._head_limit

    def _dataReceived(self, data: bytes) -> None:
        """autobahn appends every chunk of the handshake to its buffer and searches all of
        it for the end of the head, with no bound: quadratic in the head's length. Until
        the end is here, keep the chunks and look only at the new bytes (and the 3 before)."""
        if self.state != _CONNECTING or self.session is None:
            super()._dataReceived(data)
            return
        window = self._head_tail + data
        found = window.find(_END_OF_HEAD)
        before = self._head_size - len(self._head_tail)  # where ``window`` starts
        self._head.append(data)
        self._head_size += len(data)
        if found < 0:
            self._head_tail = window[-3:]
            if self._head_size > self._head_limit:
                self._head_too_large()
            return
        if before + found + len(_END_OF_HEAD) > self._head_limit:
            self._head_too_large()
            return
        head, self._head = b"".join(self._head), []
        super()._dataReceived(head)

    def _head_too_large(self) -> None:
        self._head = []
        self._head_refused = True  # _close answers 431
        self.session.close(f"protocol error: request head over {self._head_limit} bytes")

    def onOpenHandshakeTimeout(self) -> None:
        # the handshake is part of the time a client has to log in: say so to the broker
        if self.state == _CONNECTING and self.session is not None:
            self.session.close("login timeout")
        super().onOpenHandshakeTimeout()

    def onOpen(self) -> None:
        factory: Any = self.factory
        self._decoder = codec.TextDecoder(factory.max_payload)
        self.stmp = STMPConnection(
            factory.broker,
            factory.router,
            self.session,
            "text",
            lambda: peer_names(self.transport),
        )
        self.stmp.on_login = self._logged_in
        self.stmp.on_release = self.consumeData

    def _logged_in(self) -> None:
        factory: Any = self.factory
        self.maxFramePayloadSize = factory.maxFramePayloadSize
        self.maxMessagePayloadSize = factory.maxMessagePayloadSize

    def processData(self) -> bool:
        # while a login is pending, what follows it waits, unparsed, in autobahn's buffer
        # (STMPConnection pauses the transport, so the buffer does not grow)
        stmp = self.stmp
        if stmp is not None and stmp.holding:
            return False
        return bool(super().processData())

    def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
        # autobahn fails the connection (1009) itself; through the session, so the broker
        # knows why it closed
        stmp = self.stmp
        if stmp is None or stmp.closed:
            super()._max_message_size_exceeded(msg_size, max_msg_size, reason)
            return
        self._fail_code = _TOO_BIG
        stmp.close(f"protocol error: message over {max_msg_size} bytes")

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
        if self.state == _CONNECTING:
            # no WebSocket to close yet (shutdown, a head over the limit): autobahn's drop
            # unregisters the session from the transport itself
            if self._head_refused:
                self.failHandshake("Request Header Fields Too Large", 431)
            else:
                self.dropConnection(abort=reason in ("slow consumer", "login timeout"))
            return
        self.transport.unregisterProducer()  # type: ignore[union-attr]
        if reason == "slow consumer":
            self.transport.abortConnection()  # type: ignore[union-attr]
        elif self.state != _OPEN:
            pass  # a closing handshake is on its way already
        elif reason.startswith("protocol error"):
            # 1002 is not a code the application API may send; failing the connection is
            # what autobahn does itself for a peer that breaks the protocol
            self._fail_connection(self._fail_code, reason[:120])
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

    def buildProtocol(self, addr: Any) -> Any:
        if not self.broker.admit(addr):
            return None  # over a connection limit: Twisted closes the socket at once
        return super().buildProtocol(addr)
