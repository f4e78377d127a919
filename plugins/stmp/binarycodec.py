"""STMP 0.1 binary serialization (TCP, and WebSocket binary frames) and the message types
both serializations share, sans-IO. The format is described in :mod:`.codec`, the facade
that re-exports these names with the text serialization's: import them from there.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterable, Iterator
from enum import IntEnum

from attrs import frozen

from msgbroker.errors import RemoteProtocolError


class Kind(IntEnum):
    PING = 0
    REQUEST = 1
    NOTIFY = 2
    RESPONSE = 3


class Encoding(IntEnum):
    NONE = 0
    PROTOBUF = 1
    JSON = 2
    MSGPACK = 3
    BSON = 4
    RAW = 5


class Status(IntEnum):
    OK = 0x00
    MOVED_PERMANENTLY = 0x10
    FOUND = 0x11
    NOT_MODIFIED = 0x12
    BAD_REQUEST = 0x20
    UNAUTHORIZED = 0x21
    PAYMENT_REQUIRED = 0x22
    FORBIDDEN = 0x23
    NOT_FOUND = 0x24
    REQUEST_TIMEOUT = 0x25
    REQUEST_ENTITY_TOO_LARGE = 0x26
    TOO_MANY_REQUESTS = 0x27
    INTERNAL_SERVER_ERROR = 0x30
    NOT_IMPLEMENTED = 0x31
    BAD_GATEWAY = 0x32
    SERVICE_UNAVAILABLE = 0x33
    GATEWAY_TIMEOUT = 0x34
    VERSION_NOT_SUPPORTED = 0x35


#: the version this implementation speaks, (major, minor)
VERSION = (0, 1)
#: the reserved version-check action
ACTION_VERSION = 0
#: largest payload accepted by default (a message larger than this is a protocol error)
DEFAULT_MAX_PAYLOAD = 16 << 20
_ENCODINGS = frozenset(e.value for e in Encoding)

# -- messages -------------------------------------------------------------------------------


@frozen(slots=True)
class Ping:
    pass


@frozen(slots=True)
class Request:
    id: int
    action: int
    encoding: int = 0
    payload: bytes = b""


@frozen(slots=True)
class Notify:
    action: int
    encoding: int = 0
    payload: bytes = b""


@frozen(slots=True)
class Response:
    id: int
    status: int
    encoding: int = 0
    payload: bytes = b""


Message = Ping | Request | Notify | Response
PING = Ping()

#: a request's fixed part with PS: header, ID u16, ACTION u32, PS u32
_REQUEST_HEAD = 11


@frozen(slots=True)
class RequestRun:
    """``count`` (2 or more) consecutive binary requests with one header byte (so one
    encoding, never 0) and one action, exactly as received: ``block`` holds them whole,
    ``starts`` where each begins in it. A client pipelining one kind of request (publishes)
    sends these; a server that handles them as a run pays a few byte operations per request
    instead of a :class:`Request` each. Only :meth:`BinaryDecoder.feed_runs` makes them."""

    action: int
    encoding: int
    block: bytes
    starts: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.starts)

    def spans(self) -> Iterator[tuple[int, int]]:
        """(start, end) of each request in ``block``; its payload is ``block[start + 11:end]``
        and its id ``block[start + 1:start + 3]``."""
        starts = self.starts
        return zip(starts, (*starts[1:], len(self.block)), strict=True)

    def request(self, start: int, end: int) -> Request:
        """The request at ``block[start:end]``, one of :meth:`spans`."""
        block = self.block
        ident = _U16.unpack_from(block, start + 1)[0]
        return Request(ident, self.action, self.encoding, block[start + _REQUEST_HEAD : end])

    def requests(self) -> list[Request]:
        """The run as the individual :class:`Request` messages it stands for."""
        return [self.request(start, end) for start, end in self.spans()]


def expand_runs(messages: Iterable[Message | RequestRun]) -> list[Message]:
    """``messages`` with every :class:`RequestRun` replaced by its requests. How requests
    group into runs depends on how the bytes were chunked; the requests do not."""
    out: list[Message] = []
    for message in messages:
        if type(message) is RequestRun:
            out.extend(message.requests())
        else:
            out.append(message)  # type: ignore[arg-type]
    return out


# -- actions in dotted form -----------------------------------------------------------------


def action_to_str(action: int) -> str:
    """``0x01020304`` -> ``"1.2.3.4"``; ValueError outside 0..2**32-1."""
    if not 0 <= action <= 0xFFFFFFFF:
        raise ValueError(f"action out of range: {action}")
    return ".".join(str(b) for b in action.to_bytes(4, "big"))


def _is_decimal(text: str, max_digits: int) -> bool:
    """1..max_digits ASCII digits (``str.isdigit`` alone admits digits of other scripts)."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


