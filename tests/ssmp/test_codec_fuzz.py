"""Property tests of the SSMP codec (hypothesis).

- Garbage (random bytes, token soup, mutated valid streams) fed whole or split anywhere:
  the decoders yield events or raise ``RemoteProtocolError``, never anything else, and
  splitting never changes the events or whether an error is raised.
- Differential: the decoders agree with a slow, regex-based reading of the ABNF below.
- Round trips: encoded requests, replies and forwarded events parse back to their values.
"""

from __future__ import annotations

import itertools
import re
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.ssmp import codec
from msgbroker.plugins.ssmp.codec import (
    CLOSE,
    MAX_MESSAGE,
    PING,
    PONG,
    Bcast,
    Delivery,
    Login,
    Mcast,
    Presence,
    Reply,
    ReplyDecoder,
    RequestDecoder,
    ServerPing,
    ServerPong,
    Subscribe,
    Ucast,
    UnknownVerb,
    Unsubscribe,
)

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ID_CHARS = string.ascii_letters + string.digits + ".:@/_-+=~"
LF = 10

# -- feeding ----------------------------------------------------------------------------------


def feed_chunks(decoder, chunks):
    """(events, raised): feeding stops at the first RemoteProtocolError; any other
    exception escapes and fails the test. McastRuns are expanded (their extent depends
    on the chunking; the requests they stand for must not)."""
    events = []
    for chunk in chunks:
        try:
            events.extend(decoder.feed(chunk))
        except RemoteProtocolError:
            return codec.expand_runs(events), True
    return codec.expand_runs(events), False


def split_at(data, points):
    cuts = sorted({p % (len(data) + 1) for p in points})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def check_stream(decoder_class, oracle, data, splitting):
    """Fed whole, split at the drawn points, and in small chunks (one byte at a time when
    short; ``step`` bytes at a time otherwise, to keep the run fast): the same events and
    the same error outcome, and the oracle agrees."""
    points, step = splitting
    whole = feed_chunks(decoder_class(), [data])
    assert feed_chunks(decoder_class(), split_at(data, points)) == whole
    step = 1 if len(data) <= 300 else step
    assert (
        feed_chunks(decoder_class(), [data[i : i + step] for i in range(0, len(data), step)])
        == whole
    )
    assert whole == oracle(data)
    return whole


# -- the oracle: the ABNF read literally, one complete message at a time -----------------------

_ID = rb"[A-Za-z0-9.:@/_\-+=~]{1,64}"
_INCOMPLETE = object()
_BAD = object()


def _payload(buf, i):
    """(data, index of the terminating LF), _INCOMPLETE or _BAD."""
    if i >= len(buf):
        return _INCOMPLETE
    if buf[i] <= 3:
        if i + 2 > len(buf):
            return _INCOMPLETE
        end = i + 2 + int.from_bytes(buf[i : i + 2], "big") + 1
        if end >= len(buf):
            return _INCOMPLETE
        return (buf[i + 2 : end], end) if buf[end] == LF else _BAD
    nl = buf.find(b"\n", i)
    if nl < 0:
        return _INCOMPLETE
    return (buf[i:nl], nl) if 1 <= nl - i <= 1024 else _BAD


def _with_payload(buf, p, match, make):
    parsed = _payload(buf, p + match.end())
    if parsed is _INCOMPLETE or parsed is _BAD:
        return parsed
    data, end = parsed
    return make(match, data, buf[p:end]), end + 1


def _dead_request_prefix(rest):
    """``rest`` (no LF) can never become a valid request: its verb is already wrong,
    PING/PONG/CLOSE has an argument, or a known verb's binary payload has ended
    without its LF. (Other dead prefixes are found once the LF or the size limit comes.)"""
    if not re.match(rb"[A-Z]{0,16}\Z|[A-Z]{1,16} ", rest):
        return True
    if re.match(rb"(PING|PONG|CLOSE) ", rest):
        return True
    head = rb"(?:(?:MCAST|UCAST) %s |BCAST |LOGIN %s %s )" % (_ID, _ID, _ID)
    if m := re.match(head + rb"[\x00-\x03]", rest):
        start = m.end() - 1
        if len(rest) < start + 2:
            return False
        end = start + 2 + int.from_bytes(rest[start : start + 2], "big") + 1
        return end < len(rest)  # the byte where the LF should be is there, and is not LF
    return False


