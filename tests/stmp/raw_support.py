"""Raw STMP peers for tests that need bytes the real clients would never send: a blocking
WebSocket client in a few lines (:class:`RawWebSocket`), the frames and requests they
write, and the in-memory WebSocket handshake (:func:`ws_open`) for tests on a Clock."""

from __future__ import annotations

import base64
import os
import socket
import threading
from typing import Any

from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.codec import Encoding, Request
from msgbroker.plugins.stmp.payloads import encode_payload
from tests.interop.peers import ws_client_frame

TEXT, BINARY, CLOSE = 0x1, 0x2, 0x8
WAIT = 10.0


def handshake_head(pad: int = 0, path: bytes = b"/stmp") -> bytes:
    """A valid WebSocket upgrade request; ``pad`` > 0 adds an ``X-Pad`` header that makes
    the head exactly ``pad`` bytes longer than without it (``pad`` >= 10)."""
    key = base64.b64encode(os.urandom(16))
    head = (
        b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n"
    )
    if pad:
        head += b"X-Pad: " + b"p" * (pad - 9) + b"\r\n"  # "X-Pad: " and CRLF are 9 bytes
    return head + b"\r\n"


def request(ident: int, action: str, obj: Any = None) -> bytes:
    """A binary (TCP) request, JSON payload (none when ``obj`` is None)."""
    if obj is None:
        return codec.encode_binary(Request(ident, codec.parse_action(action)))
    payload = encode_payload(obj, Encoding.JSON)
    return codec.encode_binary(Request(ident, codec.parse_action(action), Encoding.JSON, payload))


def text_request(ident: int, action: str, obj: Any) -> bytes:
    """The text serialization of a JSON request, for a text frame."""
    payload = encode_payload(obj, Encoding.JSON)
    return b"1|2|%d|%d|" % (ident, codec.parse_action(action)) + payload


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of each whole unmasked server frame in ``data``."""
    frames, pos = [], 0
    while pos + 2 <= len(data):
        opcode, size, start = data[pos] & 0x0F, data[pos + 1] & 0x7F, pos + 2
        if size == 126:
            size, start = int.from_bytes(data[pos + 2 : pos + 4], "big"), pos + 4
        elif size == 127:
            size, start = int.from_bytes(data[pos + 2 : pos + 10], "big"), pos + 10
        frames.append((opcode, data[start : start + size]))
        pos = start + size
    return frames


def ws_open(conn: Any) -> None:
    """Complete the WebSocket handshake on an in-memory ``stmp-ws`` connection."""
    conn.send(handshake_head())
    response = conn.received()
    assert response.startswith(b"HTTP/1.1 101"), response


class RawWebSocket:
    """A WebSocket client in a few lines: masked frames out, (opcode, payload) in."""

    def __init__(self, port: int, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:  # before connecting, so the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(handshake_head())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            assert chunk, "the server closed the connection in the handshake"
            response += chunk
        head, _, self.buf = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")

    def send(self, opcode: int, payload: bytes) -> None:
        self.sock.sendall(ws_client_frame(opcode, payload))

    def _need(self, size: int) -> None:
        while len(self.buf) < size:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.buf += chunk

    def frame(self) -> tuple[int, bytes]:
        """The next data or close frame (other control frames are skipped)."""
        while True:
            self._need(2)
            opcode, size, pos = self.buf[0] & 0x0F, self.buf[1] & 0x7F, 2
            if size == 126:
                self._need(4)
                size, pos = int.from_bytes(self.buf[2:4], "big"), 4
            self._need(pos + size)
            payload, self.buf = self.buf[pos : pos + size], self.buf[pos + size :]
            if opcode in (TEXT, BINARY, CLOSE):
                return opcode, payload

    def close(self) -> None:
        self.sock.close()


def ended(sock: socket.socket) -> bool:
    """True once the peer closed ``sock`` (FIN or RST), reading what is left."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def flood_past_a_stalled_reader(port: int, topic: str, count: int, payload: bytes) -> list[bytes]:
    """Publish ``count`` messages on ``topic`` from a blocking STMP client while another one,
    subscribed to it, reads every delivery; returns what that healthy reader received (a
    stalled subscriber set up by the caller must never make either of them wait)."""
    from msgbroker.plugins.stmp.blocking import BlockingSTMPClient

    received: list[bytes] = []
    with (
        BlockingSTMPClient("127.0.0.1", port, f"fast-{topic}") as fast,
        BlockingSTMPClient("127.0.0.1", port, f"pub-{topic}") as publisher,
    ):
        fast.subscribe(topic)

        def read_all() -> None:
            while len(received) < count:
                delivery = fast.next_delivery(30)
                assert delivery is not None
                received.append(delivery.data)

        reader = threading.Thread(target=read_all)
        reader.start()
        for _ in range(count):
            publisher.publish(topic, payload)
        reader.join(60)
    return received
