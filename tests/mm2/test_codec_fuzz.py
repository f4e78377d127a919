"""Property tests of the Micromessage2 codec (hypothesis).

- Garbage (random bytes, token soup, mutated valid streams) fed whole, split at random
  points and one byte at a time: the frame and handshake decoders give frames or raise
  ``RemoteProtocolError``, never anything else, and splitting changes neither the frames
  before the error nor whether there is one. The frame decoder agrees with a slow oracle
  that reads the layouts literally.
- The text parsers (properties, commands, filters, extension lists, URL decoding, pubsub
  requests) raise nothing but ``RemoteProtocolError`` on garbage.
- Round trips: generated frames, handshakes, properties, commands, filters and fragmented
  messages through encode then decode.
"""

from __future__ import annotations

import contextlib
import string
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import (
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
    Unsubscribe,
    acked_count,
    encode_command,
    encode_extension_list,
    encode_filter,
    encode_frame,
    encode_handshake,
    encode_message,
    encode_properties,
    encode_pubsub,
    is_acked,
    next_seq,
    parse_command,
    parse_extension_list,
    parse_filter,
    parse_properties,
    parse_pubsub,
    split_message,
    urldecode,
    urlencode,
)
from msgbroker.plugins.mm2.properties import is_valid_name
from tests.fuzzing import mutated
from tests.mm2.support import feed_frames, feed_handshake, split_at

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies ---------------------------------------------------------------------------------

fields = st.from_regex(r"[a-z0-9-]{1,8}", fullmatch=True)
printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24)
names = st.one_of(printable, st.sampled_from(["", "topic/a", "@hulk", "a b", "~" * 255]))
numbers = st.integers(-(2**63), 2**63 - 1)
dates = st.builds(
    lambda n, k: Decimal(n).scaleb(-k), st.integers(-(10**12), 10**12), st.integers(0, 9)
)
texts = st.one_of(st.text(max_size=16), st.sampled_from(["", ";", "%", "a=b,c", "%20+", "é😀"]))
values = st.one_of(numbers, dates, texts)
properties = st.dictionaries(fields, values, max_size=4)
payloads = st.one_of(st.binary(max_size=40), st.binary(min_size=250, max_size=300))

message_frames = st.builds(
    MessageFrame,
    seq=st.integers(1, 0xFFFF),
    destination=names,
    payload=payloads,
    properties=properties,
    continued=st.booleans(),
)
commands = st.builds(Command, name=fields, args=st.lists(st.tuples(fields, texts), max_size=4))
frames = st.one_of(
    message_frames,
    st.builds(ExtensionFrame, ext_id=st.integers(1, 255), payload=payloads),
    commands,
    st.builds(ErrorFrame, text=st.one_of(texts, st.text(min_size=256, max_size=300))),
)
extensions = st.builds(
    Extension, name=fields, properties=st.dictionaries(fields, texts, max_size=3).map(dict.items)
)
extension_lists = st.lists(extensions, max_size=4, unique_by=lambda e: e.name)
handshakes = st.builds(
    Handshake,
    identity=names,
    required=extension_lists,
    optional=extension_lists,
    major=st.integers(0, 255).filter(lambda m: not m & 0x04),
    minor=st.integers(0, 255),
    flags=st.integers(0, 255),
)
filters = st.one_of(
    st.builds(Filter, key=fields, op=st.sampled_from([o for o in Op if o not in "&~"]),
              value=st.one_of(numbers, dates)),
    st.builds(Filter, key=fields, op=st.sampled_from([o for o in Op if o not in ("<=", ">=")]),
              value=texts),
)  # fmt: skip
split_points = st.lists(st.integers(0, 10_000), max_size=8)
max_payloads = st.sampled_from([0, 3, 255, 300, 1 << 20])


valid_streams = st.lists(frames, max_size=5).map(lambda fs: b"".join(map(encode_frame, fs)))
garbage_streams = st.one_of(
    st.binary(max_size=120),
    st.lists(
        st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x04", b"\x08", b"\x10", b"\x20", b"\xff",
                         b"\x00\x01", b"\x00\x00", b"k:N1;", b"a;b=c", b"\x03"]),
        max_size=30,
    ).map(b"".join),
    valid_streams.flatmap(mutated),
)  # fmt: skip

# -- the frame oracle: the layouts read literally ---------------------------------------------


def _u(data, at, width):
    return int.from_bytes(data[at : at + width], "big") if len(data) >= at + width else None


