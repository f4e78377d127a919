"""Property tests of the STMP codec (hypothesis).

- Garbage (random bytes, token soup, mutated valid streams and frames), fed whole, split
  at random points and one byte at a time: the decoders return messages or raise
  ``RemoteProtocolError``, never anything else, and splitting changes neither the
  messages before the error nor whether there is one.
- Differential: the decoders agree with slow oracles that read the grammar literally.
- Round trips: generated messages (every kind, encodings 0-5, fields across their ranges,
  payloads with ``|`` and bytes that are not UTF-8) through the binary stream, binary
  frames and text frames (the two-frame form included).
"""

from __future__ import annotations

import itertools
import re
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp.codec import (
    DEFAULT_MAX_PAYLOAD,
    PING,
    BinaryDecoder,
    Encoding,
    Notify,
    Request,
    Response,
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
from tests.fuzzing import mutated

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies --------------------------------------------------------------------------------

ids = st.one_of(st.sampled_from([0, 1, 0xFFFE, 0xFFFF]), st.integers(0, 0xFFFF))
actions = st.one_of(st.sampled_from([0, 0x100, 0x7FFFFFFF, 0xFFFFFFFF]), st.integers(0, 2**32 - 1))
statuses = st.integers(0, 0xFF)
payloads = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda t: t.encode("utf-8")),
    st.sampled_from([b"", b"|", b"a|b|c", b"||", b"\xff\xfe", b"\x00", b'{"a":"|"}', b"\xc3"]),
)


@st.composite
def messages(draw):
    kind = draw(st.sampled_from(["ping", "request", "notify", "response"]))
    if kind == "ping":
        return PING
    encoding = draw(st.sampled_from(list(Encoding)))
    payload = draw(payloads) if encoding else b""
    if kind == "request":
        return Request(draw(ids), draw(actions), encoding, payload)
    if kind == "notify":
        return Notify(draw(actions), encoding, payload)
    return Response(draw(ids), draw(statuses), encoding, payload)


max_payloads = st.sampled_from([0, 3, 16, DEFAULT_MAX_PAYLOAD])
split_points = st.lists(st.integers(0, 10_000), max_size=8)


valid_streams = st.lists(messages(), max_size=6).map(
    lambda ms: b"".join(encode_binary(m) for m in ms)
)
garbage_streams = st.one_of(
    st.binary(max_size=120),
    st.lists(
        st.sampled_from(
            [b"\x00", b"\x40", b"\x68", b"\x90", b"\xe8", b"\x00\x00\x00\x01", b"\xff"]
        ),
        max_size=30,
    ).map(b"".join),
    valid_streams.flatmap(mutated),
)

TEXT_TOKENS = [
    "0", "1", "2", "3", "4", "5", "6", "|", "||", "00", "65535", "65536", "255", "256",
    "4294967295", "4294967296", "-1", " ", "+1", "x", "", "{}", "\u00e9", "\u0661", "\u00b2",
    "\uff11", "9" * 11, "\ud800",
]  # fmt: skip
texts = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(TEXT_TOKENS), max_size=12).map("".join),
    messages().map(lambda m: encode_text(m)[0]),
)

# -- oracles: the grammar read literally ----------------------------------------------------

_FIELDS = {1: struct.Struct(">HI"), 2: struct.Struct(">I"), 3: struct.Struct(">HB")}
_FIELD_SIZE = {kind: fields.size for kind, fields in _FIELDS.items()}


def _build(kind, encoding, fields, payload):
    if kind == 1:
        return Request(fields[0], fields[1], encoding, payload)
    if kind == 2:
        return Notify(fields[0], encoding, payload)
    return Response(fields[0], fields[1], encoding, payload)


def _fields(kind, raw):
    return _FIELDS[kind].unpack(raw)


def oracle_stream(data, max_payload):
    """(messages, error) of a whole stream: an incomplete tail is no error."""
    out, i = [], 0
    while i < len(data):
        head = data[i]
        kind, encoding = head >> 6, (head >> 3) & 7
        if head & 7 or (kind == 0 and head) or (kind and encoding > 5):
            return out, True
        if kind == 0:
            out.append(PING)
            i += 1
            continue
        j = i + 1 + _FIELD_SIZE[kind]
        if j > len(data):
            return out, False
        fields = _fields(kind, data[i + 1 : j])
        if encoding == 0:
            out.append(_build(kind, 0, fields, b""))
            i = j
            continue
        if j + 4 > len(data):
            return out, False
        size = int.from_bytes(data[j : j + 4], "big")
        if size > max_payload:
            return out, True
        if j + 4 + size > len(data):
            return out, False
        out.append(_build(kind, encoding, fields, data[j + 4 : j + 4 + size]))
        i = j + 4 + size
    return out, False


