"""STMP 0.1 codec conformance: every vector of tests/vectors/stmp.json, the grammar of the
STMP article as amended by docs/stmp.md ("Decisions"), and its error cases.

Every binary-stream decoding check also feeds the same bytes one byte at a time and split
at every point, and requires the same messages (and the same error) as when fed whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp.codec import (
    PING,
    BinaryDecoder,
    Encoding,
    Kind,
    Notify,
    Request,
    Response,
    Status,
    TextDecoder,
    action_to_str,
    decode_binary_frame,
    decode_versions,
    encode_binary,
    encode_text,
    encode_versions,
    parse_action,
    parse_prefix,
)

#: the project's byte-exact STMP vectors, kept in the repository (tests/vectors/)
VECTORS_FILE = Path(__file__).parents[1] / "vectors" / "stmp.json"
VECTORS = json.loads(VECTORS_FILE.read_text())
vector_cases = pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])


# -- helpers ---------------------------------------------------------------------------------


def feed_chunks(decoder, chunks):
    """(messages, error): feeding stops at the first RemoteProtocolError."""
    messages = []
    for chunk in chunks:
        try:
            messages.extend(decoder.feed(chunk))
        except RemoteProtocolError as exc:
            return messages, exc
    return messages, None


def all_splittings(data):
    """One byte at a time, and every 2-way split."""
    yield [data[i : i + 1] for i in range(len(data))]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]


def decode_stream(data, **kwargs):
    """The messages of a binary stream and whether it raised, fed whole; every splitting
    must give the same."""
    messages, error = feed_chunks(BinaryDecoder(**kwargs), [data])
    for chunks in all_splittings(data):
        split_messages, split_error = feed_chunks(BinaryDecoder(**kwargs), chunks)
        assert split_messages == messages, [len(c) for c in chunks]
        assert (split_error is None) == (error is None), [len(c) for c in chunks]
    return messages, error is not None


def message_of(vector):
    """The message a vector describes (binary-mode payload)."""
    fields = vector["fields"]
    payload = bytes.fromhex(fields["payload_hex"] or "")
    kind = Kind(fields["kind"])
    if kind is Kind.PING:
        return PING
    if kind is Kind.REQUEST:
        return Request(fields["id"], fields["action"], fields["encoding"], payload)
    if kind is Kind.NOTIFY:
        return Notify(fields["action"], fields["encoding"], payload)
    return Response(fields["id"], fields["status"], fields["encoding"], payload)


def is_version_check(message):
    """The version-check request and its Ok reply: raw version lists, hex in text mode."""
    if getattr(message, "encoding", 0) != Encoding.RAW:
        return False
    if isinstance(message, Request):
        return message.action == 0 and message.id == 0
    return isinstance(message, Response) and message.id == 0


def text_message_of(vector):
    """(message as text mode carries it, inline flag for encode_text)."""
    message = message_of(vector)
    if not is_version_check(message):
        return message, None
    hex_list = encode_versions(decode_versions(message.payload), text=True)
    assert hex_list.decode() == vector["fields"]["payload_text"]
    return attrs.evolve(message, payload=hex_list), True


# -- vectors -----------------------------------------------------------------------------------


def test_vectors_cover_every_kind_and_both_text_forms():
    kinds = {v["fields"]["kind"] for v in VECTORS}
    assert kinds == {0, 1, 2, 3}
    assert any(isinstance(v["text"], dict) for v in VECTORS)
    assert any(isinstance(v["text"], str) for v in VECTORS)


@vector_cases
def test_vector_encodes_binary_with_ps(vector):
    encoded = encode_binary(message_of(vector))
    assert encoded.hex() == vector["binary_hex"]
    assert encoded[:1].hex() == vector["header_byte_hex"]


@vector_cases
def test_vector_parses_from_binary_stream_whole_and_split(vector):
    assert decode_stream(bytes.fromhex(vector["binary_hex"])) == ([message_of(vector)], False)


@vector_cases
def test_vector_encodes_binary_frame_without_ps(vector):
    assert encode_binary(message_of(vector), with_ps=False).hex() == vector["binary_nops_hex"]


@vector_cases
def test_vector_parses_from_binary_frame(vector):
    frame = bytes.fromhex(vector["binary_nops_hex"])
    assert decode_binary_frame(frame) == message_of(vector)
    decoder = TextDecoder()  # a binary frame on its own over WebSocket
    assert decoder.binary_frame(frame) == message_of(vector)
    assert not decoder.waiting_for_payload


@vector_cases
def test_vector_encodes_text(vector):
    message, inline = text_message_of(vector)
    if isinstance(vector["text"], str):
        assert encode_text(message, inline=inline) == (vector["text"], None)
    else:
        header, follow_up = vector["text"]["frames"]
        assert encode_text(message) == (header, bytes.fromhex(follow_up["binary_hex"]))


@vector_cases
def test_vector_parses_from_text(vector):
    message, _ = text_message_of(vector)
    decoder = TextDecoder()
    if isinstance(vector["text"], str):
        assert decoder.text_frame(vector["text"]) == message
    else:
        header, follow_up = vector["text"]["frames"]
        assert decoder.text_frame(header) is None
        assert decoder.waiting_for_payload
        assert decoder.binary_frame(bytes.fromhex(follow_up["binary_hex"])) == message
    assert not decoder.waiting_for_payload


def test_version_check_vectors_carry_version_0_1():
    checks = [message_of(v) for v in VECTORS if is_version_check(message_of(v))]
    assert len(checks) == 2
    assert all(decode_versions(m.payload) == [(0, 1)] for m in checks)


def test_all_vectors_concatenated_parse_under_every_split():
    stream = b"".join(bytes.fromhex(v["binary_hex"]) for v in VECTORS)
    assert decode_stream(stream) == ([message_of(v) for v in VECTORS], False)


# -- binary stream -----------------------------------------------------------------------------


def test_stream_waits_for_the_rest_of_a_message_without_error():
    data = encode_binary(Request(7, 0x01020304, Encoding.JSON, b"[1]"))
    decoder = BinaryDecoder()
    for i in range(len(data) - 1):
        assert list(decoder.feed(data[i : i + 1])) == []
    assert list(decoder.feed(data[-1:])) == [Request(7, 0x01020304, Encoding.JSON, b"[1]")]


def test_stream_of_pings_yields_one_ping_per_byte():
    assert decode_stream(b"\x00" * 5) == ([PING] * 5, False)


def test_stream_ps_zero_is_an_empty_payload():
    data = bytes.fromhex("a8 01020304 00000000") + b"\x00"
    assert decode_stream(data) == ([Notify(0x01020304, Encoding.RAW, b""), PING], False)


def test_stream_yields_messages_before_the_bad_one():
    bad = bytes([0x41])  # request header with a reserved bit
    data = encode_binary(Notify(1)) + b"\x00" + bad + encode_binary(Notify(2))
    assert decode_stream(data) == ([Notify(1), PING], True)


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
@pytest.mark.parametrize("reserved", range(1, 8))
def test_stream_rejects_reserved_header_bits_from_the_header_byte_alone(kind, reserved):
    head = bytes([kind << 6 | reserved])
    with pytest.raises(RemoteProtocolError):
        list(BinaryDecoder().feed(head))
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(head + bytes(8))


@pytest.mark.parametrize("kind", [1, 2, 3])
@pytest.mark.parametrize("encoding", [6, 7])
def test_unknown_encoding_is_rejected(kind, encoding):
    head = bytes([kind << 6 | encoding << 3])
    with pytest.raises(RemoteProtocolError):
        list(BinaryDecoder().feed(head))
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(head + bytes(8))
    fields = {1: "1|2", 2: "3", 3: "1|0"}[kind]
    with pytest.raises(RemoteProtocolError):
        TextDecoder().text_frame(f"{kind}|{encoding}|{fields}")


@pytest.mark.parametrize("encoding", range(1, 8))
def test_ping_header_with_non_zero_bits_is_rejected(encoding):
    head = bytes([encoding << 3])
    with pytest.raises(RemoteProtocolError):
        list(BinaryDecoder().feed(head))
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(head)


def test_stream_rejects_an_oversized_payload_as_soon_as_the_ps_is_read():
    decoder = BinaryDecoder(max_payload=10)
    head = bytes.fromhex("e8 0001 00")  # response, raw, id 1, status 0
    assert list(decoder.feed(head + (10).to_bytes(4, "big"))) == []  # PS = limit: fine
    assert list(decoder.feed(b"x" * 10)) == [Response(1, 0, Encoding.RAW, b"x" * 10)]
    with pytest.raises(RemoteProtocolError):
        list(decoder.feed(head + (11).to_bytes(4, "big")))  # no payload byte sent yet


def test_stream_rejects_the_largest_ps_with_the_default_limit():
    with pytest.raises(RemoteProtocolError):
        list(BinaryDecoder().feed(bytes.fromhex("a8 00000001 ffffffff")))


@pytest.mark.timeout(20)  # linear: well under a second; the old quadratic buffering took minutes
def test_stream_buffers_a_large_payload_in_small_reads_in_linear_time():
    payload = bytes(range(256)) * (16 << 12)  # 16 MiB, the default limit
    data = encode_binary(Notify(0x0A000001, Encoding.RAW, payload)) + b"\x00"
    decoder = BinaryDecoder()
    messages = []
    for i in range(0, len(data), 1024):
        messages.extend(decoder.feed(data[i : i + 1024]))
    assert messages == [Notify(0x0A000001, Encoding.RAW, payload), PING]


# -- binary frames -----------------------------------------------------------------------------


def test_empty_binary_frame_is_rejected():
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(b"")
    with pytest.raises(RemoteProtocolError):
        TextDecoder().binary_frame(b"")


def test_ping_frame_with_extra_bytes_is_rejected():
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(b"\x00\x00")


@pytest.mark.parametrize(
    "message",
    [Request(1, 2), Notify(3), Response(4, 5), Request(1, 2, 5, b"ab"), Notify(3, 2, b"{}")],
    ids=repr,
)
def test_truncated_binary_frames_are_rejected(message):
    fixed = {Request: 7, Notify: 5, Response: 4}[type(message)]
    frame = encode_binary(message, with_ps=False)
    for end in range(1, fixed):
        with pytest.raises(RemoteProtocolError):
            decode_binary_frame(frame[:end])
    assert decode_binary_frame(frame[:fixed]).payload == b""


@pytest.mark.parametrize("head", ["40", "80", "c0"])
def test_payload_on_an_encoding_0_binary_frame_is_rejected(head):
    fields = {"40": "000100000002", "80": "00000003", "c0": "000100"}[head]
    assert decode_binary_frame(bytes.fromhex(head + fields)).encoding == 0
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(bytes.fromhex(head + fields + "78"))


def test_binary_frame_payload_limit():
    frame = encode_binary(Notify(1, Encoding.RAW, b"x" * 10), with_ps=False)
    assert decode_binary_frame(frame, max_payload=10).payload == b"x" * 10
    with pytest.raises(RemoteProtocolError):
        decode_binary_frame(frame + b"x", max_payload=10)


def test_binary_frame_payload_is_everything_after_the_fields():
    frame = bytes.fromhex("d0 0102 24") + b"\x00\x00\x00\x05abc"  # looks like a PS: is not
    assert decode_binary_frame(frame) == Response(0x0102, 0x24, 2, b"\x00\x00\x00\x05abc")


# -- text frames -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2|2|5|a|b|c", Notify(5, 2, b"a|b|c")),
        ("1|2|7|5|a|b", Request(7, 5, 2, b"a|b")),
        ("3|2|7|0||", Response(7, 0, 2, b"|")),
        ("3|3|7|0|||", Response(7, 0, 3, b"||")),
        ("2|2|5|", Notify(5, 2, b"")),
        ("2|2|5|\u00e9\u20ac", Notify(5, 2, "\u00e9\u20ac".encode())),
        ("1|0|65535|4294967295", Request(65535, 0xFFFFFFFF)),
        ("3|0|0|255", Response(0, 255)),
        ("2|0|0", Notify(0)),
        ("2|2|007|x", Notify(7, 2, b"x")),  # leading zeros are still decimal
    ],
)
def test_text_payload_is_everything_after_the_fixed_fields(text, message):
    decoder = TextDecoder()
    assert decoder.text_frame(text) == message
    assert not decoder.waiting_for_payload


def test_header_only_text_frame_takes_the_next_binary_frame_as_payload():
    decoder = TextDecoder()
    assert decoder.text_frame("2|2|5") is None
    assert decoder.waiting_for_payload
    assert decoder.binary_frame(b"a|b") == Notify(5, 2, b"a|b")
    assert not decoder.waiting_for_payload
    assert decoder.binary_frame(bytes.fromhex("8000000005")) == Notify(5)  # a message again
    assert decoder.text_frame("1|5|1|2") is None
    assert decoder.binary_frame(b"") == Request(1, 2, 5, b"")  # empty payload frame: fine
    assert decoder.text_frame("0") == PING


def test_text_frame_while_a_payload_is_pending_is_rejected():
    decoder = TextDecoder()
    assert decoder.text_frame("3|5|1|0") is None
    with pytest.raises(RemoteProtocolError):
        decoder.text_frame("0")


def test_header_only_frame_of_an_encoding_0_message_is_the_message():
    decoder = TextDecoder()
    assert decoder.text_frame("1|0|1|2") == Request(1, 2)
    assert not decoder.waiting_for_payload


BAD_TEXT = [
    # wrong field counts, unknown kinds
    "", "1|0|1", "2|2", "3|0|1", "1", "2", "3", "0|", "0|0", "00", " 0", "4|0|1", "x|0|1",
    "|2|2|5",
    # out of range: id > 65535, status > 255, action > 2**32 - 1, negative, encodings 6+
    "1|0|65536|1", "3|0|65536|0", "3|0|1|256", "1|0|1|4294967296", "2|0|4294967296",
    "2|0|-1", "1|0|-1|1", "3|0|1|-1", "2|-0|1", "2|6|1", "2|7|1", "2|8|1",
    # not plain decimal: spaces, signs, other notations, empty fields
    "2|0| 1", "2|0|1 ", "2| 0|1", "2|0|+1", "2|0|0x10", "2|0|1.0", "2|0|1e3", "2|0|1_0",
    "2|0|", "1|0||1", "2||1",
    # non-ASCII digits: ARABIC-INDIC ONE, FULLWIDTH ONE, SUPERSCRIPT TWO, DEVANAGARI ONE
    "2|0|\u0661", "2|0|\uff11", "2|0|\u00b2", "3|0|\u0967|0",
    # a payload (even an empty one) on an encoding-0 message
    "2|0|1|x", "2|0|1|", "1|0|1|2|x", "3|0|1|2|x",
    # beyond int()'s digit limit (a protocol error, not ValueError); more digits than any field
    "2|0|" + "9" * 5000, "1|2|" + "1" * 4301 + "|1|x", "2|0|" + "0" * 11 + "1",
]  # fmt: skip


@pytest.mark.parametrize("text", BAD_TEXT, ids=lambda t: repr(t[:24]))
def test_bad_text_frame_is_rejected(text):
    decoder = TextDecoder()
    with pytest.raises(RemoteProtocolError):
        decoder.text_frame(text)


def test_text_payload_limit_inline_and_in_the_binary_follow_up():
    decoder = TextDecoder(max_payload=3)
    assert decoder.text_frame("2|2|1|abc") == Notify(1, 2, b"abc")
    with pytest.raises(RemoteProtocolError):
        decoder.text_frame("2|2|1|\u00e9\u00e9")  # 4 bytes of UTF-8
    decoder = TextDecoder(max_payload=3)
    assert decoder.text_frame("2|5|1") is None
    with pytest.raises(RemoteProtocolError):
        decoder.binary_frame(b"abcd")


def test_encode_text_sends_json_inline_and_binary_encodings_in_a_second_frame():
    assert encode_text(Notify(5, Encoding.JSON, b'{"a":"|"}')) == ('2|2|5|{"a":"|"}', None)
    assert encode_text(Notify(5, Encoding.MSGPACK, b"\x81")) == ("2|3|5", b"\x81")
    assert encode_text(Notify(5, Encoding.RAW, b"ok")) == ("2|5|5", b"ok")
    assert encode_text(Notify(5, Encoding.JSON, b"{}"), inline=False) == ("2|2|5", b"{}")
    assert encode_text(Notify(5, Encoding.RAW, b"ok"), inline=True) == ("2|5|5|ok", None)
    assert encode_text(Notify(5, Encoding.JSON, b"")) == ("2|2|5|", None)


def test_encode_text_sends_json_that_is_not_utf8_in_a_second_frame():
    assert encode_text(Request(1, 2, Encoding.JSON, b'"\xff"')) == ("1|2|1|2", b'"\xff"')


def test_encode_text_writes_enums_as_decimal():
    assert encode_text(Response(1, Status.NOT_FOUND)) == ("3|0|1|36", None)
    message = Response(1, Status.VERSION_NOT_SUPPORTED, Encoding.JSON, b"1")
    assert encode_text(message) == ("3|2|1|53|1", None)
    assert encode_binary(message) == bytes.fromhex("d0000135 00000001 31")


# -- encoders refuse what no decoder would accept ----------------------------------------------

UNENCODABLE = [
    # fields out of range
    Request(65536, 1), Request(-1, 1), Request(1, 1 << 32), Request(1, -1), Notify(1 << 32),
    Response(65536, 0), Response(1, 256), Response(1, -1),
    # unknown encodings; a payload without an encoding
    Notify(1, 6, b"x"), Notify(1, 7), Notify(1, -1),
    Notify(1, 0, b"x"), Request(1, 2, 0, b"x"), Response(1, 2, 0, b"x"),
]  # fmt: skip


@pytest.mark.parametrize("message", UNENCODABLE, ids=repr)
def test_encoders_reject_messages_the_protocol_cannot_carry(message):
    with pytest.raises(ValueError):
        encode_binary(message)
    with pytest.raises(ValueError):
        encode_binary(message, with_ps=False)
    with pytest.raises(ValueError):
        encode_text(message)


# -- dotted actions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0.0.0.0"),
        (0x01020304, "1.2.3.4"),
        (0x00000100, "0.0.1.0"),
        (0xFFFFFFFF, "255.255.255.255"),
    ],
)
def test_action_dotted_form_round_trips(value, text):
    assert action_to_str(value) == text
    assert parse_action(text) == value
    assert parse_action(value) == value


@pytest.mark.parametrize(
    "text",
    [
        "", "1.2.3", "1.2.3.4.5", "256.0.0.0", "1.2.3.256", "-1.0.0.0", "+1.0.0.0", "a.b.c.d",
        "1..2.3", "1.2.3.", " 1.2.3.4", "1.2.3.4 ", "1. 2.3.4", "0x1.2.3.4", "1.2.3.4/8",
        # ARABIC-INDIC DIGIT ONE, FULLWIDTH DIGIT FOUR, SUPERSCRIPT TWO
        "\u0661.2.3.4", "1.2.3.\uff14", "1.2.3.\u00b2",
    ],
)  # fmt: skip
def test_bad_dotted_actions_are_rejected(text):
    with pytest.raises(ValueError):
        parse_action(text)


@pytest.mark.parametrize("value", [-1, 1 << 32, True])
def test_out_of_range_integer_actions_are_rejected(value):
    with pytest.raises(ValueError):
        parse_action(value)


@pytest.mark.parametrize("value", [-1, 1 << 32])
def test_action_to_str_rejects_out_of_range_actions(value):
    with pytest.raises(ValueError):
        action_to_str(value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.1.0.0/16", (0x0A010000, 16)),
        ("0.0.1.0/24", (0x00000100, 24)),
        ("0.0.0.0/0", (0, 0)),
        ("1.2.3.4/32", (0x01020304, 32)),
        ("1.2.3.4", (0x01020304, 32)),  # a bare action is a /32
        ("128.0.0.0/1", (0x80000000, 1)),
    ],
)
def test_prefixes_parse(text, expected):
    assert parse_prefix(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "10.1.0.1/16", "10.1.0.0/8", "0.0.0.1/0", "128.0.0.0/0",  # bits outside the prefix
        "10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/", "10.0.0.0/ 8", "10.0.0.0/8 ", "10.0.0.0/+8",
        "10.0.0.0/0x8", "10.0.0.0/8/8", "10.0.0/8", "/8", "", "10.0.0.0/" + "1" * 5000,
        "10.0.0.0/\u0668",  # ARABIC-INDIC DIGIT EIGHT
    ],
    ids=lambda t: repr(t[:24]),
)  # fmt: skip
def test_bad_prefixes_are_rejected(text):
    with pytest.raises(ValueError):
        parse_prefix(text)


# -- versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "raw", "hex_text"),
    [
        ([(0, 1)], b"\x01", b"01"),
        ([(0, 1), (1, 0), (15, 15)], b"\x01\x10\xff", b"0110ff"),
        ([(10, 11)], b"\xab", b"ab"),
        ([], b"", b""),
    ],
)
def test_versions_round_trip_binary_and_text(versions, raw, hex_text):
    assert encode_versions(versions) == raw
    assert encode_versions(versions, text=True) == hex_text
    assert decode_versions(raw) == versions
    assert decode_versions(hex_text, text=True) == versions


@pytest.mark.parametrize(
    "payload",
    [b"1", b"011", b"0G", b"0A", b"AB", b"01 ", b" 01", b"01  ", b"0 1 ", b"01\n0", b"\xff\xfe",
     "\uff10\uff11".encode(), b"0x01", b"-1"],
)  # fmt: skip
def test_bad_text_version_lists_are_rejected(payload):
    with pytest.raises(RemoteProtocolError):
        decode_versions(payload, text=True)


@pytest.mark.parametrize("versions", [[(0, 16)], [(16, 0)], [(-1, 0)], [(0, -1)]])
def test_encode_versions_rejects_out_of_range_numbers(versions):
    with pytest.raises(ValueError):
        encode_versions(versions)