def _oracle_one(data, i, max_payload):
    """(frame, next index), "more" for an incomplete frame, or "bad"."""
    flags = data[i]
    if flags & 0xE0 or (not flags & 0x04 and flags & 0x03 == 0x03):
        return "bad"
    if flags & 0x03 and not flags & 0x04 and flags & 0x10:
        return "bad"
    width = 4 if flags & 0x08 else 1
    at = i + 1
    if not flags & 0x07:  # MESSAGE
        seq = _u(data, at, 2)
        if seq is None:
            return "more"
        if seq == 0:
            return "bad"
        dest_len = _u(data, at + 2, 1)
        if dest_len is None:
            return "more"
        at += 3
        if len(data) < at + dest_len:
            return "more"
        dest = data[at : at + dest_len]
        if not dest.isascii() or not is_valid_name(dest.decode()):
            return "bad"
        at += dest_len
        props_len = _u(data, at, 2)
        if props_len is None or len(data) < at + 2 + props_len:
            return "more"
        try:
            props = parse_properties(data[at + 2 : at + 2 + props_len])
        except RemoteProtocolError:
            return "bad"
        at += 2 + props_len
    elif flags & 0x02 and not flags & 0x04:  # EXTENSION: the id comes first
        ext_id = _u(data, at, 1)
        if ext_id is None:
            return "more"
        if ext_id == 0:
            return "bad"
        at += 1
    length = _u(data, at, width)
    if length is None:
        return "more"
    if length > max_payload:
        return "bad"
    at += width
    if len(data) < at + length:
        return "more"
    payload = data[at : at + length]
    if flags & 0x04:
        return ErrorFrame(payload.decode("utf-8", "replace")), at + length
    if flags & 0x01:
        try:
            return parse_command(payload), at + length
        except RemoteProtocolError:
            return "bad"
    if flags & 0x02:
        return ExtensionFrame(ext_id, payload), at + length
    frame = MessageFrame(_u(data, i + 1, 2), dest.decode(), payload, props, bool(flags & 0x10))
    return frame, at + length


def oracle_frames(data, max_payload):
    """(frames, raised, unparsed bytes) of a whole stream: an incomplete tail is no error."""
    out, i = [], 0
    while i < len(data):
        result = _oracle_one(data, i, max_payload)
        if result == "bad":
            return out, True, None
        if result == "more":
            break
        frame, i = result
        out.append(frame)
    return out, False, data[i:]


def check_stream(data, points, max_payload=1 << 20):
    """Whole, split at ``points`` and one byte at a time: the oracle's outcome each way."""
    whole = feed_frames([data], max_payload=max_payload)
    assert feed_frames(split_at(data, points), max_payload=max_payload) == whole
    singles = [data[i : i + 1] for i in range(len(data))]
    assert feed_frames(singles, max_payload=max_payload) == whole
    assert whole == oracle_frames(data, max_payload)
    return whole


# -- frames -------------------------------------------------------------------------------------


@FUZZ
@given(garbage_streams, split_points, max_payloads)
def test_frame_garbage_only_raises_protocol_errors_and_ignores_splitting(data, points, maximum):
    check_stream(data, points, maximum)


@FUZZ
@given(garbage_streams, st.binary(max_size=8))
def test_frame_decoder_stays_failed_after_an_error(data, more):
    decoder = FrameDecoder()
    try:
        list(decoder.feed(data))
    except RemoteProtocolError:
        try:
            list(decoder.feed(more))
        except RemoteProtocolError:
            return
        raise AssertionError("a failed decoder read on") from None


@ROUND_TRIP
@given(st.lists(frames, max_size=6), split_points)
def test_frames_round_trip_under_any_split(sent, points):
    data = b"".join(encode_frame(frame) for frame in sent)
    assert check_stream(data, points) == (sent, False, b"")


# -- handshakes ---------------------------------------------------------------------------------


def check_handshake(data, points):
    whole = feed_handshake([data])
    assert feed_handshake(split_at(data, points)) == whole
    assert feed_handshake([data[i : i + 1] for i in range(len(data))]) == whole
    return whole


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=80),
        handshakes.map(encode_handshake).flatmap(mutated),
        st.builds(bytes.__add__, st.sampled_from([b"\x01\x01\x00\x00", b"\x04", b"\x0c"]),
                  st.binary(max_size=40)),
    ),
    split_points,
)  # fmt: skip
def test_handshake_garbage_only_raises_protocol_errors_and_ignores_splitting(data, points):
    message, raised, _ = check_handshake(data, points)
    if data[:1] and data[0] & 0x04 and message is not None:
        assert isinstance(message, ErrorFrame)


@ROUND_TRIP
@given(handshakes, st.binary(max_size=10), split_points)
def test_handshakes_round_trip_with_what_follows_as_trailing_data(handshake, after, points):
    data = encode_handshake(handshake) + after
    assert check_handshake(data, points) == (handshake, False, after)


@ROUND_TRIP
@given(extension_lists)
def test_extension_lists_round_trip(extensions):
    assert parse_extension_list(encode_extension_list(extensions)) == tuple(extensions)


@FUZZ
@given(st.one_of(st.text(max_size=40), st.text("abxy-=:;,%20AF", max_size=40)))
def test_extension_list_garbage_only_raises_protocol_errors(text):
    try:
        parsed = parse_extension_list(text)
    except RemoteProtocolError:
        return
    assert parse_extension_list(encode_extension_list(parsed)) == parsed


# -- text inside frames -------------------------------------------------------------------------