def parse_action(text: str | int) -> int:
    """``"1.2.3.4"`` (or an int) -> ``0x01020304``; ValueError for anything else."""
    if isinstance(text, int):
        if isinstance(text, bool) or not 0 <= text <= 0xFFFFFFFF:
            raise ValueError(f"action out of range: {text}")
        return text
    parts = text.split(".")
    if len(parts) != 4 or not all(_is_decimal(p, 3) and int(p) <= 255 for p in parts):
        raise ValueError(f"not a dotted action: {text!r}")
    return int.from_bytes(bytes(int(p) for p in parts), "big")


def parse_prefix(text: str) -> tuple[int, int]:
    """``"10.1.0.0/16"`` -> (value, prefix length); a bare action is a /32."""
    address, slash, bits = text.partition("/")
    if slash and not (_is_decimal(bits, 2) and int(bits) <= 32):
        raise ValueError(f"bad prefix length in {text!r}")
    length = int(bits) if slash else 32
    value = parse_action(address)
    mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
    if value & ~mask:
        raise ValueError(f"{text!r} has bits set outside its prefix")
    return value, length


# -- versions -------------------------------------------------------------------------------

_LOWER_HEX = b"0123456789abcdef"


def encode_versions(versions: list[tuple[int, int]], text: bool = False) -> bytes:
    """A version list: one byte ``major<<4|minor`` each, or two lower-case hex digits each
    in text mode. ValueError for a major or minor outside 0..15."""
    if not all(0 <= major <= 15 and 0 <= minor <= 15 for major, minor in versions):
        raise ValueError(f"version numbers are 0..15: {versions}")
    raw = bytes((major << 4) | minor for major, minor in versions)
    return raw.hex().encode() if text else raw


def decode_versions(payload: bytes, text: bool = False) -> list[tuple[int, int]]:
    if text:
        # exactly pairs of lower-case hex digits (bytes.fromhex alone admits whitespace)
        if len(payload) % 2 or payload.translate(None, _LOWER_HEX):
            raise RemoteProtocolError(f"bad version list {payload[:20]!r}")
        raw = bytes.fromhex(payload.decode("ascii"))
    else:
        raw = payload
    return [(b >> 4, b & 0x0F) for b in raw]


# -- binary serialization -------------------------------------------------------------------

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_REQ = struct.Struct(">HI")
_RSP = struct.Struct(">HB")


def _header(kind: int, encoding: int) -> int:
    return (kind << 6) | (encoding << 3)


def encode_binary(message: Message, with_ps: bool = True) -> bytes:
    """One message, binary-serialized; ``with_ps=False`` for a WebSocket binary frame."""
    if isinstance(message, Ping):
        return b"\x00"
    encoding, payload = _encoding_and_payload(message)
    try:  # struct range-checks ID, ACTION, STATUS and PS
        if isinstance(message, Request):
            head = bytes((_header(1, encoding),)) + _REQ.pack(message.id, message.action)
        elif isinstance(message, Notify):
            head = bytes((_header(2, encoding),)) + _U32.pack(message.action)
        else:
            head = bytes((_header(3, encoding),)) + _RSP.pack(message.id, message.status)
        if encoding == 0:
            return head
        if with_ps:
            return head + _U32.pack(len(payload)) + payload
    except struct.error as exc:
        raise ValueError(f"cannot encode this {type(message).__name__}: {exc}") from None
    return head + payload


