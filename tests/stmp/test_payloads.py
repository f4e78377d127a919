"""The built-in actions' payload helpers: JSON and msgpack, data vs data_b64, and nothing
but ValueError for bad input."""

from __future__ import annotations

import base64
import contextlib
import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgbroker.plugins.stmp.codec import Encoding, parse_action
from msgbroker.plugins.stmp.payloads import (
    BROADCAST,
    DELIVERY,
    LOGIN,
    PUBLISH,
    SUBSCRIBE,
    UNICAST,
    UNSUBSCRIBE,
    data_fields,
    data_from,
    decode_payload,
    delivery_fields,
    encode_payload,
    parse_delivery,
)

JSON, MSGPACK = Encoding.JSON, Encoding.MSGPACK


def test_action_numbers_are_the_decisions_table():
    assert [parse_action(f"0.0.1.{n}") for n in (1, 2, 3, 4, 5, 6, 16)] == [
        LOGIN,
        SUBSCRIBE,
        UNSUBSCRIBE,
        PUBLISH,
        UNICAST,
        BROADCAST,
        DELIVERY,
    ]
    assert LOGIN == 0x101 and DELIVERY == 0x110


# -- encode_payload / decode_payload ------------------------------------------------------------


def test_json_is_compact_utf8():
    assert encode_payload({"topic": "n\u00e9ws", "x": [1, None]}, JSON) == (
        '{"topic":"n\u00e9ws","x":[1,null]}'.encode()
    )
    assert decode_payload(b'{"a": "\xc3\xa9"}', JSON) == {"a": "\u00e9"}


def test_msgpack_keeps_bytes_and_text_apart():
    packed = encode_payload({"data": b"\x00\xff", "topic": "t"}, MSGPACK)
    assert msgpack.unpackb(packed, raw=False) == {"data": b"\x00\xff", "topic": "t"}
    assert decode_payload(packed, MSGPACK) == {"data": b"\x00\xff", "topic": "t"}


def test_other_encodings_pass_bytes_through():
    for encoding in (Encoding.RAW, Encoding.PROTOBUF, Encoding.BSON):
        assert encode_payload(b"\x01\x02", encoding) == b"\x01\x02"
        assert decode_payload(b"\x01\x02", encoding) == b"\x01\x02"
    assert encode_payload(None, Encoding.NONE) == b""
    assert decode_payload(b"", Encoding.NONE) is None


@pytest.mark.parametrize(
    ("obj", "encoding"),
    [
        ({"data": b"bytes"}, JSON),  # bytes are not JSON
        ({"x": float("nan")}, JSON),
        ("\ud800", JSON),  # a lone surrogate cannot be UTF-8
        ({"x": object()}, MSGPACK),
        (2**70, MSGPACK),
        ("text", Encoding.RAW),
        (b"x", Encoding.NONE),
        (b"x", 7),
    ],
)
def test_encode_refuses_with_value_error(obj, encoding):
    with pytest.raises(ValueError):
        encode_payload(obj, encoding)


@pytest.mark.parametrize(
    ("payload", "encoding"),
    [
        (b"", JSON),
        (b"{", JSON),
        (b'{"a":1} x', JSON),
        (b"NaN", JSON),
        (b'"\xff"', JSON),  # not UTF-8
        (b"[" * 100_000, JSON),  # deep nesting
        (b"", MSGPACK),
        (b"\xc1", MSGPACK),  # never-used byte
        (msgpack.packb({"a": 1}) + b"\x00", MSGPACK),  # trailing data
        (b"\x81\x91\x01\x02", MSGPACK),  # {[1]: 2}: unhashable key
        (b"\xa1\xff", MSGPACK),  # str that is not UTF-8
        (b"x", Encoding.NONE),
        (b"x", 6),
    ],
)
def test_decode_refuses_with_value_error(payload, encoding):
    with pytest.raises(ValueError):
        decode_payload(payload, encoding)


@given(st.binary(max_size=200), st.sampled_from([JSON, MSGPACK]))
def test_decode_never_raises_anything_but_value_error(payload, encoding):
    with contextlib.suppress(ValueError):
        decode_payload(payload, encoding)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.sampled_from([JSON, MSGPACK]))
