"""STMP over WebSocket, sans-IO: :class:`STMPWebSocketSession`, the server session of
``stmp-ws`` listeners. It is :class:`~.protocol.STMPServerSession` reading one WebSocket
message at a time (the text serialization, or binary frames) instead of a byte stream;
everything after a message is decoded is the stream session's. ``websocket.py`` is its
autobahn glue. Split out of ``protocol.py`` to keep it under ~500 lines.
"""

from __future__ import annotations

from msgbroker.errors import RemoteProtocolError

from . import codec
from .codec import Encoding
from .encoders import delivery_encoder
from .protocol import STMPServerSession

__all__ = ["STMPWebSocketSession"]


class STMPWebSocketSession(STMPServerSession):
    """STMP over WebSocket, one message per :meth:`message_received` (autobahn decodes the
    frames): the text serialization in text frames, a payload-less text header pairing with
    the binary frame after it; a binary frame on its own is one binary message without PS.
    Replies use the form of their request; deliveries and pings that of the login request.

    It opens with the TCP connection (connection limits and the login timeout cover the
    handshake); the heartbeat starts once the WebSocket is open (:meth:`websocket_opened`).
    While a login is pending what follows waits in autobahn's buffer: the glue stops
    parsing while :attr:`holding`."""

    encode = staticmethod(delivery_encoder("text", Encoding.JSON))
    framing = "text"

    def opened(self) -> None:
        self.prepare()
        self._text = codec.TextDecoder(self.max_payload)

    def websocket_opened(self) -> None:
        """The handshake is done."""
        self.start_heartbeat()

    def data_received(self, data: bytes) -> None:
        """Bytes alone are one binary message."""
        self.message_received(data, True)

    def message_received(self, payload: bytes, binary: bool) -> None:
        """One WebSocket message (``binary``: a binary frame, else a text frame)."""
        if self.closed:
            return
        self._last_rx = self.timers.seconds()  # a header alone is traffic too
        decoder = self._text
        try:
            paired = False
            if binary:
                paired = decoder.waiting_for_payload
                framing = "text" if paired else "frame"
                message: codec.Message | None = decoder.binary_frame(payload)
            else:
                framing = "text"
                message = decoder.text_frame(payload.decode("utf-8"))
        except (RemoteProtocolError, UnicodeDecodeError) as e:
            self._protocol_error(str(e))
            return
        if message is not None:  # else a header: its payload is the next (binary) frame
            self.received(message, framing, payload_frame=paired)

    def release_kept(self) -> None:
        pass  # autobahn keeps what arrived: parsed when reading resumes