def _request_at(buf, p):
    """(event, next position), _INCOMPLETE or _BAD for the request at ``p``."""
    nl = buf.find(b"\n", p)
    if nl < 0:
        return _BAD if _dead_request_prefix(buf[p:]) else _INCOMPLETE
    line, rest = buf[p:nl], buf[p:]
    bare = {b"PING": PING, b"PONG": PONG, b"CLOSE": CLOSE}.get(line)
    if bare is not None:
        return bare, nl + 1
    if m := re.fullmatch(rb"SUBSCRIBE (%s)( PRESENCE)?" % _ID, line):
        return Subscribe(m[1].decode(), m[2] is not None), nl + 1
    if m := re.fullmatch(rb"UNSUBSCRIBE (%s)" % _ID, line):
        return Unsubscribe(m[1].decode()), nl + 1
    if m := re.fullmatch(rb"LOGIN (%s) (%s)" % (_ID, _ID), line):
        return Login(m[1].decode(), m[2].decode(), None), nl + 1
    if m := re.match(rb"LOGIN (%s) (%s) " % (_ID, _ID), rest):
        return _with_payload(buf, p, m, lambda m, d, _: Login(m[1].decode(), m[2].decode(), d))
    if m := re.match(rb"MCAST (%s) " % _ID, rest):
        return _with_payload(buf, p, m, lambda m, d, line: Mcast(m[1].decode(), d, line))
    if m := re.match(rb"UCAST (%s) " % _ID, rest):
        return _with_payload(buf, p, m, lambda m, d, line: Ucast(m[1].decode(), d, line))
    if m := re.match(rb"BCAST ", rest):
        return _with_payload(buf, p, m, lambda m, d, line: Bcast(d, line))
    known = (b"LOGIN", b"SUBSCRIBE", b"UNSUBSCRIBE", b"MCAST", b"UCAST", b"BCAST")
    known += (b"PING", b"PONG", b"CLOSE")
    verb = re.match(rb"[A-Z]{1,16}(?=[ \n])", rest)
    if verb is None or verb[0] in known:
        return _BAD
    event = UnknownVerb(verb[0].decode())
    if re.fullmatch(rb"[A-Z]{1,16}( %s)?" % _ID, line):
        return event, nl + 1
    # verb SP id SP payload, preferred; else verb SP payload
    if m := re.match(rb"[A-Z]{1,16} %s " % _ID, rest):
        found = _with_payload(buf, p, m, lambda *_: event)
        if found is not _BAD:
            return found
    return _compat_payload(buf, p + verb.end() + 1, event)


def _compat_payload(buf, i, event):
    parsed = _payload(buf, i)
    if parsed is _INCOMPLETE or parsed is _BAD:
        return parsed
    return event, parsed[1] + 1