@ROUND_TRIP
@given(st.text())
def test_url_encoding_round_trips_and_writes_only_unreserved_and_escapes(text):
    encoded = urlencode(text)
    assert set(encoded) <= set(string.ascii_letters + string.digits + "-_.~%")
    assert urldecode(encoded) == text


@FUZZ
@given(st.one_of(st.text(max_size=30), st.text("%0aAfFgG+ \x00\x7f~é", max_size=30)))
def test_url_decoding_garbage_only_raises_protocol_errors(text):
    try:
        decoded = urldecode(text)
    except RemoteProtocolError:
        return
    assert urldecode(urlencode(decoded)) == decoded


@ROUND_TRIP
@given(properties)
def test_properties_round_trip_with_their_types(props):
    parsed = parse_properties(encode_properties(props))
    assert parsed == tuple(props.items())
    assert [type(v) for _, v in parsed] == [type(v) for v in props.values()]


property_soup = st.lists(
    st.sampled_from(["k", "a-b", ":", ";", "N", "D", "T", "-", "1", "9" * 20, ".", "%", "%2",
                     "%20", "%FF", "_", "A", " ", "é", "\x00"]),
    max_size=20,
).map("".join)  # fmt: skip


@FUZZ
@given(st.one_of(st.binary(max_size=60), property_soup.map(str.encode).flatmap(mutated)))
def test_property_garbage_only_raises_protocol_errors(data):
    try:
        parsed = parse_properties(data)
    except RemoteProtocolError:
        return
    assert all(isinstance(v, (int, Decimal, str)) for _, v in parsed)


@ROUND_TRIP
@given(commands)
def test_commands_round_trip(command):
    assert parse_command(encode_command(command)) == command


@FUZZ
@given(st.one_of(st.binary(max_size=60), commands.map(encode_command).flatmap(mutated)))
def test_command_garbage_only_raises_protocol_errors(data):
    try:
        command = parse_command(data)
    except RemoteProtocolError:
        return
    assert parse_command(encode_command(command)) == command
    with contextlib.suppress(RemoteProtocolError):
        parse_pubsub(command)


@ROUND_TRIP
@given(filters)
def test_filters_round_trip(filter_):
    assert parse_filter(encode_filter(filter_)) == filter_


filter_soup = st.lists(
    st.sampled_from(["k", "=", "!", "<", ">", "&", "~", "N", "D", "T", "1", "-", ".", "%3D",
                     "%", " ", "x"]),
    max_size=12,
).map("".join)  # fmt: skip


@FUZZ
@given(st.one_of(st.text(max_size=20), filter_soup))
def test_filter_garbage_only_raises_protocol_errors(text):
    try:
        filter_ = parse_filter(text)
    except RemoteProtocolError:
        return
    assert parse_filter(encode_filter(filter_)) == filter_


pubsub_requests = st.one_of(
    st.builds(Unsubscribe, destination=printable.filter(bool)),
    st.builds(
        Subscribe,
        destination=printable.filter(bool),
        queue=st.one_of(st.none(), printable.filter(bool)),
        filters=st.lists(filters, max_size=3).map(tuple),
    ),
)


@ROUND_TRIP
@given(pubsub_requests)
def test_pubsub_requests_round_trip_through_frames(request_):
    data = encode_frame(encode_pubsub(request_))
    (command,), raised, _ = feed_frames([data])
    assert parse_pubsub(command) == request_


# -- fragments and sequence numbers -------------------------------------------------------------


@ROUND_TRIP
@given(message_frames.filter(lambda m: not m.continued), st.integers(1, 64), split_points)
def test_split_messages_reassemble_to_themselves(message, fragment_size, points):
    data = encode_message(message, fragment_size)
    frames, raised, rest = feed_frames(split_at(data, points))
    assert (raised, rest) == (False, b"")
    assert len(frames) == len(split_message(message, fragment_size))
    reassembler = Reassembler()
    assert [m for m in map(reassembler.feed, frames) if m is not None] == [message]


@FUZZ
@given(st.lists(message_frames, max_size=8), st.integers(0, 400))
def test_reassembler_garbage_only_raises_protocol_errors(sequence, maximum):
    reassembler = Reassembler(max_message=maximum)
    try:
        for frame in sequence:
            whole = reassembler.feed(frame)
            assert whole is None or (not whole.continued and len(whole.payload) <= maximum)
    except RemoteProtocolError:
        pass


@FUZZ
@given(st.integers(1, 0xFFFF), st.integers(0, 0xFFFF), st.integers(1, 0xFFFF))
def test_acked_count_is_the_number_of_window_seqs_is_acked_covers(oldest, outstanding, ack):
    count = acked_count(oldest, outstanding, ack)
    if count:
        seq = (oldest - 1 + count - 1) % 0xFFFF + 1  # count - 1 steps of next_seq
        assert seq == ack  # the last one acknowledged is the ack's own seq
        assert is_acked(seq, ack, oldest)
        assert count == 0xFFFF or not is_acked(next_seq(seq), ack, oldest)
