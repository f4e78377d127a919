"""Independent blocking client adapters, one per protocol, for the interop matrix.

Each adapter speaks its protocol on a raw socket with the sans-IO codecs only (never the
client libraries), so the matrix checks what actually crosses the wire. They share one
interface (:class:`Peer`):

- requests — ``login``, ``subscribe``, ``unsubscribe``, ``publish`` (``publish_many``
  pipelines several in one write), ``unicast``, ``broadcast`` — send, then wait for the
  broker's answer, raising :class:`Refused` for an error answer;
- ``next_event(timeout)`` — the next delivery, normalized to an :class:`Event`;
- ``sync()`` — unicast a marker to oneself and return every event that arrived before it:
  the broker handles one connection's requests in order, so anything it routed to this peer
  before is in the stream ahead of the marker. ``sync() == []`` proves "nothing more came"
  without waiting for a silence;
- ``wait_closed(timeout)`` — read until the broker closes the connection;
- ``close()`` — drop the connection (no goodbye: a network loss, as far as the broker knows).

A new protocol is one new :class:`Peer` subclass plus one line in :data:`PEERS`; its
``carries`` says which messages the protocol can carry, and the matrix derives the expected
skips from it.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import socket
import time
from collections import deque
from typing import Any, ClassVar

from attrs import frozen

from msgbroker.plugins.ssmp import codec as ssmp
from msgbroker.plugins.stmp import codec as stmp
from msgbroker.plugins.stmp import payloads as stmp_payloads
from msgbroker.plugins.stmp.codec import Encoding, Notify, Request, Response, Status
from tests.ssmp.e2e_support import parse_address

#: how long an adapter waits for anything the broker should do promptly
WAIT = 10.0

_markers = itertools.count(1)


@frozen
class Event:
    """A delivery, whatever the protocol: ``kind`` is mcast/ucast/bcast/subscribe/
    unsubscribe; ``topic`` is None for ucast and bcast; ``data`` is b"" for presence."""

    sender: str
    kind: str
    topic: str | None
    data: bytes = b""


class Refused(Exception):
    """The broker answered a request with an error (``code``: SSMP code or STMP status)."""

    def __init__(self, code: int, what: str) -> None:
        super().__init__(f"{what}: refused with {code:#x}" if code < 100 else f"{what}: {code}")
        self.code = code


class Closed(Exception):
    """The broker closed the connection."""


class Peer:
    """The common part: a blocking socket, a queue of events, replies matched to requests."""

    #: the name in the matrix (and in pytest ids)
    name: ClassVar[str]
    #: the broker listener this adapter connects to, and the endpoint the matrix gives it
    listener: ClassVar[str]
    endpoint: ClassVar[str] = "tcp:0:interface=127.0.0.1"
    #: the answer to a unicast whose target is not logged in
    NOT_FOUND: ClassVar[int]

    def __init__(self, address: str) -> None:
        """Connect to ``address``, where the broker says the listener is bound
        (``tcp:127.0.0.1:4444``)."""
        self.sock = self._connect(address)
        self.identity: str | None = None
        self.closed = False
        self._events: deque[Event] = deque()
        self._replies: dict[int, int] = {}  # request token -> answer code (0/200 = ok)

    def _connect(self, address: str) -> socket.socket:
        host, port = parse_address(address)
        sock = socket.create_connection((host, port), timeout=WAIT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    # -- what a protocol can carry -----------------------------------------------------------

    @classmethod
    def carries(cls, sender: str, topic: str | None, data: bytes) -> bool:
        """Whether a message from ``sender`` on ``topic`` (None: ucast/bcast) with ``data``
        can reach a client of this protocol."""
        return True

    # -- requests ------------------------------------------------------------------------------

    def login(self, identity: str) -> None:
        self._call([("login", identity)])
        self.identity = identity

    def subscribe(self, topic: str, presence: bool = False) -> None:
        self._call([("subscribe", topic, presence)])

    def unsubscribe(self, topic: str) -> None:
        self._call([("unsubscribe", topic)])

    def publish(self, topic: str, data: bytes) -> None:
        self._call([("publish", topic, data)])

    def publish_many(self, topic: str, items: list[bytes]) -> None:
        """Publish every item, pipelined in one write; then wait for every answer."""
        self._call([("publish", topic, data) for data in items])

    def publish_and_close(self, topic: str, data: bytes) -> None:
        """Write a publish and drop the connection at once, without waiting for the answer."""
        self._write(self._encode("publish", topic, data)[1])
        self.close()

    def unicast(self, to: str, data: bytes) -> None:
        self._call([("unicast", to, data)])

    def broadcast(self, data: bytes) -> None:
        self._call([("broadcast", data)])

    def _call(self, requests: list[tuple[Any, ...]]) -> None:
        tokens, wire = [], []
        for request in requests:
            token, data = self._encode(*request)
            tokens.append(token)
            wire.append(data)
        self._write(b"".join(wire))
        deadline = time.monotonic() + WAIT
        for token, request in zip(tokens, requests, strict=True):
            while token not in self._replies:
                self._read(deadline, f"the answer to {request[0]}")
            code = self._replies.pop(token)
            if code not in (0, 200):
                raise Refused(code, request[0])

    # -- events --------------------------------------------------------------------------------

    def next_event(self, timeout: float = WAIT) -> Event:
        deadline = time.monotonic() + timeout
        while not self._events:
            self._read(deadline, "an event")
        return self._events.popleft()

    def events(self, count: int, timeout: float = WAIT) -> list[Event]:
        deadline = time.monotonic() + timeout
        return [self.next_event(max(deadline - time.monotonic(), 0.001)) for _ in range(count)]

    def sync(self) -> list[Event]:
        """Every event that arrives before a marker this peer unicasts to itself."""
        assert self.identity is not None, "sync needs a logged-in peer"
        marker = b"sync-marker-%d" % next(_markers)
        self.unicast(self.identity, marker)
        before = []
        while True:
            event = self.next_event()
            if event == Event(self.identity, "ucast", None, marker):
                return before
            before.append(event)

    def wait_closed(self, timeout: float = WAIT) -> None:
        """Read (keeping events) until the broker closes the connection."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._read(deadline, "the close")
        except Closed:
            return

    def close(self) -> None:
        """Drop the connection without a goodbye."""
        self.closed = True
        self.sock.close()

    # -- input ---------------------------------------------------------------------------------

    def _read(self, deadline: float, what: str) -> None:
        if self.closed:
            raise Closed(f"connection closed while waiting for {what}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{self.name}: no {what} within {WAIT} s")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError(f"{self.name}: no {what} in time") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            self.sock.close()
            raise Closed(f"connection closed while waiting for {what}")
        self._feed(data)

    # -- per protocol ----------------------------------------------------------------------------

    def _encode(self, action: str, *args: Any) -> tuple[int, bytes]:
        """(token the answer is filed under, wire bytes) of one request."""
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _feed(self, data: bytes) -> None:
        """Decode what arrived: events into ``_events``, answers into ``_replies``."""
        raise NotImplementedError


