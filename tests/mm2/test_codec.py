"""Micromessage2 codec conformance: every vector of tests/vectors/micromessage2.md, and the
frame layer (flags, lengths, errors) as docs/mm2.md ("Decisions") fixes it.

Every decoding check feeds the bytes whole, one byte at a time and split at every point,
and requires the same frames (and the same error) each way.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import (
    COMMAND,
    CONTINUED,
    ERROR,
    EXTENSION,
    LARGE,
    Command,
    ErrorFrame,
    Extension,
    ExtensionFrame,
    Filter,
    FrameDecoder,
    Handshake,
    MessageFrame,
    Op,
    Reassembler,
    Subscribe,
    acked_count,
    active_extensions,
    encode_frame,
    encode_handshake,
    encode_pubsub,
    frame_type,
    negotiate_minor,
    parse_ack,
    parse_pubsub,
    split_message,
)
from tests.mm2.support import decode_frames, decode_handshake

#: the project's byte-exact Micromessage2 vectors, kept in the repository (tests/vectors/)
VECTORS_FILE = Path(__file__).parents[1] / "vectors" / "micromessage2.md"
_VECTOR_RE = re.compile(
    r"^### (V\w+) (.*?)\n(.*?)```\n(.*?)```\n\((\d+) bytes\)", re.MULTILINE | re.DOTALL
)


def read_vectors():
    """{id: (title, description, bytes, byte count)} from the markdown: a ``### Vn title``
    heading, a description, the hex in a fenced block, then ``(N bytes)``."""
    found = {}
    for ident, title, description, hex_text, count in _VECTOR_RE.findall(VECTORS_FILE.read_text()):
        found[ident] = (title, description.strip(), bytes.fromhex(hex_text), int(count))
    return found


VECTORS = read_vectors()

HULK_REQUIRED = (Extension("json"), Extension("dotnet"))
V3_CONFIRM = Handshake("hulk", HULK_REQUIRED, (Extension("batch-ack", {"max-count": "10"}),))
V13_SUBSCRIBE = Subscribe(
    "topic/domain-events",
    filters=(Filter("user-id", Op.GE, 10), Filter("name", Op.LT, "Hel lo")),
)
DOTNET_TYPE = b"OneTrueError.Contracts.Reports,OneTrueError.Client"

#: what each vector holds: (kind, value). Kinds: "handshake" and "frame" are written by the
#: encoder and read by the decoders; "handshake-parse-only" and "frame-parse-only" are read
#: only (V5 has major 3, V8 an untyped property and "_" in a key: accept, never emit).
EXPECTED = {
    "V1": ("handshake", Handshake("hulk", HULK_REQUIRED)),
    "V2": ("handshake", Handshake("server", (), ("batch-ack",))),
    "V3": ("handshake", V3_CONFIRM),
    "V4": ("handshake", Handshake("hulk", HULK_REQUIRED, minor=0)),
    "V5": ("handshake-parse-only", Handshake("day1", ("json",), major=3)),
    "V6": ("frame", MessageFrame(1, "commands", b'{"id":1}')),
    "V7": (
        "frame",
        MessageFrame(
            2,
            "topic/domain-events",
            b"hi",
            {"user-id": 42, "name": 'Hello "world"', "created": Decimal("1413198000.0")},
        ),
    ),
    "V8": ("frame-parse-only", MessageFrame(2, "MQ", b"mother", {"last_name": "kalle"})),
    "V9": ("frame", MessageFrame(3, "", b"A" * 300)),
    "V10": ("frame", ExtensionFrame(3, b"\x00\x04")),
    "V11": ("frame", ExtensionFrame(3, b"\x00\x01")),
    "V12": ("frame", ExtensionFrame(2, DOTNET_TYPE)),
    "V13": (
        "frame",
        Command(
            "subscribe",
            (
                ("destination", "topic/domain-events"),
                ("filter", "user-id>=N10"),
                ("filter", "name<THel%20lo"),
            ),
        ),
    ),
    "V14": ("frame", ErrorFrame("unsupported extensions: x-foo")),
    "V15a": ("frame", MessageFrame(5, "commands", b"abc", {"k": "1"}, continued=True)),
    "V15b": ("frame", MessageFrame(5, "commands", b"def")),
}


def vector_bytes(ident):
    """The vector's bytes; V9's hex shows the header only, its payload is 300 x 0x41."""
    _, description, data, _ = VECTORS[ident]
    if ident == "V9":
        assert "300 x 0x41" in description
        return data + b"A" * 300
    return data


def vector_cases(*kinds):
    idents = [i for i, (kind, _) in EXPECTED.items() if kind in kinds]
    return pytest.mark.parametrize("ident", idents)


# -- the vectors --------------------------------------------------------------------------------


def test_every_vector_in_the_file_is_checked():
    assert sorted(VECTORS) == sorted(EXPECTED)


def test_vector_byte_counts_match_their_notes():
    """The hex was read whole: each block has the length its note gives."""
    for ident, (_, _, data, count) in VECTORS.items():
        assert len(data) == count, ident


@vector_cases("handshake")
def test_handshake_vector_encodes_byte_exactly(ident):
    assert encode_handshake(EXPECTED[ident][1]) == vector_bytes(ident)


@vector_cases("handshake", "handshake-parse-only")
def test_handshake_vector_decodes_whole_and_split(ident):
    assert decode_handshake(vector_bytes(ident)) == (EXPECTED[ident][1], False, b"")


@vector_cases("frame")
def test_frame_vector_encodes_byte_exactly(ident):
    assert encode_frame(EXPECTED[ident][1]) == vector_bytes(ident)


@vector_cases("frame", "frame-parse-only")
def test_frame_vector_decodes_whole_and_split(ident):
    assert decode_frames(vector_bytes(ident)) == ([EXPECTED[ident][1]], False, b"")


def test_v1_to_v4_negotiate_minor_1_or_the_spec_literal_0():
    for ident, minor in (("V1", 1), ("V2", 1), ("V3", 1), ("V4", 0)):
        assert negotiate_minor(decode_handshake(vector_bytes(ident))[0]) == minor


def test_v3_numbers_the_active_extensions_json_dotnet_batch_ack():
    active = active_extensions(decode_handshake(vector_bytes("V3"))[0])
    assert [active.id_of(name) for name in ("json", "dotnet", "batch-ack")] == [1, 2, 3]


def test_v5_major_3_parses_but_negotiation_rejects_it():
    hello = decode_handshake(vector_bytes("V5"))[0]
    assert hello.major == 3
    with pytest.raises(RemoteProtocolError, match="major"):
        negotiate_minor(hello)


def test_v8_untyped_value_and_underscore_key_are_read_but_never_written():
    with pytest.raises(ValueError, match="FIELD"):
        encode_frame(EXPECTED["V8"][1])


def test_v9_uses_large_for_a_300_byte_payload():
    assert vector_bytes("V9")[0] == LARGE


def test_v10_and_v11_are_cumulative_acks_across_the_wrap():
    v10, v11 = (decode_frames(vector_bytes(i))[0][0] for i in ("V10", "V11"))
    assert parse_ack(v10) == 4
    assert acked_count(oldest=1, outstanding=4, ack=parse_ack(v10)) == 4
    assert parse_ack(v11) == 1
    assert acked_count(oldest=65534, outstanding=3, ack=parse_ack(v11)) == 3


def test_v13_is_a_subscribe_with_two_filters():
    (command,), _, _ = decode_frames(vector_bytes("V13"))
    assert parse_pubsub(command) == V13_SUBSCRIBE
    assert encode_frame(encode_pubsub(V13_SUBSCRIBE)) == vector_bytes("V13")


def test_v14_error_frame_arrives_instead_of_the_step_2_handshake():
    assert decode_handshake(vector_bytes("V14")) == (EXPECTED["V14"][1], False, b"")


def test_v15_fragments_reassemble_and_are_what_splitting_writes():
    stream = vector_bytes("V15a") + vector_bytes("V15b")
    frames, _, _ = decode_frames(stream)
    reassembler = Reassembler()
    assert [reassembler.feed(frame) for frame in frames] == [
        None,
        MessageFrame(5, "commands", b"abcdef", {"k": "1"}),
    ]
    whole = MessageFrame(5, "commands", b"abcdef", {"k": "1"})
    assert b"".join(encode_frame(f) for f in split_message(whole, fragment_size=3)) == stream


# -- flags --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (0x00, 0),
        (LARGE, 0),
        (CONTINUED, 0),
        (LARGE | CONTINUED, 0),
        (COMMAND, COMMAND),
        (COMMAND | LARGE, COMMAND),
        (EXTENSION, EXTENSION),
        (ERROR, ERROR),
        (ERROR | COMMAND, ERROR),
        (ERROR | EXTENSION, ERROR),
        (ERROR | COMMAND | EXTENSION | LARGE | CONTINUED, ERROR),
    ],
)
def test_frame_type_of_flags_error_wins(flags, kind):
    assert frame_type(flags) == kind


@pytest.mark.parametrize(
    "flags",
    [0x20, 0x40, 0x80, 0x21, 0xFF, COMMAND | EXTENSION, COMMAND | CONTINUED, EXTENSION | CONTINUED],
)
def test_unknown_or_contradictory_flags_are_protocol_errors(flags):
    with pytest.raises(RemoteProtocolError):
        frame_type(flags)
    assert decode_frames(bytes([flags, 1, 2, 3]))[:2] == ([], True)


def test_error_wins_over_command_and_extension_bits_on_the_wire():
    data = bytes([ERROR | COMMAND | EXTENSION, 3]) + b"bad"
    assert decode_frames(data) == ([ErrorFrame("bad")], False, b"")


def test_continued_on_an_error_frame_is_ignored_so_the_reason_arrives():
    assert decode_frames(bytes([ERROR | CONTINUED, 2]) + b"no")[0] == [ErrorFrame("no")]


# -- lengths ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "large"), [(0, False), (255, False), (256, True), (700, True)])
def test_large_is_written_exactly_when_the_payload_exceeds_255_bytes(size, large):
    for frame in (
        MessageFrame(1, "t", b"x" * size),
        ExtensionFrame(1, b"x" * size),
        ErrorFrame("x" * size),
        Command("c", {"k": "x" * max(size - 4, 0)}),
    ):
        data = encode_frame(frame)  # the command's payload is "c;k=" and size - 4 x's
        assert bool(data[0] & LARGE) == large
        assert decode_frames(data) == ([frame], False, b"")


def test_large_is_accepted_for_a_short_payload():
    data = bytes([LARGE, 0, 7, 1]) + b"t" + b"\x00\x00" + (3).to_bytes(4, "big") + b"abc"
    assert decode_frames(data)[0] == [MessageFrame(7, "t", b"abc")]
    assert decode_frames(bytes([EXTENSION | LARGE, 9, 0, 0, 0, 1, 0x2A]))[0] == [
        ExtensionFrame(9, b"*")
    ]


def test_payload_over_the_maximum_is_refused_when_its_length_arrives():
    decoder = FrameDecoder(max_payload=10)
    header = bytes([LARGE, 0, 1, 0, 0, 0]) + (11).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="exceeds 10"):
        list(decoder.feed(header))  # before any payload byte


def test_payload_at_the_maximum_is_accepted():
    frame = MessageFrame(1, "t", b"x" * 10)
    assert decode_frames(encode_frame(frame), max_payload=10)[0] == [frame]
    assert decode_frames(encode_frame(ErrorFrame("x" * 11)), max_payload=10)[:2] == ([], True)


# -- frame contents -----------------------------------------------------------------------------


def test_several_frames_in_one_chunk_come_out_in_order():
    frames = [
        MessageFrame(1, "a", b"1"),
        Command("subscribe", {"destination": "a"}),
        ExtensionFrame(1, b"\x00\x01"),
        MessageFrame(2, "a", b"2", {"n": 1}),
        ErrorFrame("bye"),
    ]
    data = b"".join(encode_frame(f) for f in frames)
    assert decode_frames(data) == (frames, False, b"")


def test_an_incomplete_frame_stays_buffered():
    data = encode_frame(MessageFrame(1, "a", b"123"))
    assert decode_frames(data[:-1]) == ([], False, data[:-1])


def test_next_event_reads_one_frame_at_a_time():
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(ExtensionFrame(1)) + encode_frame(ExtensionFrame(2)))
    assert decoder.next_event() == ExtensionFrame(1)
    assert decoder.next_event() == ExtensionFrame(2)
    assert decoder.next_event() is None


def test_feed_buffers_even_when_the_result_is_not_iterated():
    decoder = FrameDecoder()
    decoder.feed(encode_frame(ExtensionFrame(1)))
    assert list(decoder.feed(b"")) == [ExtensionFrame(1)]


def test_frames_before_a_bad_one_are_given_then_every_call_raises():
    decoder = FrameDecoder()
    events = decoder.feed(encode_frame(ExtensionFrame(1)) + bytes([EXTENSION, 0, 0]))
    assert next(events) == ExtensionFrame(1)
    with pytest.raises(RemoteProtocolError, match="extension id 0"):
        next(events)
    with pytest.raises(RemoteProtocolError):
        list(decoder.feed(encode_frame(ExtensionFrame(1))))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (bytes([0, 0, 0, 0, 0, 0, 0]), "sequence number 0"),
        (bytes([0, 0, 1, 2]) + "é".encode() + b"\x00\x00\x00", "not ASCII"),
        (bytes([0, 0, 1, 2, 0x41, 0x0A, 0, 0, 0]), "control"),
        (bytes([0, 0, 1, 0, 0, 4]) + b"k:Nx" + b"\x00", "number"),
        (bytes([0, 0, 1, 0, 0, 4]) + b"k:T%" + b"\x00", "URL"),
        (bytes([EXTENSION, 0, 0]), "extension id 0"),
        (bytes([COMMAND, 3]) + b"Sub", "command name"),
        (bytes([COMMAND, 0]), "command name"),
        (bytes([COMMAND, 5]) + b"a;b=%", "URL"),
    ],
)
def test_bad_frame_contents_are_protocol_errors(data, match):
    with pytest.raises(RemoteProtocolError, match=match):
        list(FrameDecoder().feed(data))
    assert decode_frames(data)[:2] == ([], True)


def test_error_text_that_is_not_utf8_is_kept_with_replacement_characters():
    assert decode_frames(bytes([ERROR, 3]) + b"a\xffb")[0] == [ErrorFrame("a\ufffdb")]


def test_destination_may_be_empty_and_hold_spaces_and_slashes():
    for destination in ("", "a b", "topic/x", "@hulk", "~" * 255):
        frame = MessageFrame(1, destination)
        assert decode_frames(encode_frame(frame))[0] == [frame]


@pytest.mark.parametrize(
    "frame",
    [
        MessageFrame(0, "t"),
        MessageFrame(65536, "t"),
        MessageFrame(1, "x" * 256),
        MessageFrame(1, "é"),
        MessageFrame(1, "a\nb"),
        MessageFrame(1, "t", properties={"Bad": 1}),
        MessageFrame(1, "t", properties={"k": "x" * 70000}),
        ExtensionFrame(0),
        ExtensionFrame(256),
        Command("Subscribe"),
        Command("c", {"Key": "v"}),
    ],
)
def test_frames_the_protocol_cannot_carry_are_value_errors(frame):
    with pytest.raises(ValueError):  # the messages differ per field
        encode_frame(frame)


def test_encode_frame_refuses_what_is_not_a_frame():
    with pytest.raises(TypeError):
        encode_frame(Handshake("x"))  # type: ignore[arg-type]


def test_an_extension_id_0_is_refused_as_soon_as_its_byte_arrives():
    """Found by the fuzzer: the decoder waited for the length byte before looking at the
    id, so one-byte reads reported the error later than a whole read did."""
    decoder = FrameDecoder()
    assert list(decoder.feed(b"\x02")) == []
    with pytest.raises(RemoteProtocolError, match="extension id 0"):
        list(decoder.feed(b"\x00"))
