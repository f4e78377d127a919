"""The blocking STMP client — over TCP (binary serialization) or WebSocket (text
serialization, on a small RFC 6455 client written here on a plain socket: no reactor, no
extra dependency) — and what both STMP clients share: errors, :class:`Delivery`, request
ids, request payloads, the version check. :mod:`msgbroker.plugins.stmp.client` re-exports
everything here; import from there.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Container, Iterator
from typing import Any

from attrs import frozen

from msgbroker.errors import RemoteProtocolError

from . import codec, payloads
from .codec import Encoding, Message, Notify, Ping, Request, Response, Status

DEFAULT_PORT = 4445
DEFAULT_WS_PORT = 4446
#: heartbeat interval (s): a ping every interval; the connection is given up after two
#: intervals without hearing anything from the server
HEARTBEAT = 30.0
#: default request timeout (s): a little over the broker's 30 s route timeout, so its 0x34
#: GatewayTimeout arrives before the client gives up with a local 0x25
REQUEST_TIMEOUT = 35.0
#: versions offered in the version check, preferred first
VERSIONS: tuple[tuple[int, int], ...] = (codec.VERSION,)
#: a timed-out request's id is not reused for this long (s), unless its late reply came
LATE_REPLY_WINDOW = 300.0

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_WS_PORT",
    "HEARTBEAT",
    "REQUEST_TIMEOUT",
    "BlockingSTMPClient",
    "Delivery",
    "STMPConnectionClosed",
    "STMPError",
    "status_name",
]


# -- errors --------------------------------------------------------------------------------------


def status_name(status: int) -> str:
    """``0x21`` -> ``"Unauthorized"``; user-defined statuses (0x80-0xFF) -> ``"status 0x80"``."""
    try:
        name = Status(status).name
    except ValueError:
        return f"status {status:#04x}"
    return "".join(part.capitalize() for part in name.split("_"))


class STMPError(Exception):
    """A request was answered with ``status`` other than Ok. ``payload`` is the reply's
    payload decoded by its encoding (e.g. ``{"schemes": [...]}`` for a refused login),
    the raw bytes if it does not decode, or ``None`` when there is none. ``local`` is True
    for the 0x25 RequestTimeout the client reports itself when no reply came in time."""

    def __init__(self, status: int, payload: Any = None, local: bool = False) -> None:
        super().__init__(status, payload)
        self.status = status
        self.payload = payload
        self.local = local

    def __str__(self) -> str:
        text = f"{self.status:#04x} {status_name(self.status)}"
        if self.local:
            text += " (no reply in time)"
        if self.payload is not None and self.payload != b"":
            shown = self.payload
            if isinstance(shown, bytes):
                shown = shown.decode("utf-8", "backslashreplace")
            elif not isinstance(shown, str):
                try:
                    shown = json.dumps(shown, ensure_ascii=False)
                except (TypeError, ValueError):
                    shown = repr(shown)
            text += f": {shown}"
        return text


class STMPConnectionClosed(ConnectionError):
    """The connection ended (or was never usable) before the request was answered."""


# -- what both clients share -------------------------------------------------------------------


@frozen
class Delivery:
    """A message the broker routed to this client (notify ``0.0.1.16``): ``kind`` is
    ``mcast``, ``ucast``, ``bcast``, or the presence events ``subscribe``/``unsubscribe``
    (``data`` is ``b""`` for those); ``topic`` is ``None`` for unicasts and broadcasts."""

    sender: str
    kind: str
    topic: str | None
    data: bytes


def delivery_of(notify: Notify) -> Delivery:
    """The :class:`Delivery` a ``0.0.1.16`` notify carries; ``ValueError`` if it is not one."""
    if notify.action != payloads.DELIVERY:
        raise ValueError(f"action {codec.action_to_str(notify.action)} is not a delivery")
    fields = payloads.decode_payload(notify.payload, notify.encoding)
    return Delivery(*payloads.parse_delivery(fields, notify.encoding))


def request_message(
    ident: int, action: int | str, payload: Any, encoding: int | None, default: int
) -> Request:
    """A request carrying ``payload``: ``None`` is no payload (encoding 0); bytes go as they
    are (already encoded) with ``encoding`` (default: raw); anything else is serialized
    with ``encoding`` (default: ``default``). ``ValueError`` for a bad action or payload."""
    number = codec.parse_action(action)
    if payload is None:
        return Request(ident, number, Encoding.NONE, b"")
    if isinstance(payload, bytes | bytearray | memoryview):
        chosen = Encoding.RAW if encoding is None else encoding
        if chosen == Encoding.NONE:
            raise ValueError("encoding 0 carries no payload")
        return Request(ident, number, chosen, bytes(payload))
    chosen = default if encoding is None else encoding
    return Request(ident, number, chosen, payloads.encode_payload(payload, chosen))


def decoded(response: Response) -> Any:
    """A reply's payload decoded by its encoding (``None`` when it has none); raw bytes if
    it does not decode."""
    if response.encoding == Encoding.NONE:
        return None
    try:
        return payloads.decode_payload(response.payload, response.encoding)
    except ValueError:
        return response.payload


def result_of(response: Response) -> Any:
    """The decoded payload of an Ok reply; :class:`STMPError` for any other status."""
    if response.status != Status.OK:
        raise STMPError(response.status, decoded(response))
    return decoded(response)


def timed_out(ident: int) -> Response:
    """The reply a client reports for a request that got none in time."""
    return Response(ident, Status.REQUEST_TIMEOUT)


def version_request(text: bool) -> tuple[Request, bool]:
    """The version check (id 0, action 0, raw list of :data:`VERSIONS`) and whether the
    text serialization must send it inline."""
    return Request(
        0, codec.ACTION_VERSION, Encoding.RAW, codec.encode_versions(list(VERSIONS), text)
    ), text


def accepted_version(response: Response, text: bool) -> tuple[int, int]:
    """The version the server chose, from its reply to the version check. ``STMPError``
    for a refusal (0x35 VersionNotSupported, or any other status); ``RemoteProtocolError``
    for an Ok without one of the versions offered. In text mode the list is hex, whether
    it came inline or in a binary frame; a binary list is accepted too."""
    if response.status != Status.OK:
        raise STMPError(response.status, decoded(response))
    versions: list[tuple[int, int]] = []
    if text:
        try:
            versions = codec.decode_versions(response.payload, text=True)
        except RemoteProtocolError:
            versions = codec.decode_versions(response.payload)
    else:
        versions = codec.decode_versions(response.payload)
    if len(versions) != 1 or versions[0] not in VERSIONS:
        raise RemoteProtocolError(f"the server chose a version not offered: {versions}")
    return versions[0]


class RequestIds:
    """Request ids: u16, 1 to 65535 then 1 again (0 is the version check's), never one
    that is ``busy`` (a pending request's, or a timed-out one still waiting out its late
    reply)."""

    def __init__(self) -> None:
        self._next = 1

    def take(self, busy: Container[int]) -> int:
        for _ in range(0xFFFF):
            ident = self._next
            self._next = ident % 0xFFFF + 1
            if ident not in busy:
                return ident
        raise STMPError(Status.TOO_MANY_REQUESTS, "all 65535 request ids are in use", local=True)


class LateReplies:
    """Ids of requests that timed out: their late replies are dropped, and the ids are not
    reused until that reply came or :data:`LATE_REPLY_WINDOW` passed."""

    def __init__(self, window: float = LATE_REPLY_WINDOW) -> None:
        self.window = window
        self._until: dict[int, float] = {}

    def add(self, ident: int, now: float) -> None:
        self._expire(now)
        self._until[ident] = now + self.window

    def claim(self, ident: int) -> bool:
        """True (and forgotten) if ``ident`` is a timed-out request's."""
        return self._until.pop(ident, None) is not None

    def __contains__(self, ident: object) -> bool:
        return ident in self._until

    def _expire(self, now: float) -> None:
        if self._until and min(self._until.values()) <= now:
            self._until = {k: t for k, t in self._until.items() if t > now}


def login_fields(identity: str, scheme: str, credential: bytes | str | None) -> dict[str, Any]:
    """The login payload; the credential travels as text (a secret is text), so bytes must
    be UTF-8."""
    fields: dict[str, Any] = {"id": identity, "scheme": scheme}
    if credential is not None:
        if isinstance(credential, bytes):
            try:
                credential = credential.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("the credential must be UTF-8 text") from None
        fields["credential"] = credential
    return fields


def structured(encoding: int) -> int:
    if encoding not in payloads.STRUCTURED:
        raise ValueError(f"the broker actions need JSON or msgpack, not encoding {encoding}")
    return encoding


# -- wires: bytes <-> messages ----------------------------------------------------------------


class _TCPWire:
    """Binary serialization with PS on a stream socket."""

    text = False

    def __init__(self, sock: socket.socket, max_payload: int) -> None:
        self.sock = sock
        self._decoder = codec.BinaryDecoder(max_payload)

    def send(self, message: Message, inline: bool | None = None) -> None:
        self.sock.sendall(codec.encode_binary(message))

    def feed(self, data: bytes) -> list[Message]:
        return list(self._decoder.feed(data))

    def goodbye(self) -> None:
        pass


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


class _WebSocketWire:
    """STMP over a WebSocket (RFC 6455 client on a plain or TLS socket): text frames (a
    binary payload as a second, binary frame), or binary frames when ``binary_frames``."""

    def __init__(
        self,
        sock: socket.socket,
        host: str,
        port: int,
        path: str,
        max_payload: int,
        binary_frames: bool,
        deadline: float,
    ) -> None:
        self.sock = sock
        self.text = not binary_frames
        self.closed_by_server = False
        self._decoder = codec.TextDecoder(max_payload)
        self._reader = WebSocketReader(max_payload + 64)
        self._sent_close = False
        rest = self._handshake(host, port, path, deadline)
        self._early = rest

    def _handshake(self, host: str, port: int, path: str, deadline: float) -> bytes:
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no WebSocket handshake reply in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(4096)
            if not chunk:
                raise STMPConnectionClosed("the server closed the connection during the handshake")
            response += chunk
            if len(response) > 65536:
                raise RemoteProtocolError("WebSocket handshake reply too long")
        head, _, rest = response.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)
        if len(status) < 2 or status[1] != "101":
            raise STMPConnectionClosed(f"WebSocket handshake refused: {lines[0]}")
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

    def send(self, message: Message, inline: bool | None = None) -> None:
        if not self.text:
            self.sock.sendall(ws_frame(_OP_BINARY, codec.encode_binary(message, with_ps=False)))
            return
        text, followup = codec.encode_text(message, inline)
        frames = ws_frame(_OP_TEXT, text.encode("utf-8"))
        if followup is not None:
            frames += ws_frame(_OP_BINARY, followup)
        self.sock.sendall(frames)

    def feed(self, data: bytes) -> list[Message]:
        if self._early:
            data, self._early = self._early + data, b""
        messages: list[Message] = []
        for what, payload in self._reader.feed(data):
            if what == "ping":
                self.sock.sendall(ws_frame(_OP_PONG, payload))
            elif what == "close":
                self.closed_by_server = True
                if not self._sent_close:
                    self._sent_close = True
                    self.sock.sendall(ws_frame(_OP_CLOSE, payload[:2]))
                break
            elif what:  # binary frame
                messages.append(self._decoder.binary_frame(payload))
            else:
                message = self._decoder.text_frame(payload.decode("utf-8"))
                if message is not None:
                    messages.append(message)
        return messages

    def pending_bytes(self) -> bytes:
        early, self._early = self._early, b""
        return early

    def goodbye(self) -> None:
        """Start the closing handshake (1000 normal closure)."""
        if not self._sent_close:
            self._sent_close = True
            self.sock.sendall(ws_frame(_OP_CLOSE, struct.pack(">H", 1000)))