# -- SSMP 1.1 -------------------------------------------------------------------------------------


class SSMPPeer(Peer):
    """SSMP over TCP. Answers come in request order, so the token is a sequence number."""

    name = "ssmp"
    listener = "ssmp"
    NOT_FOUND = 404

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._decoder = ssmp.ReplyDecoder()
        self._sent = 0
        self._answered = 0

    @classmethod
    def carries(cls, sender: str, topic: str | None, data: bytes) -> bool:
        return (
            ssmp.is_valid_id(sender)
            and (topic is None or ssmp.is_valid_id(topic))
            and 0 < len(data) <= ssmp.MAX_PAYLOAD
        )

    def _encode(self, action: str, *args: Any) -> tuple[int, bytes]:
        if action == "login":
            wire = ssmp.login(args[0], "open")
        else:
            wire = {
                "subscribe": ssmp.subscribe,
                "unsubscribe": ssmp.unsubscribe,
                "publish": ssmp.mcast,
                "unicast": ssmp.ucast,
                "broadcast": ssmp.bcast,
            }[action](*args)
        self._sent += 1
        return self._sent, wire

    def _feed(self, data: bytes) -> None:
        for message in self._decoder.feed(data):
            if isinstance(message, ssmp.Reply):
                self._answered += 1
                self._replies[self._answered] = message.code
            elif isinstance(message, ssmp.Delivery):
                kind = message.kind.lower()
                topic = message.to if kind == "mcast" else None
                self._events.append(Event(message.sender, kind, topic, message.payload))
            elif isinstance(message, ssmp.Presence):
                kind = "subscribe" if message.subscribed else "unsubscribe"
                self._events.append(Event(message.sender, kind, message.topic))
            elif isinstance(message, ssmp.ServerPing):
                self._write(ssmp.pong())


