"""Micromessage2 deliveries: how a routed message becomes MESSAGE frames, once for every
Micromessage2 recipient, and how each connection numbers them.

:func:`encode_delivery` writes sequence number 0 in the frames; each connection's output,
its acknowledgement window (:mod:`.window`), writes its own numbers in: a whole write in
one pass, or message by message (:func:`messages`, :func:`numbered`) when it holds some
back. A message with a dotnet type carries a marker before its frames (an
EXTENSION frame with id 0, which never goes on the wire): each connection turns it into its
own type frame or drops it (:func:`type_marker`).
"""

from __future__ import annotations

from itertools import chain

from msgbroker.message import Kind, Message, MessageRun

from . import codec
from .frames import CONTINUED, EXTENSION, LARGE
from .properties import is_valid_name


def encode_delivery(message: Message) -> bytes | None:
    """The MESSAGE frame(s) of ``message`` with sequence number 0 (each connection writes
    its own in). An MCAST goes to its topic, a UCAST arrives with destination ``@sender``.
    Broadcasts and presence events have no Micromessage2 form (skipped); so has a topic
    that is not a Micromessage2 destination."""
    kind = message.kind
    # The common delivery, once per message whoever fans it out: an MCAST without properties
    # or type, up to 255 bytes, is its destination's head from a table and the payload
    # (no frame object, no encoder pass, no second pass to zero the number).
    if kind is Kind.MCAST and not message.properties and message.encoding is None:
        payload = message.payload
        if len(payload) <= 255:
            heads = _heads.get(message.topic) or _heads_for(message.topic)  # type: ignore[arg-type]
            if heads is not None:
                return heads[len(payload)] + payload
    if kind is Kind.MCAST:
        destination = message.topic or ""
    elif kind is Kind.UCAST:
        destination = "@" + message.sender
    else:
        return None
    try:
        properties = message.properties or ()
        frame = codec.MessageFrame(1, destination, message.payload, properties)
        encoded = codec.encode_message(frame)
    except (ValueError, TypeError):
        return None
    # seq 1 was a placeholder the encoder accepts; 0 marks it as "to be numbered"
    encoded = _zero_seqs(encoded)
    hint = message.encoding
    if hint is not None and hint.startswith(DOTNET_HINT):
        # the type travels with the message: a marker each connection turns into its own
        # dotnet frame, or drops (extension id 0 never goes on the wire)
        return extension_frame(0, hint[len(DOTNET_HINT) :].encode("utf-8")) + encoded
    return encoded


#: how a message carries its dotnet type through the hub (``Message.encoding``)
DOTNET_HINT = "dotnet:"
#: destination -> the 256 frame heads (seq 0, no properties) for payloads of 0..255 bytes;
#: module-level on purpose: pure bytes of the destination, the same for every broker in the
#: process, bounded by clearing it past 1,024 destinations
_heads: dict[str, list[bytes]] = {}


def _encode_run(run: MessageRun) -> tuple[bytes, int]:
    """The run encoding of :func:`encode_delivery` (see ``MessageRun``): MCASTs without
    properties and payloads up to 255 bytes get their head from a table, by C iterators;
    anything else is encoded message by message."""
    payloads = run.payloads()
    heads = _heads.get(run.topic) or _heads_for(run.topic)
    if heads is None or run.kind is not Kind.MCAST or max(map(len, payloads)) > 255:
        frames = [m.encoded(encode_delivery) for m in run.messages()]
        carried = [f for f in frames if f is not None]
        return b"".join(carried), len(carried)
    parts = zip(map(heads.__getitem__, map(len, payloads)), payloads, strict=True)
    return b"".join(chain.from_iterable(parts)), run.count


def _heads_for(topic: str | None) -> list[bytes] | None:
    """The frame heads of ``topic`` (see ``_heads``), made and kept; None when it is not a
    Micromessage2 destination."""
    if topic is None or not is_valid_name(topic):
        return None
    if len(_heads) >= 1024:
        _heads.clear()
    dest = topic.encode("ascii")
    pre = b"\x00\x00\x00" + bytes((len(dest),)) + dest + b"\x00\x00"
    heads = _heads[topic] = [pre + bytes((n,)) for n in range(256)]
    return heads


encode_delivery.encode_run = _encode_run  # type: ignore[attr-defined]


def extension_frame(ext_id: int, payload: bytes) -> bytes:
    size = len(payload)
    if size > 255:
        return bytes((EXTENSION | LARGE, ext_id)) + size.to_bytes(4, "big") + payload
    return bytes((EXTENSION, ext_id, size)) + payload


def _zero_seqs(data: bytes) -> bytes:
    out = bytearray(data)
    for start, _end, _is_message in _frames(out):
        out[start + 1 : start + 3] = b"\x00\x00"
    return bytes(out)


def _frames(data: bytes | bytearray) -> list[tuple[int, int, bool]]:
    """(start, end, is a MESSAGE) of each frame in ``data`` (frames we encoded ourselves:
    MESSAGEs, and type markers before them)."""
    spans = []
    pos, size = 0, len(data)
    while pos < size:
        flags = data[pos]
        if flags & EXTENSION:
            at = pos + 2
        else:
            at = pos + 3
            at += 1 + data[at]  # destination
            at += 2 + int.from_bytes(data[at : at + 2], "big")  # properties
        if flags & LARGE:
            length, at = int.from_bytes(data[at : at + 4], "big"), at + 4
        else:
            length, at = data[at], at + 1
        spans.append((pos, at + length, not flags & EXTENSION))
        pos = at + length
    return spans


def messages(data: bytes) -> list[bytes]:
    """``data`` (one or several messages' frames) cut into one piece per message (a
    message's CONTINUED fragments, and the type marker before it, stay together)."""
    pieces, start = [], 0
    for frame_start, end, is_message in _frames(data):
        if is_message and not data[frame_start] & CONTINUED:
            pieces.append(data[start:end])
            start = end
    return pieces


def numbered(piece: bytes, seq: int) -> bytes:
    """``piece`` (a message's frames) with ``seq`` written into each MESSAGE frame."""
    number = seq.to_bytes(2, "big")
    spans = _frames(piece)
    if len(spans) == 1:
        return piece[:1] + number + piece[3:]
    out = bytearray(piece)
    for start, _end, is_message in spans:
        if is_message:
            out[start + 1 : start + 3] = number
    return bytes(out)


def type_marker(piece: bytes) -> tuple[str | None, bytes]:
    """(the dotnet type a piece's marker names or None, the piece without the marker)."""
    flags = piece[0]
    if not flags & EXTENSION:
        return None, piece
    if flags & LARGE:
        head, size = 6, int.from_bytes(piece[2:6], "big")
    else:
        head, size = 3, piece[2]
    return piece[head : head + size].decode("utf-8"), piece[head + size :]