def _encoding_and_payload(message: Request | Notify | Response) -> tuple[int, bytes]:
    """The message's encoding and payload; ValueError when the protocol cannot carry them."""
    if not isinstance(message, (Request, Notify, Response)):
        raise TypeError(message)
    encoding, payload = message.encoding, message.payload
    if encoding not in _ENCODINGS:
        raise ValueError(f"unknown encoding {encoding}")
    if encoding == 0 and payload:
        raise ValueError("a message without encoding carries no payload")
    return int(encoding), payload


_FIXED = {1: 7, 2: 5, 3: 4}  # header + fields, per kind


def _parse_fixed(data: bytes, pos: int) -> tuple[int, int, int, int, int]:
    """(kind, encoding, id, action_or_status, end of fixed part) at ``pos``; raises for a bad
    header. The caller made sure the fixed part is there."""
    head = data[pos]
    kind, encoding = head >> 6, (head >> 3) & 7
    if head & 7:
        raise RemoteProtocolError(f"reserved header bits set: {head:#04x}")
    if kind == 0:
        if head != 0:
            raise RemoteProtocolError(f"ping with non-zero header {head:#04x}")
        return 0, 0, 0, 0, pos + 1
    if encoding not in _ENCODINGS:
        raise RemoteProtocolError(f"unknown encoding {encoding}")
    if kind == 1:
        ident, action = _REQ.unpack_from(data, pos + 1)
        return kind, encoding, ident, action, pos + 7
    if kind == 2:
        return kind, encoding, 0, _U32.unpack_from(data, pos + 1)[0], pos + 5
    ident, status = _RSP.unpack_from(data, pos + 1)
    return kind, encoding, ident, status, pos + 4


def _build(kind: int, encoding: int, ident: int, field: int, payload: bytes) -> Message:
    if kind == 1:
        return Request(ident, field, encoding, payload)
    if kind == 2:
        return Notify(field, encoding, payload)
    return Response(ident, field, encoding, payload)