def _reply_at(buf, p):
    nl = buf.find(b"\n", p)
    if nl < 0:  # dead when the code is already wrong
        return _INCOMPLETE if re.match(rb"[0-9]{0,3}\Z|[0-9]{3} ", buf[p:]) else _BAD
    line, rest = buf[p:nl], buf[p:]
    if (m := re.fullmatch(rb"[0-9]{3}", line)) and line != b"000":
        return Reply(int(line), None), nl + 1
    if (m := re.match(rb"([0-9]{3}) ", rest)) and m[1] != b"000":
        return _with_payload(buf, p, m, lambda m, d, _: Reply(int(m[1]), d))
    if m := re.fullmatch(rb"000 (%s) (PING|PONG)" % _ID, line):
        kind = ServerPing if m[2] == b"PING" else ServerPong
        return kind(m[1].decode()), nl + 1
    if m := re.fullmatch(rb"000 (%s) SUBSCRIBE (%s)( PRESENCE)?" % (_ID, _ID), line):
        return Presence(m[1].decode(), m[2].decode(), True, m[3] is not None), nl + 1
    if m := re.fullmatch(rb"000 (%s) UNSUBSCRIBE (%s)" % (_ID, _ID), line):
        return Presence(m[1].decode(), m[2].decode(), False, False), nl + 1
    if m := re.match(rb"000 (%s) (MCAST|UCAST) (%s) " % (_ID, _ID), rest):
        return _with_payload(
            buf, p, m, lambda m, d, _: Delivery(m[1].decode(), m[2].decode(), m[3].decode(), d)
        )
    if m := re.match(rb"000 (%s) BCAST " % _ID, rest):
        return _with_payload(buf, p, m, lambda m, d, _: Delivery(m[1].decode(), "BCAST", None, d))
    return _BAD


def _oracle(parse_at, limit):
    def oracle(buf):
        events, p = [], 0
        while p < len(buf):
            found = parse_at(buf, p)
            if found is _BAD:
                return events, True
            if found is _INCOMPLETE:
                return events, len(buf) - p > limit
            event, p = found
            events.append(event)
        return events, False

    return oracle


request_oracle = _oracle(_request_at, MAX_MESSAGE)
reply_oracle = _oracle(_reply_at, MAX_MESSAGE + 70)


def test_oracle_agrees_with_hand_written_cases():
    """The oracle is itself code: pin it to a few readings of the ABNF."""
    assert request_oracle(b"MCAST t \x00\nabcdefghijk\nFOO x \n") == (
        [Mcast("t", b"abcdefghijk", b"MCAST t \x00\nabcdefghijk"), UnknownVerb("FOO")],
        False,
    )
    assert request_oracle(b"SUBSCRIBE t OTHER\n") == ([], True)
    assert request_oracle(b"PING\nMCAST t \x00\x05ab") == ([PING], False)
    assert request_oracle(b"MCAST t " + b"x" * (MAX_MESSAGE - 8)) == ([], False)
    assert request_oracle(b"MCAST t " + b"x" * (MAX_MESSAGE - 7)) == ([], True)
    assert request_oracle(b"PING\nmcast") == ([PING], True)
    assert request_oracle(b"MCAST t \x00\x01ab") == ([], False)
    assert request_oracle(b"MCAST t \x00\x01abc") == ([], True)
    assert request_oracle(b"FOO x \x00\x01abc") == ([], False)
    assert reply_oracle(b"200") == ([], False)
    assert reply_oracle(b"2000") == ([], True)
    assert reply_oracle(b"000 . PING\n401 open secret\n000\n") == (
        [ServerPing("."), Reply(401, b"open secret")],
        True,
    )


# -- strategies -------------------------------------------------------------------------------

ids = st.text(alphabet=ID_CHARS, min_size=1, max_size=64)
edge_sizes = st.sampled_from([1, 2, 10, 11, 12, 255, 256, 257, 1023, 1024])
# text-encodable data: first byte not NUL..ETX, no LF
texts = st.one_of(st.integers(1, 1024), edge_sizes).flatmap(
    lambda n: st.binary(min_size=n, max_size=n).map(
        lambda b: (b"a" if b[0] <= 3 or b[0] == LF else b[:1]) + b[1:].replace(b"\n", b" ")
    )
)
payloads = st.one_of(
    st.binary(min_size=1, max_size=1024),
    st.binary(min_size=1, max_size=40),
    edge_sizes.flatmap(lambda n: st.binary(min_size=n, max_size=n)),
    texts,
    # UTF-8 text, as clients SHOULD send (st.text() costs seconds of set-up; this doesn't)
    st.lists(st.sampled_from(["a", "Z", " ", "é", "日本", "🎉", "\t", "\x7f"]), min_size=1)
    .map("".join)
    .map(str.encode),
)
verbs = st.text(alphabet=string.ascii_uppercase, min_size=1, max_size=16).filter(
    lambda v: (
        v not in {"LOGIN", "SUBSCRIBE", "UNSUBSCRIBE", "MCAST", "UCAST", "BCAST"}
        and v not in {"PING", "PONG", "CLOSE"}
    )
)


