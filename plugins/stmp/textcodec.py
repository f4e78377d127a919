"""STMP 0.1 text serialization (WebSocket text frames), sans-IO: :func:`encode_text` and
:class:`TextDecoder`. No Twisted here. The format is described in :mod:`.codec`, which
re-exports both names: import them from there. It builds on :mod:`.binarycodec`'s types and
helpers.
"""

from __future__ import annotations

from msgbroker.errors import RemoteProtocolError

from .binarycodec import (
    _ENCODINGS,
    DEFAULT_MAX_PAYLOAD,
    PING,
    Encoding,
    Message,
    Notify,
    Ping,
    Request,
    _build,
    _encoding_and_payload,
    _is_decimal,
    decode_binary_frame,
)

_TEXT_FIELDS = {1: 4, 2: 3, 3: 4}  # fixed fields per kind, KIND and ENCODING included
_LIMITS = {1: (0xFFFF, 0xFFFFFFFF), 2: (0xFFFFFFFF,), 3: (0xFFFF, 0xFF)}


def encode_text(message: Message, inline: bool | None = None) -> tuple[str, bytes | None]:
    """(text frame, binary follow-up frame or None). JSON payloads travel in the text frame,
    binary encodings (protobuf, msgpack, bson, raw) in a second, binary frame; ``inline``
    overrides that (the version check sends its raw hex list inline)."""
    if isinstance(message, Ping):
        return "0", None
    encoding, payload = _encoding_and_payload(message)
    if isinstance(message, Request):
        fields = f"1|{encoding}|{_field(message.id, 0xFFFF)}|{_field(message.action, _U32_MAX)}"
    elif isinstance(message, Notify):
        fields = f"2|{encoding}|{_field(message.action, _U32_MAX)}"
    else:
        fields = f"3|{encoding}|{_field(message.id, 0xFFFF)}|{_field(message.status, 0xFF)}"
    if encoding == 0:
        return fields, None
    if inline is None:
        inline = encoding == Encoding.JSON
    if inline:
        try:
            return f"{fields}|{payload.decode('utf-8')}", None
        except UnicodeDecodeError:
            pass  # not text after all: send it as a binary frame
    return fields, payload


_U32_MAX = 0xFFFFFFFF


def _field(value: int, limit: int) -> int:
    """A text field's value as a plain int (``"36"``, never ``"Status.NOT_FOUND"``)."""
    if not 0 <= value <= limit:
        raise ValueError(f"field out of range 0..{limit}: {value}")
    return int(value)


class TextDecoder:
    """WebSocket frames (text mode) -> messages, pairing a payload-less text header with the
    binary frame that follows it. A binary frame on its own is one binary message."""

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._pending: tuple[int, int, int, int] | None = None
        self._max = max_payload

    @property
    def waiting_for_payload(self) -> bool:
        return self._pending is not None

    def text_frame(self, text: str) -> Message | None:
        """A text frame: the message, or None when it is a header whose payload comes next."""
        if self._pending is not None:
            raise RemoteProtocolError("text frame where the binary payload was expected")
        if text == "0":
            return PING
        kind_text = text.partition("|")[0]
        count = _TEXT_FIELDS.get(int(kind_text)) if kind_text in ("1", "2", "3") else None
        if count is None:
            raise RemoteProtocolError(f"bad text message {text[:40]!r}")
        parts = text.split("|", count)  # the fixed fields, then the payload (if any) whole
        fixed = parts[1:count]
        # at most 10 digits (ACTION's width): int() of a huge digit string raises ValueError
        if len(fixed) != count - 1 or not all(_is_decimal(p, 10) for p in fixed):
            raise RemoteProtocolError(f"bad text message {text[:40]!r}")
        kind, encoding = int(kind_text), int(fixed[0])
        numbers = [int(p) for p in fixed[1:]]
        if encoding not in _ENCODINGS:
            raise RemoteProtocolError(f"unknown encoding {encoding}")
        for value, limit in zip(numbers, _LIMITS[kind], strict=True):
            if value > limit:
                raise RemoteProtocolError(f"field out of range in {text[:40]!r}")
        ident = numbers[0] if kind in (1, 3) else 0
        field = numbers[-1]
        rest = parts[count] if len(parts) > count else None
        if rest is None:
            if encoding == 0:
                return _build(kind, 0, ident, field, b"")
            self._pending = (kind, encoding, ident, field)
            return None
        if encoding == 0:
            raise RemoteProtocolError("payload on a message without encoding")
        payload = rest.encode("utf-8", "surrogatepass")
        if len(payload) > self._max:
            raise RemoteProtocolError(f"payload of {len(payload)} bytes exceeds {self._max}")
        return _build(kind, encoding, ident, field, payload)

    def binary_frame(self, frame: bytes) -> Message:
        """A binary frame: the payload of the pending header, or a whole binary message."""
        if self._pending is None:
            return decode_binary_frame(frame, self._max)
        kind, encoding, ident, field = self._pending
        self._pending = None
        if len(frame) > self._max:
            raise RemoteProtocolError(f"payload of {len(frame)} bytes exceeds {self._max}")
        return _build(kind, encoding, ident, field, frame)
