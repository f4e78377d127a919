"""STMP delivery encoders and the serializers of each framing.

A delivery (a message routed by the hub) reaches an STMP client as a notify, action
``0.0.1.16``, payload ``{"from", "kind", "topic"?, "data" | "data_b64"}`` in the
encoding the client logged in with (JSON or msgpack). Encoders produce the complete wire
bytes (for WebSocket: the frames themselves), one function per (framing, encoding), so the
hub encodes once per group of recipients that share them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from msgbroker.message import Kind, Message

from . import codec, payloads, runs
from .codec import Encoding, Notify
from .payloads import encode_payload

#: how a connection frames what it sends: "binary" (TCP, with PS), or over WebSocket
#: "text" (text frames, binary payloads in a second frame) or "frame" (binary frames)
Framing = str
#: message (and ``inline``: a text payload in the text frame, see codec.encode_text) -> wire
Serializer = Callable[[codec.Message, "bool | None"], bytes]


_DELIVERY_KINDS = {
    Kind.MCAST: "mcast",
    Kind.UCAST: "ucast",
    Kind.BCAST: "bcast",
    Kind.SUBSCRIBE: "subscribe",
    Kind.UNSUBSCRIBE: "unsubscribe",
}
# Module-level on purpose: one encoder per (framing, payload encoding), 18 at most, pure and
# the same for every broker in the process; sharing one encoder is what lets a message
# fanned out to many STMP peers be encoded once (Message.encoded memoizes per encoder).
_encoders: dict[tuple[Framing, int], Callable[[Message], bytes | None]] = {}


def _delivery(message: Message, encoding: int) -> dict[str, Any]:
    kind = message.kind
    topic = message.topic if kind in (Kind.MCAST, Kind.SUBSCRIBE, Kind.UNSUBSCRIBE) else None
    data = message.payload if kind in (Kind.MCAST, Kind.UCAST, Kind.BCAST) else None
    return payloads.delivery_fields(message.sender, _DELIVERY_KINDS[kind], topic, data, encoding)


def delivery_encoder(framing: Framing, encoding: int) -> Callable[[Message], bytes | None]:
    """The (shared) encoder of deliveries for one framing and payload encoding."""
    key = (framing, encoding)
    encoder = _encoders.get(key)
    if encoder is None:
        serialize = serializer(framing)

        def general(message: Message) -> bytes | None:
            try:
                payload = encode_payload(_delivery(message, encoding), encoding)
            except ValueError:
                # a topic or sender JSON/msgpack cannot carry as text (an sbus key that is
                # not UTF-8 maps to lone surrogates): this recipient is skipped
                return None
            return serialize(Notify(payloads.DELIVERY, encoding, payload), None)

        encode = runs.templated(framing, encoding, general)
        encode.__qualname__ = f"stmp_{framing}_{Encoding(encoding).name.lower()}_delivery"
        encode_run = runs.run_encoder(framing, encoding, encode)
        if encode_run is not None:
            encode.encode_run = encode_run  # type: ignore[attr-defined]
        encoder = _encoders[key] = encode
    return encoder


def _binary(message: codec.Message, inline: bool | None = None) -> bytes:
    return codec.encode_binary(message)


#: WebSocket opcodes of data frames
WS_TEXT, WS_BINARY = 0x1, 0x2


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, unfragmented server frame: what the broker writes over WebSocket is
    framed here, once per group of recipients, and goes to each TCP transport as is."""
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
    frames = ws_frame(WS_TEXT, text.encode("utf-8"))
    if follow is not None:
        frames += ws_frame(WS_BINARY, follow)
    return frames


def binary_frame(message: codec.Message, inline: bool | None = None) -> bytes:
    return ws_frame(WS_BINARY, codec.encode_binary(message, with_ps=False))


# The three framings are the protocol's whole set (binary TCP, WebSocket text, WebSocket
# binary frames); fixed at import, never changed at run time.
SERIALIZERS: Mapping[Framing, Serializer] = MappingProxyType(
    {"binary": _binary, "text": text_frames, "frame": binary_frame}
)


def serializer(framing: Framing) -> Serializer:
    return SERIALIZERS[framing]