# -- STMP 0.1, binary over TCP --------------------------------------------------------------------

_STMP_ACTIONS = {
    "login": stmp_payloads.LOGIN,
    "subscribe": stmp_payloads.SUBSCRIBE,
    "unsubscribe": stmp_payloads.UNSUBSCRIBE,
    "publish": stmp_payloads.PUBLISH,
    "unicast": stmp_payloads.UNICAST,
    "broadcast": stmp_payloads.BROADCAST,
}


class STMPPeer(Peer):
    """STMP binary over TCP: version check on connect, then the built-in actions with JSON
    (or, in a subclass, msgpack) payloads; the token is the request id."""

    name = "stmp"
    listener = "stmp"
    NOT_FOUND = Status.NOT_FOUND
    encoding: ClassVar[int] = Encoding.JSON

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._ids = itertools.cycle(range(1, 0x10000))  # 0 is the version check's
        self._start(address)
        self._version_check()

    def _start(self, address: str) -> None:
        self._decoder = stmp.BinaryDecoder()

    def _version_check(self) -> None:
        """Offer 0.1; the broker must choose it (request id 0, action 0, raw payload)."""
        self._write(self._frames(Request(0, 0, Encoding.RAW, self._versions()), inline=True))
        deadline = time.monotonic() + WAIT
        while 0 not in self._replies:
            self._read(deadline, "the version check's answer")
        status = self._replies.pop(0)
        if status != Status.OK or self._chosen != self._versions():
            raise Refused(status, f"version check (chose {self._chosen!r})")

    def _versions(self) -> bytes:
        return stmp.encode_versions([(0, 1)])

    def _frames(self, message: stmp.Message, inline: bool | None = None) -> bytes:
        return stmp.encode_binary(message)

    def _data(self, data: bytes) -> dict[str, Any]:
        if self.encoding == Encoding.MSGPACK:
            return {"data": data}
        try:
            return {"data": data.decode("utf-8")}
        except UnicodeDecodeError:
            return {"data_b64": base64.b64encode(data).decode("ascii")}

    def _encode(self, action: str, *args: Any) -> tuple[int, bytes]:
        fields: dict[str, Any]
        if action == "login":
            fields = {"id": args[0], "scheme": "open"}
        elif action == "subscribe":
            fields = {"topic": args[0], "presence": True} if args[1] else {"topic": args[0]}
        elif action == "unsubscribe":
            fields = {"topic": args[0]}
        elif action == "publish":
            fields = {"topic": args[0], **self._data(args[1])}
        elif action == "unicast":
            fields = {"to": args[0], **self._data(args[1])}
        else:
            fields = self._data(args[0])
        ident = next(self._ids)
        payload = stmp_payloads.encode_payload(fields, self.encoding)
        return ident, self._frames(Request(ident, _STMP_ACTIONS[action], self.encoding, payload))

    def _feed(self, data: bytes) -> None:
        for message in self._decoder.feed(data):
            self._message(message)

    _chosen: bytes | None = None

    def _message(self, message: stmp.Message) -> None:
        if isinstance(message, Response):
            if message.id == 0:
                self._chosen = message.payload
            self._replies[message.id] = message.status
        elif isinstance(message, Notify) and message.action == stmp_payloads.DELIVERY:
            fields = stmp_payloads.decode_payload(message.payload, message.encoding)
            sender, kind, topic, payload = stmp_payloads.parse_delivery(fields, message.encoding)
            self._events.append(Event(sender, kind, topic, payload))
        # pings: activity only (the tests are far shorter than the heartbeat interval)


class STMPMsgpackPeer(STMPPeer):
    name = "stmp+msgpack"
    encoding = Encoding.MSGPACK