@st.composite
def valid_requests(draw):
    """(frame, event) for one well-formed request."""
    kind = draw(st.sampled_from(["login", "sub", "unsub", "mcast", "ucast", "bcast", "bare", "?"]))
    if kind == "login":
        identity, scheme = draw(ids), draw(ids)
        credential = draw(st.none() | payloads)
        return codec.login(identity, scheme, credential), Login(identity, scheme, credential)
    if kind == "sub":
        topic, presence = draw(ids), draw(st.booleans())
        return codec.subscribe(topic, presence), Subscribe(topic, presence)
    if kind == "unsub":
        topic = draw(ids)
        return codec.unsubscribe(topic), Unsubscribe(topic)
    if kind == "mcast":
        topic, payload = draw(ids), draw(payloads)
        frame = codec.mcast(topic, payload)
        return frame, Mcast(topic, payload, frame[:-1])
    if kind == "ucast":
        target, payload = draw(ids), draw(payloads)
        frame = codec.ucast(target, payload)
        return frame, Ucast(target, payload, frame[:-1])
    if kind == "bcast":
        payload = draw(payloads)
        frame = codec.bcast(payload)
        return frame, Bcast(payload, frame[:-1])
    if kind == "bare":
        return draw(
            st.sampled_from([(codec.ping(), PING), (codec.pong(), PONG), (codec.close(), CLOSE)])
        )
    verb = draw(verbs)
    parts = [verb.encode()]
    identity = draw(st.none() | ids)
    if identity is not None:
        parts.append(identity.encode())
    payload = draw(st.none() | payloads)
    if payload is not None:
        parts.append(codec.encode_payload(payload))
    return b" ".join(parts) + b"\n", UnknownVerb(verb)


@st.composite
def valid_server_messages(draw):
    """(frame, event) for one well-formed reply or event, built as the server builds them:
    ``000 <from> `` + the request line."""
    kind = draw(st.sampled_from(["reply", "mcast", "ucast", "bcast", "presence", "ping"]))
    sender = draw(ids)
    prefix = b"000 %s " % sender.encode()
    if kind == "reply":
        code = draw(st.integers(1, 999))
        payload = draw(st.none() | payloads)
        return codec.encode_reply(code, payload), Reply(code, payload)
    if kind in ("mcast", "ucast"):
        to, payload = draw(ids), draw(payloads)
        encode = codec.mcast if kind == "mcast" else codec.ucast
        return prefix + encode(to, payload), Delivery(sender, kind.upper(), to, payload)
    if kind == "bcast":
        payload = draw(payloads)
        return prefix + codec.bcast(payload), Delivery(sender, "BCAST", None, payload)
    if kind == "presence":
        topic, subscribed = draw(ids), draw(st.booleans())
        presence = subscribed and draw(st.booleans())
        frame = codec.subscribe(topic, presence) if subscribed else codec.unsubscribe(topic)
        return prefix + frame, Presence(sender, topic, subscribed, presence)
    if draw(st.booleans()):
        return prefix + b"PING\n", ServerPing(sender)
    return prefix + b"PONG\n", ServerPong(sender)


split_points = st.tuples(st.lists(st.integers(0, 5000), max_size=8), st.integers(1, 40))

