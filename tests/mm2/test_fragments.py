"""Micromessage2 payloads over 1 MiB (CONTINUED), sequence numbers and cumulative acks."""

from __future__ import annotations

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import (
    CONTINUED,
    FRAGMENT_SIZE,
    LARGE,
    ExtensionFrame,
    FrameDecoder,
    MessageFrame,
    Reassembler,
    ack_frame,
    acked_count,
    encode_frame,
    encode_message,
    is_acked,
    next_seq,
    parse_ack,
    seq_distance,
    split_message,
)

MIB = 1 << 20

# -- splitting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, MIB])
def test_a_payload_of_at_most_1_mib_is_one_frame(size):
    message = MessageFrame(1, "t", b"x" * size, {"k": 1})
    assert split_message(message) == [message]


def test_a_payload_over_1_mib_is_split_into_1_mib_fragments():
    payload = bytes(range(256)) * (3 * MIB // 256) + b"tail"
    frames = split_message(MessageFrame(9, "big", payload, {"k": 1}))
    assert [len(f.payload) for f in frames] == [MIB, MIB, MIB, 4]
    assert [f.continued for f in frames] == [True, True, True, False]
    assert [f.properties for f in frames] == [(("k", 1),), (), (), ()]
    assert {(f.seq, f.destination) for f in frames} == {(9, "big")}
    assert b"".join(f.payload for f in frames) == payload


def test_one_byte_over_1_mib_is_two_frames():
    frames = split_message(MessageFrame(1, "t", b"x" * (MIB + 1)))
    assert [len(f.payload) for f in frames] == [MIB, 1]
    assert FRAGMENT_SIZE == MIB


def test_fragments_carry_continued_on_the_wire_except_the_last():
    data = encode_message(MessageFrame(1, "t", b"abcdefg"), fragment_size=3)
    frames = list(FrameDecoder().feed(data))
    assert [f.payload for f in frames] == [b"abc", b"def", b"g"]
    first = encode_frame(frames[0])
    assert first[0] == CONTINUED
    assert encode_frame(frames[2])[0] == 0


def test_a_fragment_cannot_be_split_again():
    with pytest.raises(ValueError, match="continued"):
        split_message(MessageFrame(1, "t", b"abc", continued=True))
    with pytest.raises(ValueError, match="positive"):
        split_message(MessageFrame(1, "t", b"abc"), fragment_size=0)


def test_a_large_message_travels_and_reassembles_under_the_default_limits():
    payload = b"\x00\xff" * (MIB + 12345)  # 2 MiB + change: three frames of at most 1 MiB
    message = MessageFrame(65535, "@hulk", payload, {"n": -1})
    data = encode_message(message)
    assert data[0] == CONTINUED | LARGE
    decoder, reassembler = FrameDecoder(), Reassembler()
    out = []
    for start in range(0, len(data), 65536):  # a socket's reads
        for frame in decoder.feed(data[start : start + 65536]):
            whole = reassembler.feed(frame)
            if whole is not None:
                out.append(whole)
    assert out == [message]


# -- reassembling -------------------------------------------------------------------------------


def test_a_message_in_one_frame_passes_straight_through():
    reassembler = Reassembler()
    message = MessageFrame(1, "t", b"x", {"k": 1})
    assert reassembler.feed(message) is message
    assert not reassembler.in_progress


def test_fragments_join_into_one_message_with_the_first_ones_properties():
    reassembler = Reassembler()
    assert reassembler.feed(MessageFrame(4, "t", b"ab", {"k": 1}, continued=True)) is None
    assert reassembler.in_progress
    assert reassembler.feed(MessageFrame(4, "t", b"", continued=True)) is None
    assert reassembler.feed(MessageFrame(4, "t", b"cd")) == MessageFrame(4, "t", b"abcd", {"k": 1})
    assert not reassembler.in_progress
    assert reassembler.feed(MessageFrame(5, "t", b"e")) == MessageFrame(5, "t", b"e")


@pytest.mark.parametrize(
    ("second", "match"),
    [
        (MessageFrame(5, "t", b"x"), "while message 4"),
        (MessageFrame(4, "u", b"x"), "while message 4"),
        (MessageFrame(4, "t", b"x", {"k": 1}), "properties"),
    ],
)
def test_a_fragment_that_does_not_continue_the_message_is_a_protocol_error(second, match):
    reassembler = Reassembler()
    reassembler.feed(MessageFrame(4, "t", b"ab", continued=True))
    with pytest.raises(RemoteProtocolError, match=match):
        reassembler.feed(second)


def test_the_total_is_bounded_as_fragments_arrive():
    reassembler = Reassembler(max_message=5)
    reassembler.feed(MessageFrame(1, "t", b"abc", continued=True))
    with pytest.raises(RemoteProtocolError, match="over 5 bytes"):
        reassembler.feed(MessageFrame(1, "t", b"def", continued=True))  # not the last yet


def test_a_total_at_the_bound_is_accepted():
    reassembler = Reassembler(max_message=5)
    reassembler.feed(MessageFrame(1, "t", b"abc", continued=True))
    assert reassembler.feed(MessageFrame(1, "t", b"de")).payload == b"abcde"
    with pytest.raises(RemoteProtocolError, match="exceeds 5"):
        reassembler.feed(MessageFrame(2, "t", b"abcdef"))  # a single frame too


# -- sequence numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("seq", "after"), [(0, 1), (1, 2), (65534, 65535), (65535, 1)])
def test_sequence_numbers_start_at_1_and_wrap_past_0(seq, after):
    assert next_seq(seq) == after


@pytest.mark.parametrize("seq", [-1, 65536])
def test_next_seq_outside_the_range_is_a_value_error(seq):
    with pytest.raises(ValueError, match="sequence number"):
        next_seq(seq)


def test_a_counter_goes_round_the_cycle_of_65535_numbers():
    seq, seen = 0, []
    for _ in range(65536):
        seq = next_seq(seq)
        seen.append(seq)
    assert seen[0] == 1
    assert seen[-1] == 1
    assert sorted(set(seen)) == list(range(1, 65536))


@pytest.mark.parametrize(
    ("start", "seq", "distance"),
    [(1, 1, 0), (1, 4, 3), (65534, 65535, 1), (65534, 1, 2), (65535, 65534, 65534), (2, 1, 65534)],
)
def test_seq_distance_counts_steps_across_the_wrap(start, seq, distance):
    assert seq_distance(start, seq) == distance


@pytest.mark.parametrize(
    ("oldest", "outstanding", "ack", "count"),
    [
        (1, 4, 4, 4),  # V10: acks 1..4
        (65534, 3, 1, 3),  # V11: acks 65534, 65535 and 1
        (65534, 3, 65535, 2),
        (65534, 3, 65534, 1),
        (65534, 3, 2, 0),  # not sent yet
        (5, 3, 4, 0),  # stale: 4 was acked before
        (5, 0, 5, 0),  # nothing outstanding
        (1, 65535, 65535, 65535),
    ],
)
def test_a_cumulative_ack_covers_the_window_up_to_its_seq(oldest, outstanding, ack, count):
    assert acked_count(oldest, outstanding, ack) == count


def test_acked_count_refuses_a_window_beyond_the_cycle():
    with pytest.raises(ValueError, match="outstanding"):
        acked_count(1, 65536, 1)


def test_is_acked_across_the_wrap():
    assert is_acked(65535, ack=1, oldest=65534)
    assert is_acked(1, ack=1, oldest=65534)
    assert not is_acked(2, ack=1, oldest=65534)
    assert not is_acked(65533, ack=1, oldest=65534)  # before the window: after it, circularly


def test_ack_frames_carry_a_u16_seq():
    assert encode_frame(ack_frame(3, 4)) == bytes.fromhex("0203020004")
    assert parse_ack(ack_frame(3, 65535)) == 65535
    with pytest.raises(ValueError, match="sequence number"):
        ack_frame(3, 0)


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x00\x01\x02", b"\x00\x00"])
def test_bad_ack_payloads_are_protocol_errors(payload):
    with pytest.raises(RemoteProtocolError):
        parse_ack(ExtensionFrame(3, payload))
