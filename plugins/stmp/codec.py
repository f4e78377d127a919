"""STMP 0.1 codec, sans-IO: bytes (or WebSocket frames) in, frozen messages out; messages
in, bytes out. No Twisted here.

Binary serialization (TCP): a one-byte header ``kind << 6 | encoding << 3`` (low three bits
reserved, written 0, rejected when set), then big-endian fields: request ``ID:u16
ACTION:u32``, notify ``ACTION:u32``, response ``ID:u16 STATUS:u8``; then ``PS:u32 PAYLOAD``
iff the encoding is not 0. A ping is the single byte ``0x00``. Over WebSocket a binary frame
carries one message without PS (the frame delimits it).

Text serialization (WebSocket text frames): decimal fields joined by ``|`` —
``0``, ``1|E|ID|ACTION[|PAYLOAD]``, ``2|E|ACTION[|PAYLOAD]``, ``3|E|ID|STATUS[|PAYLOAD]`` —
where the payload is everything after the last fixed field, ``|`` included. A binary payload
travels as two frames: the text header without payload, then one binary frame with the
payload (:class:`TextDecoder` pairs them).
"""

from __future__ import annotations

from .binarycodec import (
    ACTION_VERSION,
    DEFAULT_MAX_PAYLOAD,
    PING,
    VERSION,
    BinaryDecoder,
    Encoding,
    Kind,
    Message,
    Notify,
    Ping,
    Request,
    RequestRun,
    Response,
    Status,
    action_to_str,
    decode_binary_frame,
    decode_versions,
    encode_binary,
    encode_versions,
    expand_runs,
    parse_action,
    parse_prefix,
)
from .textcodec import TextDecoder, encode_text

#: the re-exports (for mypy's strict mode and ruff): binary serialization and the message
#: types (binarycodec), text serialization (textcodec)
__all__ = [
    "ACTION_VERSION",
    "DEFAULT_MAX_PAYLOAD",
    "PING",
    "VERSION",
    "BinaryDecoder",
    "Encoding",
    "Kind",
    "Message",
    "Notify",
    "Ping",
    "Request",
    "RequestRun",
    "Response",
    "Status",
    "TextDecoder",
    "action_to_str",
    "decode_binary_frame",
    "decode_versions",
    "encode_binary",
    "encode_text",
    "encode_versions",
    "expand_runs",
    "parse_action",
    "parse_prefix",
]