# Token soup: structure-shaped garbage that random bytes rarely reach.
TOKENS = [
    b"LOGIN",
    b"SUBSCRIBE",
    b"UNSUBSCRIBE",
    b"MCAST",
    b"UCAST",
    b"BCAST",
    b"PING",
    b"PONG",
    b"CLOSE",
    b"PRESENCE",
    b"FOO",
    b"ABCDEFGHIJKLMNOPQ",
    b"mcast",
    b"000",
    b"200",
    b"401",
    b"t",
    b"bob",
    b".",
    b"x" * 64,
    b"x" * 65,
    b" ",
    b" ",
    b"\n",
    b"\n",
    b"\x00",
    b"\x01",
    b"\x03\xff",
    b"\x00\n",
    b"\x00\x00",
    b"\x00\x05",
    b"p" * 1000,
    b"\xff",
    b"\r",
]
soup = st.lists(st.sampled_from(TOKENS), max_size=40).map(b"".join)


# Near-valid frames: each verb with the arguments the grammar wants, where any argument
# may be swapped for a boundary case, dropped, or followed by an extra one.
_BAD_IDS = [b"", b"x" * 65, b"a*b", b"a\x00", b"\xff", b"a\tb"]
_BAD_PAYLOADS = [b"", b"\x00\x05ab", b"\x00", b"\x00\x00ab", b"x" * 1025, b"\x03\xff", b"\x00\n"]
_SLOTS = {
    "id": st.one_of(
        ids.map(str.encode),
        ids.map(str.encode),
        ids.map(str.encode),
        st.sampled_from([b"x" * 64, b"x" * 65, b"~", b"."]),
        st.sampled_from(_BAD_IDS),
    ),
    "payload": st.one_of(
        payloads.map(codec.encode_payload),
        payloads.map(codec.encode_payload),
        payloads.map(codec.encode_payload),
        # text that starts like "id SP payload"
        texts.map(lambda b: b"x " + b[:1022]),
        st.sampled_from([b"x \x00\x05ab", b"x \x00\x00", b"x \x00"]),
        st.sampled_from([b"y" * 1024, b"y" * 1025, b"\x03\xff" + b"\n" * 1024]),
        st.sampled_from(_BAD_PAYLOADS),
    ),
    "option": st.sampled_from([b"PRESENCE"] * 4 + [b"OTHER", b"presence", b"PRESENCEX"]),
}
_FORMS = [
    (b"LOGIN", ("id", "id")),
    (b"LOGIN", ("id", "id", "payload")),
    (b"SUBSCRIBE", ("id",)),
    (b"SUBSCRIBE", ("id", "option")),
    (b"UNSUBSCRIBE", ("id",)),
    (b"MCAST", ("id", "payload")),
    (b"UCAST", ("id", "payload")),
    (b"BCAST", ("payload",)),
    (b"PING", ()),
    (b"PONG", ()),
    (b"CLOSE", ()),
    (b"FOO", ()),
    (b"FOO", ("id",)),
    (b"FOO", ("payload",)),
    (b"FOO", ("id", "payload")),
    (b"ABCDEFGHIJKLMNOP", ("id",)),
    (b"ABCDEFGHIJKLMNOPQ", ()),
    (b"Foo", ()),
]
_SERVER_FORMS = [
    (b"000 %s MCAST", ("id", "payload")),
    (b"000 %s UCAST", ("id", "payload")),
    (b"000 %s BCAST", ("payload",)),
    (b"000 %s SUBSCRIBE", ("id",)),
    (b"000 %s SUBSCRIBE", ("id", "option")),
    (b"000 %s UNSUBSCRIBE", ("id",)),
    (b"000 %s UNSUBSCRIBE", ("id", "option")),
    (b"000 %s PING", ()),
    (b"000 %s PONG", ()),
    (b"000 %s FOO", ("id",)),
    (b"000 %s", ()),
    (b"200", ()),
    (b"401", ("payload",)),
    (b"000", ()),
    (b"20", ()),
    (b"MCAST", ("id", "payload")),
]