class BinaryDecoder:
    """Incremental parser of a binary STMP stream (TCP): messages with PS.

    ``max_payload`` bounds every payload; ``max_message``, when set, bounds whole messages
    (header, fields, PS and payload) too. Both are checked as soon as a PS is read, so a
    message over either is refused before any of its payload is buffered. A server sets
    ``max_message`` before login and clears it (None) once the client logged in."""

    def __init__(
        self, max_payload: int = DEFAULT_MAX_PAYLOAD, max_message: int | None = None
    ) -> None:
        self._buf = b""  # the start of the next message
        self._more: list[bytes] = []  # chunks after _buf, not joined to it yet
        self._have = 0  # len(_buf) + the lengths of _more
        self._need = 0  # bytes the message in _buf needs, once its PS is known (else 0)
        self._max = max_payload
        self.max_message = max_message

    def feed(self, data: bytes) -> Generator[Message, None, None]:
        """Yield every complete message; raise :class:`RemoteProtocolError` at the first bad
        one (after yielding those before it). A generator: iterate it, or nothing happens.
        Closed early (``close()``), it keeps the bytes after the last message it yielded
        for the next call (``feed(b"")`` parses them)."""
        return self._feed(data, False)  # type: ignore[return-value]

    def feed_runs(self, data: bytes) -> Generator[Message | RequestRun, None, None]:
        """:meth:`feed`, but consecutive requests with one header byte and action come out
        as one :class:`RequestRun` (as many as this chunk holds whole). A server uses this."""
        return self._feed(data, True)

    def _feed(self, data: bytes, runs: bool) -> Generator[Message | RequestRun, None, None]:
        """The parser behind both. The chunks of a large message are only joined once it
        is complete, so a payload arriving in many small reads costs linear time."""
        if self._need > self._have + len(data):
            self._more.append(data)
            self._have += len(data)
            return
        if self._more:
            buf = b"".join((self._buf, *self._more, data))
            self._more = []
        else:
            buf = self._buf + data if self._buf else data
        pos, size, need = 0, len(buf), 0
        try:
            while pos < size:
                head = buf[pos]
                if head == 0:
                    pos += 1
                    yield PING
                    continue
                fixed = _FIXED.get(head >> 6, 1)
                if pos + fixed > size:
                    _parse_header_only(head)
                    break
                kind, encoding, ident, field, end = _parse_fixed(buf, pos)
                if encoding == 0:
                    pos = end
                    yield _build(kind, encoding, ident, field, b"")
                    continue
                if end + 4 > size:
                    break
                length = _U32.unpack_from(buf, end)[0]
                if length > self._max:
                    raise RemoteProtocolError(f"payload of {length} bytes exceeds {self._max}")
                stop = end + 4 + length
                if self.max_message is not None and stop - pos > self.max_message:
                    raise RemoteProtocolError(
                        f"message of {stop - pos} bytes exceeds {self.max_message}"
                    )
                if stop > size:
                    need = stop - pos
                    break
                if kind == 1 and runs:
                    run_end = self._run_end(buf, pos, stop)
                    if run_end is not None:
                        block, starts = run_end
                        pos += len(block)
                        yield RequestRun(field, encoding, block, starts)
                        continue
                pos = stop
                yield _build(kind, encoding, ident, field, buf[end + 4 : stop])
        finally:
            self._buf = buf[pos:]
            self._have = len(self._buf)
            self._need = need

    def _run_end(self, buf: bytes, pos: int, stop: int) -> tuple[bytes, tuple[int, ...]] | None:
        """The run of requests like the one at ``buf[pos:stop]`` (same header byte, same
        action) that starts there, as (block, starts); None when the next one differs. A
        request that is cut off, or too large, ends the run (the main loop handles it)."""
        head, action = buf[pos], buf[pos + 3 : pos + 7]
        size, limit, unpack = len(buf), self._max, _U32.unpack_from
        if self.max_message is not None:  # a request is its payload and 11 bytes
            limit = min(limit, self.max_message - _REQUEST_HEAD)
        starts = [0]
        while (
            stop + _REQUEST_HEAD <= size and buf[stop] == head and buf.startswith(action, stop + 3)
        ):
            length = unpack(buf, stop + 7)[0]
            if length > limit or stop + _REQUEST_HEAD + length > size:
                break
            starts.append(stop - pos)
            stop += _REQUEST_HEAD + length
        if len(starts) == 1:
            return None
        return buf[pos:stop], tuple(starts)


def _parse_header_only(head: int) -> None:
    """Reject a bad header byte before the rest of its message arrives."""
    if head & 7:
        raise RemoteProtocolError(f"reserved header bits set: {head:#04x}")
    if (head >> 6) and ((head >> 3) & 7) not in _ENCODINGS:
        raise RemoteProtocolError(f"unknown encoding {(head >> 3) & 7}")


def decode_binary_frame(frame: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Message:
    """One message from a WebSocket binary frame (no PS: the frame delimits the payload)."""
    if not frame:
        raise RemoteProtocolError("empty frame")
    head = frame[0]
    if head == 0:
        if len(frame) != 1:
            raise RemoteProtocolError("ping frame with extra bytes")
        return PING
    fixed = _FIXED.get(head >> 6, 1)
    _parse_header_only(head)
    if len(frame) < fixed:
        raise RemoteProtocolError("truncated message")
    kind, encoding, ident, field, end = _parse_fixed(frame, 0)
    payload = frame[end:]
    if encoding == 0 and payload:
        raise RemoteProtocolError("payload on a message without encoding")
    if len(payload) > max_payload:
        raise RemoteProtocolError(f"payload of {len(payload)} bytes exceeds {max_payload}")
    return _build(kind, encoding, ident, field, payload)