# -- STMP 0.1 over WebSocket (RFC 6455 by hand) ---------------------------------------------------

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def ws_client_frame(opcode: int, payload: bytes) -> bytes:
    """One masked, unfragmented client frame."""
    size = len(payload)
    if size < 126:
        head = bytes((0x80 | opcode, 0x80 | size))
    elif size < 1 << 16:
        head = bytes((0x80 | opcode, 0x80 | 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + size.to_bytes(8, "big")
    mask = os.urandom(4)
    key = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
    return head + mask + masked


class STMPWebSocketPeer(STMPPeer):
    """STMP text serialization over WebSocket: requests as text frames (a binary payload as
    a text header plus a binary frame), server frames decoded by hand and paired by
    :class:`~msgbroker.plugins.stmp.codec.TextDecoder`."""

    name = "stmp-ws"
    listener = "stmp-ws"

    def _start(self, address: str) -> None:
        host, port = parse_address(address)
        key = base64.b64encode(os.urandom(16))
        self._write(
            b"GET /stmp HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (host.encode(), port, key)
        )
        response = b""
        deadline = time.monotonic() + WAIT
        while b"\r\n\r\n" not in response:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = self.sock.recv(4096)
            if not chunk:
                raise Closed(f"handshake refused: {response!r}")
            response += chunk
        head, _, self._buf = response.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.split(b":", 1) for line in lines[1:])
        headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
        accept = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())
        if lines[0].split(b" ")[1:2] != [b"101"] or headers.get(b"sec-websocket-accept") != accept:
            raise Closed(f"bad handshake answer: {head!r}")
        self._decoder_text = stmp.TextDecoder()
        self._fragments: list[bytes] = []
        self._fragment_op = 0
        self._closing = False

    def _versions(self) -> bytes:
        return stmp.encode_versions([(0, 1)], text=True)

    def _frames(self, message: stmp.Message, inline: bool | None = None) -> bytes:
        text, follow = stmp.encode_text(message, inline)
        frames = ws_client_frame(_OP_TEXT, text.encode("utf-8"))
        if follow is not None:
            frames += ws_client_frame(_OP_BINARY, follow)
        return frames

    def _feed(self, data: bytes) -> None:
        buf = self._buf + data
        while len(buf) >= 2:
            first, second = buf[0], buf[1]
            if second & 0x80:
                raise AssertionError("the server masked a frame (RFC 6455 5.1 forbids it)")
            size, pos = second & 0x7F, 2
            if size == 126:
                if len(buf) < 4:
                    break
                size, pos = int.from_bytes(buf[2:4], "big"), 4
            elif size == 127:
                if len(buf) < 10:
                    break
                size, pos = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < pos + size:
                break
            payload, buf = buf[pos : pos + size], buf[pos + size :]
            self._frame(first & 0x80 != 0, first & 0x0F, payload)
        self._buf = buf

    def _frame(self, fin: bool, opcode: int, payload: bytes) -> None:
        if opcode == _OP_CLOSE:
            if not self._closing:  # answer the close handshake; the server then hangs up
                self._closing = True
                self._write(ws_client_frame(_OP_CLOSE, payload[:2]))
            return
        if opcode == _OP_PING:
            self._write(ws_client_frame(_OP_PONG, payload))
            return
        if opcode == _OP_PONG:
            return
        if opcode != _OP_CONT:
            self._fragment_op = opcode
        self._fragments.append(payload)
        if not fin:
            return
        whole, self._fragments = b"".join(self._fragments), []
        if self._fragment_op == _OP_TEXT:
            message = self._decoder_text.text_frame(whole.decode("utf-8"))
            if message is None:  # a header: its payload is the next (binary) frame
                return
        else:
            message = self._decoder_text.binary_frame(whole)
        self._message(message)


class STMPWebSocketMsgpackPeer(STMPWebSocketPeer):
    name = "stmp-ws+msgpack"
    encoding = Encoding.MSGPACK


class STMPWebSocketBinaryFramePeer(STMPWebSocketPeer):
    """STMP over WebSocket with binary frames: each request is one binary-serialized message
    without PS in one binary frame (so are the answers and deliveries)."""

    name = "stmp-ws+frames"

    def _versions(self) -> bytes:
        return stmp.encode_versions([(0, 1)])

    def _frames(self, message: stmp.Message, inline: bool | None = None) -> bytes:
        return ws_client_frame(_OP_BINARY, stmp.encode_binary(message, with_ps=False))


#: the matrix: every protocol the broker speaks, one adapter each
PEERS: dict[str, type[Peer]] = {
    cls.name: cls
    for cls in (
        SSMPPeer,
        STMPPeer,
        STMPWebSocketPeer,
    )
}
#: variants, run against every protocol in fewer cases: STMP with msgpack payloads, and
#: STMP over WebSocket in binary frames
VARIANTS: dict[str, type[Peer]] = {
    cls.name: cls
    for cls in (STMPMsgpackPeer, STMPWebSocketMsgpackPeer, STMPWebSocketBinaryFramePeer)
}