@st.composite
def near_valid_frames(draw, server=False):
    frames = []
    for _ in range(draw(st.integers(1, 4))):
        head, slots = draw(st.sampled_from(_SERVER_FORMS if server else _FORMS))
        if b"%s" in head:
            head %= draw(_SLOTS["id"])
        slots = list(slots)
        change = draw(st.integers(0, 11))
        if change == 0 and slots:
            del slots[draw(st.integers(0, len(slots) - 1))]
        elif change == 1:
            slots.append(draw(st.sampled_from(sorted(_SLOTS))))
        parts = [head]
        for slot in slots:
            parts.append(draw(st.sampled_from([b" "] * 12 + [b"", b"  "])) + draw(_SLOTS[slot]))
        parts.append(draw(st.sampled_from([b"\n"] * 8 + [b" \n", b" \n", b"\n\n", b""])))
        frames.append(b"".join(parts))
    return b"".join(frames)


def mutate(draw, data):
    """Apply 1-4 random byte flips, insertions, deletions or a truncation."""
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and at < len(data):
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
        elif op == "insert":
            extra = draw(st.binary(min_size=1, max_size=4) | st.sampled_from(TOKENS))
            data = data[:at] + extra + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 8)) :]
        else:
            data = data[:at]
    return data


@st.composite
def mutated_requests(draw):
    frames = draw(st.lists(valid_requests(), min_size=1, max_size=6))
    return mutate(draw, b"".join(frame for frame, _ in frames))


@st.composite
def mutated_server_messages(draw):
    frames = draw(st.lists(valid_server_messages(), min_size=1, max_size=6))
    return mutate(draw, b"".join(frame for frame, _ in frames))


# -- garbage --------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=2000), points=split_points)
def test_random_bytes(data, points):
    check_stream(RequestDecoder, request_oracle, data, points)
    check_stream(ReplyDecoder, reply_oracle, data, points)


@FUZZ
@given(data=soup, points=split_points)
def test_token_soup(data, points):
    check_stream(RequestDecoder, request_oracle, data, points)
    check_stream(ReplyDecoder, reply_oracle, b"000 " + data, points)


@FUZZ
@given(data=near_valid_frames(), points=split_points)
def test_near_valid_requests(data, points):
    check_stream(RequestDecoder, request_oracle, data, points)


@FUZZ
@given(data=near_valid_frames(server=True), points=split_points)
def test_near_valid_server_messages(data, points):
    check_stream(ReplyDecoder, reply_oracle, data, points)


@FUZZ
@given(data=mutated_requests(), points=split_points)
def test_mutated_requests(data, points):
    check_stream(RequestDecoder, request_oracle, data, points)


@FUZZ
@given(data=mutated_server_messages(), points=split_points)
def test_mutated_server_messages(data, points):
    check_stream(ReplyDecoder, reply_oracle, data, points)


# -- round trips ------------------------------------------------------------------------------


@ROUND_TRIP
@given(frames=st.lists(valid_requests(), min_size=1, max_size=8), points=split_points)
def test_requests_round_trip(frames, points):
    data = b"".join(frame for frame, _ in frames)
    events, raised = check_stream(RequestDecoder, request_oracle, data, points)
    assert not raised
    assert events == [event for _, event in frames]


@ROUND_TRIP
@given(frames=st.lists(valid_server_messages(), min_size=1, max_size=8), points=split_points)
def test_server_messages_round_trip(frames, points):
    data = b"".join(frame for frame, _ in frames)
    events, raised = check_stream(ReplyDecoder, reply_oracle, data, points)
    assert not raised
    assert events == [event for _, event in frames]


@ROUND_TRIP
@given(payload=st.binary(min_size=1, max_size=1024))
def test_encode_payload_is_text_or_binary_as_the_abnf_says(payload):
    wire = codec.encode_payload(payload)
    if payload[0] > 3 and b"\n" not in payload:
        assert wire == payload
    else:
        assert wire[0] <= 3
        assert int.from_bytes(wire[:2], "big") + 1 == len(payload)
        assert wire[2:] == payload


@ROUND_TRIP
@given(topic=ids, payload=st.binary(min_size=1, max_size=1024))
def test_mcast_line_is_the_frame_without_lf(topic, payload):
    frame = codec.mcast(topic, payload)
    [event] = RequestDecoder().feed(frame)
    assert event == Mcast(topic, payload, frame[:-1])