def oracle_frame(frame, max_payload):
    """The message of one binary frame (no PS), or None for a bad frame."""
    if frame == b"\x00":
        return PING
    if not frame:
        return None
    head = frame[0]
    kind, encoding = head >> 6, (head >> 3) & 7
    if head & 7 or kind == 0 or encoding > 5 or len(frame) < 1 + _FIELD_SIZE[kind]:
        return None
    payload = frame[1 + _FIELD_SIZE[kind] :]
    if (encoding == 0 and payload) or len(payload) > max_payload:
        return None
    return _build(kind, encoding, _fields(kind, frame[1 : 1 + _FIELD_SIZE[kind]]), payload)


_NUM = "([0-9]{1,10})"
_TEXT = {
    1: re.compile(rf"1\|{_NUM}\|{_NUM}\|{_NUM}(\|.*)?", re.DOTALL),
    2: re.compile(rf"2\|{_NUM}\|{_NUM}(\|.*)?", re.DOTALL),
    3: re.compile(rf"3\|{_NUM}\|{_NUM}\|{_NUM}(\|.*)?", re.DOTALL),
}
_TEXT_LIMITS = {1: [0xFFFF, 0xFFFFFFFF], 2: [0xFFFFFFFF], 3: [0xFFFF, 0xFF]}


def oracle_text(text, max_payload):
    """ "header" (a header awaiting its binary payload), a message, or None for bad."""
    if text == "0":
        return PING
    kind = int(text[0]) if text[:1] in ("1", "2", "3") else None
    match = _TEXT[kind].fullmatch(text) if kind else None
    if match is None:
        return None
    encoding, *numbers, rest = match.groups()
    encoding, numbers = int(encoding), [int(n) for n in numbers]
    if encoding > 5 or any(n > limit for n, limit in zip(numbers, _TEXT_LIMITS[kind], strict=True)):
        return None
    if rest is None:
        return "header" if encoding else _build(kind, 0, numbers, b"")
    payload = rest[1:].encode("utf-8", "surrogatepass")
    if encoding == 0 or len(payload) > max_payload:
        return None
    return _build(kind, encoding, numbers, payload)


# -- feeding -----------------------------------------------------------------------------------


def feed_chunks(decoder, chunks):
    """(messages, raised): feeding stops at the first RemoteProtocolError; any other
    exception escapes and fails the test."""
    out = []
    for chunk in chunks:
        try:
            out.extend(decoder.feed(chunk))
        except RemoteProtocolError:
            return out, True
    return out, False


def split_at(data, points):
    cuts = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def check_stream(data, points, max_payload):
    """Whole, split at ``points`` and one byte at a time: the same outcome, the oracle's."""
    whole = feed_chunks(BinaryDecoder(max_payload), [data])
    assert feed_chunks(BinaryDecoder(max_payload), split_at(data, points)) == whole
    singles = [data[i : i + 1] for i in range(len(data))]
    assert feed_chunks(BinaryDecoder(max_payload), singles) == whole
    assert whole == oracle_stream(data, max_payload)
    return whole


# -- garbage -----------------------------------------------------------------------------------


@FUZZ
@given(garbage_streams, split_points, max_payloads)
def test_binary_stream_garbage_only_raises_protocol_errors_and_ignores_splitting(
    data, points, max_payload
):
    check_stream(data, points, max_payload)


@FUZZ
@given(valid_streams.flatmap(mutated), split_points)
def test_mutated_binary_stream_matches_the_oracle_under_any_split(data, points):
    check_stream(data, points, DEFAULT_MAX_PAYLOAD)


@FUZZ
@given(garbage_streams, st.integers(0, 20), max_payloads)
def test_binary_stream_stays_failed_after_an_error(data, tail, max_payload):
    decoder = BinaryDecoder(max_payload)
    messages, raised = feed_chunks(decoder, [data])
    if raised:  # the bad message is still in front: more bytes raise again, yield nothing
        assert feed_chunks(decoder, [bytes(tail)]) == ([], True)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=60),
        messages().map(lambda m: encode_binary(m, with_ps=False)).flatmap(mutated),
    ),
    max_payloads,
)
def test_binary_frame_garbage_matches_the_oracle(frame, max_payload):
    expected = oracle_frame(frame, max_payload)
    try:
        message = decode_binary_frame(frame, max_payload)
    except RemoteProtocolError:
        assert expected is None
    else:
        assert message == expected
        assert encode_binary(message, with_ps=False) == frame  # one spelling per message


@FUZZ
@given(texts, max_payloads)
def test_text_frame_garbage_matches_the_oracle(text, max_payload):
    expected = oracle_text(text, max_payload)
    decoder = TextDecoder(max_payload)
    try:
        message = decoder.text_frame(text)
    except RemoteProtocolError:
        assert expected is None
    else:
        assert decoder.waiting_for_payload == (expected == "header")
        assert message == (None if expected == "header" else expected)


frames = st.one_of(
    texts.map(lambda t: ("text", t)),
    st.binary(max_size=30).map(lambda b: ("binary", b)),
    messages().map(lambda m: ("binary", encode_binary(m, with_ps=False))),
)


