"""Payloads of the built-in broker actions (``0.0.1.0/24``, DECISIONS.md), shared by the
broker and the clients. Pure functions, no I/O, no Twisted.

The built-in actions carry a dict, as JSON (encoding 2) or msgpack (encoding 3). Message
bytes travel in that dict as ``"data"`` or ``"data_b64"``:

- JSON: ``"data"`` is the bytes as text when they are valid UTF-8, else ``"data_b64"`` is
  their base64 (standard alphabet, padded);
- msgpack: ``"data"`` is the bytes themselves (msgpack bin).

:func:`data_fields` writes that, :func:`data_from` reads it back (and accepts any of the
forms in either encoding, so a hand-written msgpack ``"data": "text"`` works too).
Everything that reads untrusted input raises ``ValueError`` — never anything else, not even
``TypeError`` for a value of the wrong type — so a caller can answer 0x20 BadRequest with one
``except ValueError``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped]

from .codec import Encoding, parse_action

__all__ = [
    "BROADCAST",
    "DELIVERY",
    "DELIVERY_KINDS",
    "LOGIN",
    "PUBLISH",
    "SUBSCRIBE",
    "UNICAST",
    "UNSUBSCRIBE",
    "data_fields",
    "data_from",
    "decode_payload",
    "delivery_fields",
    "encode_payload",
    "parse_delivery",
]

# -- the built-in actions (DECISIONS.md) ------------------------------------------------------

LOGIN = parse_action("0.0.1.1")
SUBSCRIBE = parse_action("0.0.1.2")
UNSUBSCRIBE = parse_action("0.0.1.3")
PUBLISH = parse_action("0.0.1.4")
UNICAST = parse_action("0.0.1.5")
BROADCAST = parse_action("0.0.1.6")
#: the notify action of deliveries to STMP clients
DELIVERY = parse_action("0.0.1.16")
DELIVERY_KINDS = frozenset({"mcast", "ucast", "bcast", "subscribe", "unsubscribe"})

#: encodings whose payload is a structured value (the built-in actions accept these)
STRUCTURED = frozenset({Encoding.JSON, Encoding.MSGPACK})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# made once: json.dumps/json.loads with options build a new encoder/decoder on every call
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


# -- whole payloads -----------------------------------------------------------------------------


def encode_payload(obj: Any, encoding: int) -> bytes:
    """``obj`` serialized for ``encoding``: JSON (compact, UTF-8, no NaN), msgpack (str as
    str, bytes as bin). For raw, protobuf and bson ``obj`` must already be bytes; for
    encoding 0 it must be ``None`` (no payload). ``ValueError`` if it cannot be done."""
    if encoding == Encoding.JSON:
        try:
            return _JSON_ENCODER.encode(obj).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise ValueError(f"cannot encode as JSON: {e}") from None
    if encoding == Encoding.MSGPACK:
        try:
            packed: bytes = msgpack.packb(obj, use_bin_type=True)
            return packed
        except (TypeError, ValueError, OverflowError, RecursionError) as e:
            raise ValueError(f"cannot encode as msgpack: {e}") from None
    if encoding == Encoding.NONE:
        if obj is not None and obj != b"":
            raise ValueError("encoding 0 carries no payload")
        return b""
    if encoding in (Encoding.RAW, Encoding.PROTOBUF, Encoding.BSON):
        if isinstance(obj, bytes | bytearray | memoryview):
            return bytes(obj)
        raise ValueError(f"encoding {encoding} needs bytes, not {type(obj).__name__}")
    raise ValueError(f"unknown encoding {encoding}")


def decode_payload(payload: bytes, encoding: int) -> Any:
    """The value a payload carries: JSON and msgpack decoded (msgpack bin as bytes), encoding
    0 as ``None``, raw/protobuf/bson as the bytes themselves. ``ValueError`` for a payload
    that does not parse (invalid UTF-8, trailing data, NaN, ...)."""
    if encoding == Encoding.JSON:
        try:
            return _JSON_DECODER.decode(payload.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"bad JSON payload: {e}") from None
    if encoding == Encoding.MSGPACK:
        try:
            return msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises ValueErrors, but also TypeError (unhashable key)
            raise ValueError(f"bad msgpack payload: {e}") from None
    if encoding == Encoding.NONE:
        if payload:
            raise ValueError("a payload with encoding 0")
        return None
    if encoding in (Encoding.RAW, Encoding.PROTOBUF, Encoding.BSON):
        return bytes(payload)
    raise ValueError(f"unknown encoding {encoding}")


# -- message bytes inside a payload -------------------------------------------------------------


def data_fields(data: bytes, encoding: int) -> dict[str, Any]:
    """``{"data": ...}`` or ``{"data_b64": ...}`` carrying ``data`` in ``encoding``: JSON
    puts valid UTF-8 as text and anything else as base64; msgpack puts the bytes as they
    are."""
    data = bytes(data)
    if encoding == Encoding.MSGPACK:
        return {"data": data}
    if encoding == Encoding.JSON:
        try:
            return {"data": data.decode("utf-8")}
        except UnicodeDecodeError:
            return {"data_b64": base64.b64encode(data).decode("ascii")}
    raise ValueError(f"encoding {encoding} carries no built-in action payload")


def data_from(fields: Any, encoding: int) -> bytes:
    """The message bytes in a decoded payload: ``"data"`` (text as UTF-8, or bytes) or
    ``"data_b64"`` (base64 text), exactly one of them. ``ValueError`` otherwise (not a map,
    both or neither, wrong types, bad base64, text that is not valid Unicode)."""
    if encoding not in STRUCTURED:
        raise ValueError(f"encoding {encoding} carries no built-in action payload")
    if type(fields) is not dict and not isinstance(fields, Mapping):  # dict: skip the ABC check
        raise ValueError("the payload is not a map")
    has_data, has_b64 = "data" in fields, "data_b64" in fields
    if has_data == has_b64:
        raise ValueError('the payload needs exactly one of "data" and "data_b64"')
    if has_data:
        value = fields["data"]
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, from a JSON \ud800 escape
                raise ValueError('"data" is not valid Unicode text') from None
        raise ValueError(f'"data" must be text or bytes, not {type(value).__name__}')
    value = fields["data_b64"]
    if not isinstance(value, str):
        raise ValueError(f'"data_b64" must be text, not {type(value).__name__}')  # noqa: TRY004
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise ValueError('"data_b64" is not base64') from None


# -- deliveries (notify 0.0.1.16) -------------------------------------------------------------


def delivery_fields(
    sender: str, kind: str, topic: str | None, data: bytes | None, encoding: int
) -> dict[str, Any]:
    """The payload dict of a delivery notify: ``{"from", "kind", "topic"?, data}``. ``topic``
    is left out when ``None``; presence events (``subscribe``/``unsubscribe``) pass ``data=None``
    and carry none."""
    if kind not in DELIVERY_KINDS:
        raise ValueError(f"unknown delivery kind {kind!r}")
    fields: dict[str, Any] = {"from": sender, "kind": kind}
    if topic is not None:
        fields["topic"] = topic
    if data is not None:
        fields.update(data_fields(data, encoding))
    return fields


def parse_delivery(fields: Any, encoding: int) -> tuple[str, str, str | None, bytes]:
    """(from, kind, topic or None, data) of a decoded delivery payload; ``data`` is ``b""``
    when the delivery carries none (presence events). ``ValueError`` for anything else."""
    if not isinstance(fields, Mapping):
        raise ValueError("the delivery is not a map")  # noqa: TRY004
    sender, kind, topic = fields.get("from"), fields.get("kind"), fields.get("topic")
    if not isinstance(sender, str):
        raise ValueError('the delivery has no "from"')  # noqa: TRY004
    if kind not in DELIVERY_KINDS:
        raise ValueError(f"unknown delivery kind {kind!r}")
    if topic is not None and not isinstance(topic, str):
        raise ValueError('"topic" must be text')
    carries_data = "data" in fields or "data_b64" in fields
    data = data_from(fields, encoding) if carries_data else b""
    return sender, kind, topic, data
