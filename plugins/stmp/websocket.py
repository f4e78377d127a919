"""STMP over WebSocket (``stmp-ws`` listeners): the autobahn glue of
:class:`~.websocket_session.STMPWebSocketSession`, run by the framework's
:class:`~msgbroker.connection.Connection` like any other connection.

autobahn does the handshake and decodes what arrives; each message goes to the session
(``Connection.feed_to``). What the broker sends is encoded straight into WebSocket frames
(server frames are not masked, and no extension is negotiated, see ``encoders.py``), so
a delivery is encoded once per group of recipients — frames included — and the session's
output writes it to the TCP transport as is.

Before login, ``prelogin-max-frame`` bounds what a peer can make the broker buffer: the
HTTP request head of the handshake (a longer one is answered ``431`` and the connection
closed), and each WebSocket message (autobahn refuses a larger one from its frame header,
close code 1009). The head is searched for its end only in the bytes that just arrived,
so a head that trickles in costs linear time. The session opens with the TCP
connection, so a connection still in its handshake counts against the connection limits
and its login timeout runs from then.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol

from msgbroker.connection import Connection, ReadsTransport, no_delay
from msgbroker.reasons import CloseReason
from msgbroker.timers import ReactorTimer

from .encoders import binary_frame, text_frames, ws_frame
from .websocket_session import STMPWebSocketSession

# the framings' serializers moved to encoders.py; importers of this module still find them
__all__ = ["STMPWebSocketFactory", "binary_frame", "text_frames", "ws_frame"]

_CONNECTING, _OPEN = WebSocketProtocol.STATE_CONNECTING, WebSocketProtocol.STATE_OPEN
_END_OF_HEAD = b"\r\n\r\n"
#: close code for a message over the size limit (RFC 6455 "message too big")
_TOO_BIG = 1009


# autobahn's own bases disagree on two attribute types, which mypy checks once there is a mixin
class STMPWebSocketProtocol(ReadsTransport, WebSocketServerProtocol):  # type: ignore[misc]
    """One WebSocket connection: autobahn's protocol, and the transport side
    (:class:`~msgbroker.connection.TransportLink`) of its :class:`Connection`."""

    connection: Connection | None = None
    #: the close code a protocol error gets (1002; 1009 for a message over the limit)
    _fail_code = 1002
    #: the request head was over the limit: the handshake is refused with 431
    _head_refused = False
    #: autobahn's limits are the pre-login ones until the client logs in
    _prelogin = True

    def connectionMade(self) -> None:
        super().connectionMade()
        factory: Any = self.factory
        broker = factory.broker
        transport: Any = self.transport
        no_delay(transport)
        host = getattr(transport.getPeer(), "host", "") or ""
        # from the TCP connection on, not the WebSocket's open: connections in their
        # handshake count against the limits, and shutdown finds them
        self.connection = Connection(broker, STMPWebSocketSession, self, transport, host)
        self._server: STMPWebSocketSession = self.connection.server  # type: ignore[assignment]
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
        if self.state != _CONNECTING or self.connection is None:
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
        self._head_refused = True  # end() answers 431
        self._server.close(
            CloseReason.PROTOCOL_ERROR, f"request head over {self._head_limit} bytes"
        )

    def onOpen(self) -> None:
        self._server.websocket_opened()

    def processData(self) -> bool:
        # while a login is pending, what follows it waits, unparsed, in autobahn's buffer
        # (the session holds the reading too, so the buffer does not grow)
        if self._server.holding:
            return False
        return bool(super().processData())

    def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
        # autobahn fails the connection (1009) itself; through the session, so the broker
        # knows why it closed
        if self._server.closed:
            super()._max_message_size_exceeded(msg_size, max_msg_size, reason)
            return
        self._fail_code = _TOO_BIG
        self._server.close(CloseReason.PROTOCOL_ERROR, f"message over {max_msg_size} bytes")

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        connection = self.connection
        assert connection is not None
        connection.feed_to(self._server.message_received, payload, isBinary, size=len(payload))
        if self._prelogin and connection.session.identity is not None:
            self._prelogin = False  # logged in: the factory's limits apply
            factory: Any = self.factory
            self.maxFramePayloadSize = factory.maxFramePayloadSize
            self.maxMessagePayloadSize = factory.maxMessagePayloadSize

    def connectionLost(self, reason: Any = None) -> None:
        super().connectionLost(reason)
        if self.connection is not None:
            self.connection.lost()

    # -- TransportLink --------------------------------------------------------------------------

    def end(self, reason: CloseReason, abort: bool) -> None:
        # Nothing may follow our close frame (RFC 6455): leave the hub now rather than when
        # the closing handshake ends, so no delivery is written after it.
        connection = self.connection
        assert connection is not None
        session = connection.session
        connection.broker.session_closed(session, reason)
        if self.state == _CONNECTING:
            # no WebSocket to close yet (shutdown, a head over the limit, the login timeout)
            if self._head_refused:
                self.failHandshake("Request Header Fields Too Large", 431)
            else:
                self.dropConnection(abort=abort or reason is CloseReason.LOGIN_TIMEOUT)
            return
        transport: Any = self.transport
        transport.unregisterProducer()
        if abort:
            transport.abortConnection()
        elif self.state != _OPEN:
            pass  # a closing handshake is on its way already
        elif reason is CloseReason.PROTOCOL_ERROR:
            # 1002 is not a code the application API may send; failing the connection is
            # what autobahn does itself for a peer that breaks the protocol
            self._fail_connection(self._fail_code, (session.close_text or reason)[:120])
        else:
            self.sendClose(1000)

    def resume_reading(self) -> None:
        super().resume_reading()
        if self.state == _OPEN:
            self.consumeData()  # what waited in autobahn's buffer meanwhile


class STMPWebSocketFactory(WebSocketServerFactory):
    protocol = STMPWebSocketProtocol

    def __init__(self, broker: Any, listener: Any) -> None:
        super().__init__(reactor=broker.reactor)
        # close and ping timers on the broker's reactor, not txaio's global one
        self._batched_timer = ReactorTimer(broker.reactor)
        self.broker = broker
        self.listener = listener
        max_payload = STMPWebSocketSession.max_payload
        self.setProtocolOptions(
            maxMessagePayloadSize=max_payload + 64,
            # the session's login timeout covers the handshake (it runs from the TCP open)
            openHandshakeTimeout=0,
            closeHandshakeTimeout=2,
            failByDrop=False,  # a failed connection still gets its close frame (1002)
            perMessageCompressionAccept=lambda offers: None,  # frames are pre-encoded
        )
        self.noisy = False

    def buildProtocol(self, addr: Any) -> Any:
        if not self.broker.admit(addr):
            return None  # over a connection limit: Twisted closes the socket at once
        return super().buildProtocol(addr)