@FUZZ
@given(st.lists(frames, max_size=8), max_payloads)
def test_text_decoder_frame_sequences_only_raise_protocol_errors(sequence, max_payload):
    """Random interleavings of text and binary frames: each frame's outcome is the one the
    oracles give for the decoder's state (pending header or not) when it arrives."""
    decoder = TextDecoder(max_payload)
    pending = False  # the oracle's view: a header waits for its payload frame
    for kind, frame in sequence:
        if kind == "text":  # None: bad; a text frame is always bad while a payload is due
            expected = None if pending else oracle_text(frame, max_payload)
        elif pending:
            expected = "payload" if len(frame) <= max_payload else None
        else:
            expected = oracle_frame(frame, max_payload)
        try:
            got = decoder.text_frame(frame) if kind == "text" else decoder.binary_frame(frame)
        except RemoteProtocolError:
            assert expected is None
            return
        if expected == "header":
            assert got is None
            pending = True
        elif expected == "payload":
            assert got.payload == frame
            pending = False
        else:
            assert got == expected
        assert decoder.waiting_for_payload == pending


@FUZZ
@given(st.one_of(st.binary(max_size=12), st.text("0123456789abcdefABCDEF \n", max_size=12)
                 .map(str.encode)))  # fmt: skip
def test_text_version_lists_decode_exactly_lower_hex_pairs(payload):
    valid = re.fullmatch(rb"(?:[0-9a-f]{2})*", payload) is not None
    try:
        versions = decode_versions(payload, text=True)
    except RemoteProtocolError:
        assert not valid
    else:
        assert valid
        assert encode_versions(versions, text=True) == payload


_PREFIX = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})(?:/([0-9]{1,2}))?")


def oracle_prefix(text):
    """(value, length) of ``a.b.c.d[/n]`` in ASCII decimal, or None."""
    match = _PREFIX.fullmatch(text)
    if match is None:
        return None
    octets = [int(n) for n in match.groups()[:4]]
    length = 32 if match[5] is None else int(match[5])
    if max(octets) > 255 or length > 32:
        return None
    value = int.from_bytes(bytes(octets), "big")
    return None if value & ((1 << (32 - length)) - 1) else (value, length)


@FUZZ
@given(st.one_of(st.text(max_size=24), st.text("0123456789./ -+x\u0661", max_size=24)))
def test_dotted_actions_and_prefixes_match_the_oracle(text):
    expected = oracle_prefix(text)
    try:
        got = parse_prefix(text)
    except ValueError:
        assert expected is None
    else:
        assert got == expected
    action = expected[0] if expected and expected[1] == 32 and "/" not in text else None
    try:
        assert parse_action(text) == action
    except ValueError:
        assert action is None


# -- round trips -------------------------------------------------------------------------------


@ROUND_TRIP
@given(st.lists(messages(), max_size=8), split_points)
def test_binary_stream_round_trip_under_any_split(sent, points):
    data = b"".join(encode_binary(m) for m in sent)
    assert check_stream(data, points, DEFAULT_MAX_PAYLOAD) == (sent, False)


@ROUND_TRIP
@given(messages())
def test_binary_frame_round_trip(message):
    assert decode_binary_frame(encode_binary(message, with_ps=False)) == message
    assert TextDecoder().binary_frame(encode_binary(message, with_ps=False)) == message


def _utf8(data):
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@ROUND_TRIP
@given(st.lists(messages(), max_size=6), st.sampled_from([None, True, False]))
def test_text_round_trip(sent, inline):
    """JSON (or anything with ``inline=True``) travels in the text frame when it is UTF-8;
    every other payload in a binary follow-up frame; a decoder takes them all in order."""
    decoder, received = TextDecoder(), []
    for message in sent:
        text, follow_up = encode_text(message, inline)
        payload = getattr(message, "payload", b"")
        in_text = getattr(message, "encoding", 0) == 0 or (
            (inline if inline is not None else message.encoding == Encoding.JSON) and _utf8(payload)
        )
        assert (follow_up is None) == in_text
        got = decoder.text_frame(text)
        if follow_up is not None:
            assert got is None
            assert decoder.waiting_for_payload
            assert follow_up == payload
            got = decoder.binary_frame(follow_up)
        assert not decoder.waiting_for_payload
        received.append(got)
    assert received == sent


@ROUND_TRIP
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15)), max_size=8))
def test_versions_round_trip(versions):
    assert decode_versions(encode_versions(versions)) == versions
    assert decode_versions(encode_versions(versions, text=True), text=True) == versions


@ROUND_TRIP
@given(st.integers(0, 2**32 - 1), st.integers(0, 32))
def test_prefix_of_any_action_parses_back(action, length):
    value = action & ((0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF)
    assert parse_prefix(f"{action_to_str(value)}/{length}") == (value, length)
    assert parse_action(action_to_str(action)) == action