def test_round_trip(value, encoding):
    assert decode_payload(encode_payload(value, encoding), encoding) == value


# -- data_fields / data_from --------------------------------------------------------------------


def test_json_text_goes_as_data_and_binary_as_data_b64():
    assert data_fields(b"hello | world", JSON) == {"data": "hello | world"}
    assert data_fields("\u00e9".encode(), JSON) == {"data": "\u00e9"}
    assert data_fields(b"\xff\x00", JSON) == {"data_b64": base64.b64encode(b"\xff\x00").decode()}
    assert data_fields(b"", JSON) == {"data": ""}


def test_msgpack_data_is_bytes():
    assert data_fields(b"text", MSGPACK) == {"data": b"text"}
    assert data_fields(b"\xff", MSGPACK) == {"data": b"\xff"}


def test_data_from_accepts_every_form():
    assert data_from({"data": "h\u00e9"}, JSON) == "h\u00e9".encode()
    assert data_from({"data_b64": "/wA="}, JSON) == b"\xff\x00"
    assert data_from({"data": b"\xff"}, MSGPACK) == b"\xff"
    assert data_from({"data": "text"}, MSGPACK) == b"text"
    assert data_from({"data_b64": "/wA="}, MSGPACK) == b"\xff\x00"
    assert data_from({"data": "", "topic": "t"}, JSON) == b""


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"data": "a", "data_b64": "YQ=="},
        {"data": 5},
        {"data": None},
        {"data": ["x"]},
        {"data": "\ud800"},
        {"data_b64": "not base64!"},
        {"data_b64": "YQ"},  # missing padding
        {"data_b64": b"YQ=="},
        {"data_b64": "\u00e9"},
        ["data"],
        "data",
        None,
    ],
)
def test_data_from_refuses_with_value_error(fields):
    with pytest.raises(ValueError):
        data_from(fields, JSON)


def test_data_helpers_refuse_unstructured_encodings():
    with pytest.raises(ValueError):
        data_fields(b"x", Encoding.RAW)
    with pytest.raises(ValueError):
        data_from({"data": "x"}, Encoding.RAW)


@given(st.binary(max_size=300), st.sampled_from([JSON, MSGPACK]))
def test_data_round_trips_through_the_wire(data, encoding):
    fields = {"topic": "t", **data_fields(data, encoding)}
    decoded = decode_payload(encode_payload(fields, encoding), encoding)
    assert data_from(decoded, encoding) == data
    if encoding == JSON:
        # valid UTF-8 is readable text on the wire, the rest is base64
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            assert "data_b64" in json.loads(encode_payload(fields, JSON))
        else:
            assert "data" in json.loads(encode_payload(fields, JSON))


# -- deliveries ----------------------------------------------------------------------------------


def test_delivery_fields_and_parse():
    fields = delivery_fields("alice", "mcast", "news", b"hi", JSON)
    assert fields == {"from": "alice", "kind": "mcast", "topic": "news", "data": "hi"}
    assert parse_delivery(fields, JSON) == ("alice", "mcast", "news", b"hi")
    ucast = delivery_fields("bob", "ucast", None, b"\xff", MSGPACK)
    assert ucast == {"from": "bob", "kind": "ucast", "data": b"\xff"}
    assert parse_delivery(ucast, MSGPACK) == ("bob", "ucast", None, b"\xff")
    presence = delivery_fields("carol", "subscribe", "room", None, JSON)
    assert presence == {"from": "carol", "kind": "subscribe", "topic": "room"}
    assert parse_delivery(presence, JSON) == ("carol", "subscribe", "room", b"")


@pytest.mark.parametrize(
    "fields",
    [
        None,
        {"kind": "mcast", "data": "x"},
        {"from": 1, "kind": "mcast", "data": "x"},
        {"from": "a", "kind": "shout", "data": "x"},
        {"from": "a", "kind": "mcast", "topic": 5, "data": "x"},
        {"from": "a", "kind": "mcast", "data": 5},
    ],
)
def test_parse_delivery_refuses_with_value_error(fields):
    with pytest.raises(ValueError):
        parse_delivery(fields, JSON)
    with pytest.raises(ValueError):
        delivery_fields("a", "shout", None, b"", JSON)