# -- the blocking client ------------------------------------------------------------------------


class BlockingSTMPClient:
    """A blocking STMP client over TCP (binary) or WebSocket (``ws=True``: text frames, or
    binary frames with ``binary_frames=True``), plain or TLS (``ssl_context``). The version
    check runs on construction, then the login when ``identity`` is given. Not thread-safe.

    :meth:`request` sends any request and returns the :class:`Response`; when none came
    within ``timeout`` it returns a local ``0x25`` RequestTimeout reply and the late reply
    is dropped when it comes (the connection stays usable). :meth:`call` and the broker
    actions (:meth:`login`, :meth:`subscribe`, :meth:`publish`, ...) return the decoded
    reply payload and raise :class:`STMPError` for any status but Ok (0x25 included).
    Deliveries and other notifies that arrive meanwhile are queued for
    :meth:`next_delivery` / :meth:`next_notify`.

    The heartbeat runs whenever the client reads: it pings every ``heartbeat`` seconds and
    gives up after two intervals without a byte from the server. A program that does not
    read for longer than that should call :meth:`poll` now and then.
    """

    def __init__(
        self,
        host: str,
        port: int | None = None,
        identity: str | None = None,
        scheme: str = "open",
        credential: bytes | str | None = None,
        *,
        ws: bool = False,
        path: str = "/",
        binary_frames: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        encoding: int = Encoding.JSON,
        timeout: float = REQUEST_TIMEOUT,
        heartbeat: float | None = HEARTBEAT,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self.encoding = structured(encoding)
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.identity: str | None = None
        self.stmp_version: tuple[int, int] | None = None
        self.closed = False
        #: pings received from the server
        self.pings_received = 0
        #: late replies dropped (their request had timed out)
        self.late_replies = 0
        port = port if port is not None else (DEFAULT_WS_PORT if ws else DEFAULT_PORT)
        self._deliveries: deque[Delivery] = deque()
        self._notifies: deque[Notify] = deque()
        self._ids = RequestIds()
        self._late = LateReplies()
        self._waiting: int | None = None
        self._reply: Response | None = None
        deadline = time.monotonic() + timeout
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
            self._wire: _TCPWire | _WebSocketWire
            if ws:
                self._wire = _WebSocketWire(
                    sock, host, port, path, max_payload, binary_frames, deadline
                )
            else:
                self._wire = _TCPWire(sock, max_payload)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        now = time.monotonic()
        self._last_heard = self._last_ping = now
        try:
            early = self._wire.pending_bytes() if isinstance(self._wire, _WebSocketWire) else b""
            if early:
                self._handle_bytes(early)
            self.stmp_version = self._check_version()
            if identity is not None:
                self.login(identity, scheme, credential)
        except BaseException:
            self._shut()
            raise

    def __enter__(self) -> BlockingSTMPClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Send a request to ``action`` (an int or dotted ``"a.b.c.d"``) and wait for its
        reply. ``payload``: ``None`` (none), bytes (sent as they are, encoding ``encoding``
        or raw) or a value (serialized with ``encoding``, default the client's). A local
        ``Response(id, 0x25)`` when no reply came within ``timeout``."""
        return self._exchange(action, payload, encoding, timeout)[0]

    def call(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """:meth:`request`, then the decoded reply payload (``None`` if none);
        :class:`STMPError` unless the status is Ok (``local`` set for a timeout)."""
        response, local = self._exchange(action, payload, encoding, timeout)
        if local:
            raise STMPError(Status.REQUEST_TIMEOUT, None, local=True)
        return result_of(response)

    def _exchange(
        self, action: int | str, payload: Any, encoding: int | None, timeout: float | None
    ) -> tuple[Response, bool]:
        """(reply, True if it is the local 0x25)."""
        message = request_message(0, action, payload, encoding, self.encoding)
        ident = self._ids.take(self._late)
        self._send(Request(ident, message.action, message.encoding, message.payload))
        self._waiting, self._reply = ident, None
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            while self._reply is None:
                if not self._receive(deadline):
                    self._late.add(ident, time.monotonic())
                    return timed_out(ident), True
            return self._reply, False
        finally:
            self._waiting, self._reply = None, None

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | str | None = None
    ) -> None:
        self.call(payloads.LOGIN, login_fields(identity, scheme, credential))
        self.identity = identity

    def subscribe(self, topic: str, presence: bool = False) -> None:
        fields: dict[str, Any] = {"topic": topic}
        if presence:
            fields["presence"] = True
        self.call(payloads.SUBSCRIBE, fields)

    def unsubscribe(self, topic: str) -> None:
        self.call(payloads.UNSUBSCRIBE, {"topic": topic})

    def publish(self, topic: str, data: bytes) -> None:
        self.call(payloads.PUBLISH, {"topic": topic, **payloads.data_fields(data, self.encoding)})

    def unicast(self, to: str, data: bytes) -> None:
        self.call(payloads.UNICAST, {"to": to, **payloads.data_fields(data, self.encoding)})

    def broadcast(self, data: bytes) -> None:
        self.call(payloads.BROADCAST, payloads.data_fields(data, self.encoding))

    def notify(self, action: int | str, payload: Any = None, encoding: int | None = None) -> None:
        """Send a notify (no reply)."""
        message = request_message(0, action, payload, encoding, self.encoding)
        self._send(Notify(message.action, message.encoding, message.payload))

    def ping(self) -> None:
        """Send a heartbeat ping now (the server does not answer it)."""
        self._send(codec.PING)
        self._last_ping = time.monotonic()

    def close(self) -> None:
        """Close the connection (over WebSocket with the closing handshake, waiting up to 2 s
        for the server's close). Never raises; does nothing when already closed."""
        if self.closed:
            return
        try:
            if isinstance(self._wire, _WebSocketWire):
                self._wire.goodbye()
                deadline = time.monotonic() + min(self.timeout, 2.0)
                while not self._wire.closed_by_server and self._receive(deadline):
                    pass
        except (OSError, STMPConnectionClosed, RemoteProtocolError):
            pass
        finally:
            self._shut()

    # -- incoming ----------------------------------------------------------------------------

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery (queued or read now), or ``None`` after ``timeout`` seconds
        (``None``: wait as long as it takes; ``0``: only what was already read). Raises
        :class:`STMPConnectionClosed` if the connection ends."""
        return self._next(self._deliveries, timeout)

    def next_notify(self, timeout: float | None = None) -> Notify | None:
        """The next notify that is not a delivery (a plugin's), like :meth:`next_delivery`."""
        return self._next(self._notifies, timeout)

    def deliveries(self) -> Iterator[Delivery]:
        """Every delivery, as it arrives, until the connection ends (which raises)."""
        while True:
            delivery = self.next_delivery()
            if delivery is not None:
                yield delivery

    def poll(self) -> None:
        """Handle whatever already arrived and send the heartbeat if due, without waiting.
        Raises :class:`STMPConnectionClosed` if the connection ended."""
        while self._receive(time.monotonic(), poll=True):
            pass

    def _next(self, queue: deque[Any], timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not queue:
            if not self._receive(deadline):
                return None
        return queue.popleft()

    # -- plumbing ----------------------------------------------------------------------------

    def _check_version(self) -> tuple[int, int]:
        message, inline = version_request(self._wire.text)
        self._send(message, inline)
        self._waiting, self._reply = 0, None
        deadline = time.monotonic() + self.timeout
        try:
            while self._reply is None:
                if not self._receive(deadline):
                    raise STMPError(
                        Status.REQUEST_TIMEOUT, "no reply to the version check", local=True
                    )
            return accepted_version(self._reply, self._wire.text)
        finally:
            self._waiting, self._reply = None, None

    def _send(self, message: Message, inline: bool | None = None) -> None:
        if self.closed:
            raise STMPConnectionClosed("the connection is closed")
        try:
            self._wire.send(message, inline)
        except OSError as e:
            self._shut()
            raise STMPConnectionClosed(f"cannot send: {e}") from e

    def _receive(self, deadline: float | None, poll: bool = False) -> bool:
        """Read and handle one chunk; False if ``deadline`` passed first (``poll``: read
        only what is there). Sends the heartbeat ping when due."""
        while True:
            if self.closed:
                raise STMPConnectionClosed("the connection is closed")
            now = time.monotonic()
            wake = self._beat(now)
            if deadline is not None and now >= deadline and not poll:
                return False
            wait: float | None = 0.0
            if not poll:
                wakes = [t for t in (wake, deadline) if t is not None]
                wait = max(min(wakes) - now, 0.001) if wakes else None
            self._sock.settimeout(wait)
            try:
                data = self._sock.recv(65536)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                if poll:
                    return False
                continue
            except OSError as e:
                self._shut()
                raise STMPConnectionClosed(f"connection lost: {e}") from e
            if not data:
                self._shut()
                raise STMPConnectionClosed("the broker closed the connection")
            self._handle_bytes(data)
            return True

    def _handle_bytes(self, data: bytes) -> None:
        self._last_heard = time.monotonic()
        try:
            for message in self._wire.feed(data):
                self._handle(message)
        except RemoteProtocolError as e:
            self._shut()
            raise STMPConnectionClosed(f"protocol error from the broker: {e}") from e
        if isinstance(self._wire, _WebSocketWire) and self._wire.closed_by_server:
            self._shut()
            if self._waiting is None or self._reply is None:
                raise STMPConnectionClosed("the broker closed the connection")

    def _beat(self, now: float) -> float | None:
        """Ping or give up as due; when to check again (None: no heartbeat)."""
        interval = self.heartbeat
        if not interval:
            return None
        if now - self._last_heard >= 2 * interval:
            self._shut()
            raise STMPConnectionClosed(f"nothing from the broker for {2 * interval:g} s")
        if now - self._last_ping >= interval:
            self.ping()
        return min(self._last_ping + interval, self._last_heard + 2 * interval)

    def _handle(self, message: Message) -> None:
        kind = type(message)
        if kind is Response:
            assert isinstance(message, Response)
            if message.id == self._waiting and self._reply is None:
                self._reply = message
            elif self._late.claim(message.id):
                self.late_replies += 1
            # else: a reply to nothing we asked; ignored
        elif kind is Notify:
            assert isinstance(message, Notify)
            if message.action == payloads.DELIVERY:
                with contextlib.suppress(ValueError):  # a malformed delivery is dropped
                    self._deliveries.append(delivery_of(message))
            else:
                self._notifies.append(message)
        elif kind is Ping:
            self.pings_received += 1
        elif kind is Request:
            assert isinstance(message, Request)
            self._send(Response(message.id, Status.NOT_FOUND))

    def _shut(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()
