"""A small RFC 6455 WebSocket client on a plain (or TLS) socket, for the blocking clients:
no reactor, no extra dependency. :class:`WebSocketChannel` opens the connection (the HTTP
upgrade) and carries a session's units, ``(is_binary, payload)`` messages; :func:`ws_frame`,
:func:`ws_mask` and :class:`WebSocketReader` are its pieces (sans-IO).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from msgbroker.errors import RemoteProtocolError

from .blocking import StreamChannel

__all__ = ["WebSocketChannel", "WebSocketReader", "ws_frame", "ws_mask"]

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0, 1, 2, 8, 9, 10


def ws_mask(data: bytes, key: bytes) -> bytes:
    """RFC 6455 masking (its own inverse)."""
    n = len(data)
    if not n:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


def ws_frame(opcode: int, payload: bytes, key: bytes | None = None) -> bytes:
    """One final client frame (masked with ``key``, random by default)."""
    key = os.urandom(4) if key is None else key
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + key + ws_mask(payload, key)


class WebSocketReader:
    """Sans-IO reader of a server's WebSocket frames: ``feed(bytes)`` yields complete
    messages as ``(is_binary, bytes)`` and control events ``("ping"|"close", payload)``.
    Fragmented messages are joined; unmasked frames, reserved bits, bad control frames,
    text that is not UTF-8 and messages over ``max_message`` bytes are a
    :class:`RemoteProtocolError`."""

    def __init__(self, max_message: int) -> None:
        self._buf = b""
        self._max = max_message
        self._parts: list[bytes] = []
        self._opcode: int | None = None
        self._size = 0

    def feed(self, data: bytes) -> Iterator[tuple[Any, bytes]]:
        buf = self._buf + data if self._buf else data
        pos = 0
        try:
            while True:
                if len(buf) - pos < 2:
                    break
                b0, b1 = buf[pos], buf[pos + 1]
                fin, rsv, opcode = b0 & 0x80, b0 & 0x70, b0 & 0x0F
                if rsv:
                    raise RemoteProtocolError("WebSocket frame with reserved bits set")
                if b1 & 0x80:
                    raise RemoteProtocolError("masked WebSocket frame from the server")
                length, at = b1 & 0x7F, pos + 2
                if length == 126:
                    if len(buf) - at < 2:
                        break
                    length, at = struct.unpack_from(">H", buf, at)[0], at + 2
                elif length == 127:
                    if len(buf) - at < 8:
                        break
                    length, at = struct.unpack_from(">Q", buf, at)[0], at + 8
                if opcode >= 8:
                    if not fin or length > 125:
                        raise RemoteProtocolError("bad WebSocket control frame")
                elif self._size + length > self._max:
                    raise RemoteProtocolError(f"WebSocket message over {self._max} bytes")
                if len(buf) - at < length:
                    break
                payload, pos = buf[at : at + length], at + length
                if opcode == _OP_PING:
                    yield "ping", payload
                elif opcode == _OP_CLOSE:
                    yield "close", payload
                elif opcode == _OP_PONG:
                    continue
                elif opcode in (_OP_TEXT, _OP_BINARY, _OP_CONT):
                    message = self._data_frame(opcode, bool(fin), payload)
                    if message is not None:
                        yield message
                else:
                    raise RemoteProtocolError(f"unknown WebSocket opcode {opcode}")
        finally:
            self._buf = buf[pos:]

    def _data_frame(self, opcode: int, fin: bool, payload: bytes) -> tuple[bool, bytes] | None:
        if opcode == _OP_CONT:
            if self._opcode is None:
                raise RemoteProtocolError("WebSocket continuation frame out of a message")
        elif self._opcode is not None:
            raise RemoteProtocolError("new WebSocket message inside a fragmented one")
        else:
            self._opcode = opcode
        self._parts.append(payload)
        self._size += len(payload)
        if not fin:
            return None
        whole, binary = b"".join(self._parts), self._opcode == _OP_BINARY
        self._parts, self._opcode, self._size = [], None, 0
        if not binary:
            try:
                whole.decode("utf-8")
            except UnicodeDecodeError:
                raise RemoteProtocolError("WebSocket text message that is not UTF-8") from None
        return binary, whole


class WebSocketChannel(StreamChannel):
    """A WebSocket on ``sock``, opened to ``path`` on ``host``:``port`` by the HTTP upgrade
    (which must be done by ``deadline`` on ``clock``). Units are whole messages,
    ``(is_binary, payload)``; pings are answered, and the server's close frame answered and
    noted (:attr:`peer_closed`). ``max_message`` bounds a message from the server.
    ``OSError``, :class:`RemoteProtocolError` or ``closed_error`` when the upgrade fails."""

    def __init__(
        self,
        sock: socket.socket,
        host: str,
        port: int,
        path: str,
        *,
        max_message: int,
        deadline: float,
        closed_error: type[Exception] = ConnectionError,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sock)
        self._reader = WebSocketReader(max_message)
        self._sent_close = False
        self._early = self._handshake(host, port, path, deadline, clock, closed_error)

    def _handshake(
        self,
        host: str,
        port: int,
        path: str,
        deadline: float,
        clock: Callable[[], float],
        closed_error: type[Exception],
    ) -> bytes:
        key = base64.b64encode(os.urandom(16))
        where = host if ":" not in host else f"[{host}]"
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {where}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode("ascii"))
        response = b""
        while b"\r\n\r\n" not in response:
            remaining = deadline - clock()
            if remaining <= 0:
                raise TimeoutError("no WebSocket handshake reply in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(4096)
            if not chunk:
                raise closed_error("the server closed the connection during the handshake")
            response += chunk
            if len(response) > 65536:
                raise RemoteProtocolError("WebSocket handshake reply too long")
        head, _, rest = response.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)
        if len(status) < 2 or status[1] != "101":
            raise closed_error(f"WebSocket handshake refused: {lines[0]}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        expected = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest()).decode()  # noqa: S324
        if headers.get("sec-websocket-accept") != expected:
            raise RemoteProtocolError("bad Sec-WebSocket-Accept in the handshake reply")
        if headers.get("upgrade", "").lower() != "websocket":
            raise RemoteProtocolError("the handshake reply does not upgrade to websocket")
        if headers.get("sec-websocket-extensions"):
            raise RemoteProtocolError("the server chose an extension we did not offer")
        return rest

    def send(self, units: list[Any]) -> None:
        self.sock.sendall(
            b"".join(ws_frame(_OP_BINARY if binary else _OP_TEXT, data) for binary, data in units)
        )

    def received(self, data: bytes) -> list[Any]:
        messages: list[Any] = []
        for what, payload in self._reader.feed(data):
            if what == "ping":
                with contextlib.suppress(OSError):  # gone: the next read says so
                    self.sock.sendall(ws_frame(_OP_PONG, payload))
            elif what == "close":
                self.peer_closed = True
                if not self._sent_close:
                    self._sent_close = True
                    with contextlib.suppress(OSError):  # a server that did not wait for it
                        self.sock.sendall(ws_frame(_OP_CLOSE, payload[:2]))
                break
            else:
                messages.append((what, payload))
        return messages

    def leftover(self) -> bytes:
        early, self._early = self._early, b""
        return early

    def goodbye(self) -> bool:
        """Start the closing handshake (1000 normal closure)."""
        if not self._sent_close:
            self._sent_close = True
            self.sock.sendall(ws_frame(_OP_CLOSE, struct.pack(">H", 1000)))
        return True
