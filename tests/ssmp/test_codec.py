"""SSMP 1.1 codec conformance: the spec's ABNF as amended by docs/ssmp.md, "Decisions".

Every decoding test also checks that the same bytes fed one byte at a time and split at
every point give the same events (and the same error) as when fed whole.
"""

from __future__ import annotations

import string

import pytest

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

ID_CHARS = string.ascii_letters + string.digits + ".:@/_-+=~"
NOT_ID_BYTES = sorted(set(range(256)) - set(ID_CHARS.encode()) - {ord(" "), ord("\n")})
ID64 = (ID_CHARS * 2)[:64]
TEXT_1024 = b"x" * 1024


# -- helpers ---------------------------------------------------------------------------------


def feed_chunks(decoder, chunks):
    """Feed ``chunks`` in order: (events, error) where error is the RemoteProtocolError
    raised (feeding stops there) or None. A :class:`McastRun` (whose extent depends on
    the chunking) is expanded to the MCASTs it stands for."""
    events = []
    for chunk in chunks:
        try:
            events.extend(decoder.feed(chunk))
        except RemoteProtocolError as exc:
            return codec.expand_runs(events), exc
    return codec.expand_runs(events), None


def all_splittings(data):
    """Whole, one byte at a time, and every 2-way split."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]


def decode(decoder_class, data):
    """Decode ``data`` whole and under every splitting; they must all agree.
    Returns the events and whether an error was raised."""
    events, error = feed_chunks(decoder_class(), [data])
    for chunks in all_splittings(data):
        split_events, split_error = feed_chunks(decoder_class(), chunks)
        assert split_events == events, chunks
        assert (split_error is None) == (error is None), chunks
    return events, error is not None


def requests(data):
    """The requests in ``data``, which must be valid (whole and split)."""
    events, failed = decode(RequestDecoder, data)
    assert not failed
    return events


def request(data):
    [event] = requests(data)
    return event


def assert_bad_request(data, before=()):
    """``data`` breaks the grammar: ``before`` is what is yielded first, then the error."""
    events, failed = decode(RequestDecoder, data)
    assert failed
    assert events == list(before)


def replies(data):
    events, failed = decode(ReplyDecoder, data)
    assert not failed
    return events


def reply(data):
    [event] = replies(data)
    return event


def assert_bad_reply(data, before=()):
    events, failed = decode(ReplyDecoder, data)
    assert failed
    assert events == list(before)


def binary(data):
    """The SSMP binary framing of ``data`` (length - 1, big-endian, then the bytes)."""
    return (len(data) - 1).to_bytes(2, "big") + data


# -- requests: each type ------------------------------------------------------------------


def test_login_without_credential():
    assert request(b"LOGIN alice open\n") == Login("alice", "open", None)


def test_login_with_text_credential_keeps_spaces():
    assert request(b"LOGIN alice secret my pass word\n") == Login(
        "alice", "secret", b"my pass word"
    )


def test_login_with_binary_credential():
    credential = b"\x00\nsecret\xff"
    assert request(b"LOGIN alice secret " + binary(credential) + b"\n") == Login(
        "alice", "secret", credential
    )


def test_login_anonymous():
    assert request(b"LOGIN . open\n") == Login(".", "open", None)


@pytest.mark.parametrize(
    "data",
    [
        b"LOGIN\n",
        b"LOGIN \n",
        b"LOGIN alice\n",
        b"LOGIN alice \n",
        b"LOGIN alice open \n",
        b"LOGIN  alice open\n",
        b"LOGIN al!ce open\n",
        b"LOGIN alice op*n\n",
    ],
)
def test_malformed_login_is_an_error(data):
    assert_bad_request(data)


def test_subscribe():
    assert request(b"SUBSCRIBE news\n") == Subscribe("news", presence=False)


def test_subscribe_presence():
    assert request(b"SUBSCRIBE news PRESENCE\n") == Subscribe("news", presence=True)


@pytest.mark.parametrize(
    "data",
    [
        b"SUBSCRIBE\n",
        b"SUBSCRIBE \n",
        b"SUBSCRIBE news \n",
        b"SUBSCRIBE news OTHER\n",
        b"SUBSCRIBE news presence\n",
        b"SUBSCRIBE news PRESENCE \n",
        b"SUBSCRIBE news PRESENCE x\n",
        b"SUBSCRIBE news PRESENCEX\n",
    ],
)
def test_malformed_subscribe_is_an_error(data):
    assert_bad_request(data)


def test_unsubscribe():
    assert request(b"UNSUBSCRIBE news\n") == Unsubscribe("news")


@pytest.mark.parametrize(
    "data", [b"UNSUBSCRIBE\n", b"UNSUBSCRIBE \n", b"UNSUBSCRIBE news PRESENCE\n"]
)
def test_malformed_unsubscribe_is_an_error(data):
    assert_bad_request(data)


def test_mcast():
    assert request(b"MCAST news hello world\n") == Mcast(
        "news", b"hello world", b"MCAST news hello world"
    )


def test_ucast():
    assert request(b"UCAST bob hi there\n") == Ucast("bob", b"hi there", b"UCAST bob hi there")


def test_bcast():
    assert request(b"BCAST hi all\n") == Bcast(b"hi all", b"BCAST hi all")


@pytest.mark.parametrize(
    "data",
    [
        b"MCAST\n",
        b"MCAST \n",
        b"MCAST news\n",
        b"MCAST news \n",
        b"MCAST  news hi\n",
        b"MCAST n*ws hi\n",
        b"UCAST\n",
        b"UCAST bob\n",
        b"UCAST bob \n",
        b"UCAST b#b hi\n",
        b"BCAST\n",
        b"BCAST \n",
    ],
)
def test_malformed_cast_is_an_error(data):
    assert_bad_request(data)


@pytest.mark.parametrize(
    ("data", "event"), [(b"PING\n", PING), (b"PONG\n", PONG), (b"CLOSE\n", CLOSE)]
)
def test_bare_requests(data, event):
    assert request(data) == event


@pytest.mark.parametrize(
    "data", [b"PING x\n", b"PING \n", b"PONG x\n", b"CLOSE now\n", b"CLOSE \n"]
)
def test_bare_request_with_argument_is_an_error(data):
    assert_bad_request(data)


@pytest.mark.parametrize(
    "data",
    [b"000 bob MCAST t p\n", b"200\n", b"401 open\n", b"\n", b" PING\n", b"PING\r\n"],
)
def test_responses_events_and_junk_from_a_client_are_errors(data):
    assert_bad_request(data)


# -- ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize("char", list(ID_CHARS))
def test_every_id_character_is_accepted(char):
    assert request(b"SUBSCRIBE %s\n" % char.encode()) == Subscribe(char, False)
    assert request(b"MCAST %s p\n" % char.encode()).topic == char


def test_id_of_1_and_64_characters():
    assert request(b"SUBSCRIBE a\n") == Subscribe("a", False)
    assert request(b"UCAST %s p\n" % ID64.encode()).target == ID64
    assert request(b"LOGIN %s %s\n" % (ID64.encode(), ID64.encode())) == Login(ID64, ID64, None)


@pytest.mark.parametrize(
    "data",
    [
        b"SUBSCRIBE %s\n",
        b"UNSUBSCRIBE %s\n",
        b"MCAST %s p\n",
        b"UCAST %s p\n",
        b"LOGIN %s open\n",
        b"LOGIN alice %s\n",
    ],
)
def test_id_of_65_characters_is_an_error(data):
    assert_bad_request(data % (ID64 + "x").encode())


@pytest.mark.parametrize("byte", NOT_ID_BYTES)
def test_every_non_id_byte_in_an_id_is_an_error(byte):
    topic = b"ab" + bytes([byte]) + b"c"
    assert_bad_request(b"SUBSCRIBE %s\n" % topic)
    assert_bad_request(b"MCAST %s p\n" % topic)


def test_is_valid_id():
    assert codec.is_valid_id("a")
    assert codec.is_valid_id(ID64)
    assert codec.is_valid_id(ID_CHARS[:64])
    assert not codec.is_valid_id("")
    assert not codec.is_valid_id(ID64 + "a")
    assert not codec.is_valid_id("a b")
    assert not codec.is_valid_id("café")
    assert not codec.is_valid_id("a\n")


# -- verbs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [b"A", b"FOO", b"ABCDEFGHIJKLMNOP", b"MCASTX", b"PINGS"])
def test_unknown_verb_of_1_to_16_letters(verb):
    assert request(verb + b"\n") == UnknownVerb(verb.decode())


@pytest.mark.parametrize(
    "data",
    [
        b"FOO\n",
        b"FOO x\n",
        b"FOO %s\n" % ID64.encode(),
        b"FOO x payload\n",
        b"FOO some payload text\n",
        b"FOO \x00\x01ab\n",
        b"FOO x \x03\xff" + TEXT_1024 + b"\n",
        b"FOO x " + TEXT_1024 + b"\n",
        b"FOO " + TEXT_1024 + b"\n",
        b"FOO \x00\x0a" + b"a\nb\nc\nd\ne\nf" + b"\n",
        b"FOO !not-an-id\n",
        b"FOO x \x00\x00\n\n",
    ],
)
def test_unknown_verb_with_optional_id_and_payload(data):
    assert request(data) == UnknownVerb("FOO")


def test_unknown_verb_payload_that_looks_like_id_and_trailing_space():
    """``FOO x `` is ``verb SP payload`` with payload ``"x "`` (TEXT0 TEXT)."""
    assert request(b"FOO x \n") == UnknownVerb("FOO")


def test_unknown_verb_text_payload_that_looks_like_id_then_bad_binary():
    """``x \\x00\\x05ab`` is a valid text payload; it is not an id then a binary payload
    (which would need 6 bytes and LF), so the message ends at the first LF."""
    assert requests(b"FOO x \x00\x05ab\nPING\n") == [UnknownVerb("FOO"), PING]


def test_unknown_verb_keeps_the_stream_going():
    assert requests(b"FOO\nBAR x y\nPING\n") == [UnknownVerb("FOO"), UnknownVerb("BAR"), PING]


@pytest.mark.parametrize(
    "data",
    [
        b"ABCDEFGHIJKLMNOPQ\n",
        b"ABCDEFGHIJKLMNOPQ x\n",
        b"foo\n",
        b"Foo x\n",
        b"mcast t p\n",
        b"ping\n",
        b"FO0\n",
        b"123\n",
        b"F-O\n",
        b"FOO \n",
        b"FOO x " + b"y" * 1025 + b"\n",
        b"FOO " + b"y" * 1025 + b"\n",
        b"FOO \x00\x01abc\n",
    ],
)
def test_bad_verb_or_malformed_unknown_request_is_an_error(data):
    assert_bad_request(data)


# -- payloads -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 1023, 1024])
def test_text_payload_of_1_to_1024_bytes(size):
    payload = b"p" * size
    assert request(b"MCAST t " + payload + b"\n").payload == payload


def test_text_payload_of_1025_bytes_is_an_error():
    assert_bad_request(b"MCAST t " + b"p" * 1025 + b"\n")
    assert_bad_request(b"UCAST bob " + b"p" * 1025 + b"\n")
    assert_bad_request(b"BCAST " + b"p" * 1025 + b"\n")
    assert_bad_request(b"LOGIN a secret " + b"p" * 1025 + b"\n")


def test_text_payload_may_hold_every_byte_but_lf_after_the_first():
    payload = b"\x04" + bytes(b for b in range(256) if b != 10)
    assert request(b"MCAST t " + payload + b"\n").payload == payload


@pytest.mark.parametrize("first", range(4, 256))
def test_every_text0_byte_starts_a_text_payload(first):
    if first == 10:
        assert_bad_request(b"MCAST t \n")
    else:
        assert request(b"MCAST t %cz\n" % first).payload == bytes([first]) + b"z"


@pytest.mark.parametrize("marker", [0, 1, 2, 3])
def test_binary_payload_markers(marker):
    size = (marker << 8) + 1
    data = bytes(i % 256 for i in range(size))
    frame = b"MCAST t " + bytes([marker, 0]) + data + b"\n"
    assert request(frame) == Mcast("t", data, frame[:-1])


@pytest.mark.parametrize("size", [1, 2, 10, 11, 12, 255, 256, 257, 1023, 1024])
def test_binary_payload_sizes(size):
    data = (b"\n\x00ab" * 300)[:size]
    assert request(b"MCAST t " + binary(data) + b"\n").payload == data
    assert request(b"UCAST bob " + binary(data) + b"\n").payload == data
    assert request(b"BCAST " + binary(data) + b"\n").payload == data
    assert request(b"LOGIN a secret " + binary(data) + b"\n").credential == data


def test_binary_payload_whose_second_length_byte_is_lf():
    data = b"0123456789a"
    assert binary(data)[:2] == b"\x00\n"
    frame = b"MCAST t \x00\n" + data + b"\n"
    assert requests(frame + b"PING\n") == [Mcast("t", data, frame[:-1]), PING]


def test_binary_payload_of_lfs_only():
    data = b"\n" * 30
    assert requests(b"BCAST " + binary(data) + b"\nPONG\n") == [
        Bcast(data, b"BCAST " + binary(data)),
        PONG,
    ]


@pytest.mark.parametrize(
    "data",
    [
        b"MCAST t \x00\x01abc\n",
        b"MCAST t \x00\x00ab\n",
        b"BCAST \x00\x00a \n",
        b"UCAST bob \x00\x02ab\nc\n",
        b"LOGIN a secret \x00\x00ab\n",
    ],
)
def test_binary_payload_not_followed_by_lf_is_an_error(data):
    assert_bad_request(data)


def test_binary_payload_error_comes_after_earlier_requests():
    assert_bad_request(b"PING\nMCAST t \x00\x01abc\n", before=[PING])


@pytest.mark.parametrize("data", [b"MCAST t \n", b"UCAST bob \n", b"BCAST \n", b"FOO x \n\n"])
def test_empty_payload_is_an_error(data):
    if data == b"FOO x \n\n":  # "FOO x " is verb + payload "x "; the empty line is the error
        assert_bad_request(data, before=[UnknownVerb("FOO")])
    else:
        assert_bad_request(data)


# -- streams ----------------------------------------------------------------------------------

STREAM = [
    (b"LOGIN alice secret pw\n", Login("alice", "secret", b"pw")),
    (b"SUBSCRIBE news PRESENCE\n", Subscribe("news", True)),
    (b"SUBSCRIBE t\n", Subscribe("t", False)),
    (
        b"MCAST news \x00\x05a\nb\nc\n\n",
        Mcast("news", b"a\nb\nc\n", b"MCAST news \x00\x05a\nb\nc\n"),
    ),
    (b"MCAST news hello\n", Mcast("news", b"hello", b"MCAST news hello")),
    (
        b"UCAST bob \x00\n0123456789a\n",
        Ucast("bob", b"0123456789a", b"UCAST bob \x00\n0123456789a"),
    ),
    (b"BCAST yo\n", Bcast(b"yo", b"BCAST yo")),
    (b"UNSUBSCRIBE t\n", Unsubscribe("t")),
    (b"PING\n", PING),
    (b"PONG\n", PONG),
    (b"FROB x \x00\x00\n\n", UnknownVerb("FROB")),
    (b"CLOSE\n", CLOSE),
]


def test_stream_of_every_request_type_in_one_chunk_and_split_everywhere():
    data = b"".join(frame for frame, _ in STREAM)
    assert requests(data) == [event for _, event in STREAM]


def test_events_before_a_bad_message_are_yielded_before_the_error():
    decoder = RequestDecoder()
    events = decoder.feed(b"PING\nSUBSCRIBE t\nping\nPONG\n")
    assert next(events) == PING
    assert next(events) == Subscribe("t", False)
    with pytest.raises(RemoteProtocolError):
        next(events)


def test_stream_then_bad_message_split_everywhere():
    good = b"".join(frame for frame, _ in STREAM[:5])
    assert_bad_request(good + b"SUBSCRIBE t OTHER\nPING\n", before=[e for _, e in STREAM[:5]])


def test_incomplete_message_is_buffered():
    decoder = RequestDecoder()
    assert list(decoder.feed(b"MCAST t hel")) == []
    assert list(decoder.feed(b"lo\nPI")) == [Mcast("t", b"hello", b"MCAST t hello")]
    assert list(decoder.feed(b"NG\n")) == [PING]


@pytest.mark.parametrize(
    "data",
    [
        b"hello",
        b"ABCDEFGHIJKLMNOPQ",
        b"\x00\x01",
        b"\xff",
        b"mcast t",
        b"000 bob",
        b"200",
        b"FOO1",
        b" ",
        b"PING ",
        b"CLOSE x",
        b"MCAST t \x00\x01abc",
        b"UCAST bob \x00\x00ab",
        b"BCAST \x00\x02abcd",
        b"LOGIN a secret \x00\x00xy",
    ],
)
def test_a_message_that_cannot_become_valid_is_an_error_before_its_lf(data):
    """The server answers 400 at once, not when (if ever) an LF comes."""
    assert_bad_request(data)


@pytest.mark.parametrize(
    "data",
    [
        b"M",
        b"MCAST",
        b"MCAST ",
        b"MCAST t",
        b"MCAST t \x00\x01ab",
        b"ABCDEFGHIJKLMNOP",
        b"FOO x y",
        b"FOO x \x00\x00ab",  # "x \x00\x00ab" may be a text payload
        b"GET / HTTP/1.1\r",  # an unknown verb, an id and a text payload: 501 once LF comes
        b"PING",
    ],
)
def test_a_valid_prefix_waits_for_more(data):
    assert requests(data) == []


def test_longest_valid_message_is_max_message():
    frame = b"LOGIN %s %s " % (ID64.encode(), ID64.encode()) + binary(b"\n" * 1024) + b"\n"
    assert len(frame) == MAX_MESSAGE
    assert request(frame) == Login(ID64, ID64, b"\n" * 1024)


def test_partial_message_longer_than_max_message_without_lf_is_an_error():
    decoder = RequestDecoder()
    prefix = b"MCAST t "  # then a text payload that never ends
    assert list(decoder.feed(prefix + b"y" * (MAX_MESSAGE - len(prefix)))) == []
    with pytest.raises(RemoteProtocolError):
        list(decoder.feed(b"y"))
    assert_bad_request(b"PING\nFOO x " + b"y" * MAX_MESSAGE, before=[PING])


def test_partial_message_longer_than_max_message_byte_by_byte_is_an_error():
    decoder = RequestDecoder()
    assert list(decoder.feed(b"FOO ")) == []
    for _ in range(MAX_MESSAGE - 4):
        assert list(decoder.feed(b"a")) == []
    with pytest.raises(RemoteProtocolError):
        list(decoder.feed(b"a"))


def test_partial_binary_message_longer_than_max_message_is_an_error():
    decoder = RequestDecoder()
    prefix = b"MCAST t \x03\xff\n"  # a binary payload that needs 1024 bytes and LF
    assert list(decoder.feed(prefix + b"\n" * 1000)) == []
    with pytest.raises(RemoteProtocolError):
        list(decoder.feed(b"z" * MAX_MESSAGE))


# -- replies and events (client side) ----------------------------------------------------------


def test_reply_without_payload():
    assert reply(b"200\n") == Reply(200, None)


@pytest.mark.parametrize("code", [200, 400, 401, 404, 405, 409, 501])
def test_every_reply_code(code):
    assert reply(b"%d\n" % code) == Reply(code, None)


def test_reply_with_scheme_list():
    assert reply(b"401 open secret\n") == Reply(401, b"open secret")


def test_reply_with_binary_payload():
    assert reply(b"200 \x00\nabc\ndefghi\n\n") == Reply(200, b"abc\ndefghi\n")


def test_mcast_event():
    assert reply(b"000 bob MCAST t p\n") == Delivery("bob", "MCAST", "t", b"p")


def test_ucast_event_with_binary_payload():
    assert reply(b"000 bob UCAST alice \x00\x01\n\n\n") == Delivery(
        "bob", "UCAST", "alice", b"\n\n"
    )


def test_bcast_event():
    assert reply(b"000 bob BCAST hello all\n") == Delivery("bob", "BCAST", None, b"hello all")


def test_anonymous_mcast_event():
    assert reply(b"000 . MCAST t p q\n") == Delivery(".", "MCAST", "t", b"p q")


def test_presence_events():
    assert reply(b"000 bob SUBSCRIBE t\n") == Presence("bob", "t", True, False)
    assert reply(b"000 bob SUBSCRIBE t PRESENCE\n") == Presence("bob", "t", True, True)
    assert reply(b"000 bob UNSUBSCRIBE t\n") == Presence("bob", "t", False, False)


def test_ping_and_pong_events():
    assert reply(b"000 . PING\n") == ServerPing(".")
    assert reply(b"000 . PONG\n") == ServerPong(".")


def test_stream_of_server_messages_split_everywhere():
    data = (
        b"200\n000 . PING\n000 bob MCAST t \x00\nabcdefghijk\n401 open secret\n"
        b"000 bob SUBSCRIBE t PRESENCE\n000 . PONG\n000 bob BCAST x\n"
    )
    assert replies(data) == [
        Reply(200, None),
        ServerPing("."),
        Delivery("bob", "MCAST", "t", b"abcdefghijk"),
        Reply(401, b"open secret"),
        Presence("bob", "t", True, True),
        ServerPong("."),
        Delivery("bob", "BCAST", None, b"x"),
    ]


@pytest.mark.parametrize(
    "data",
    [
        b"000 bob FOO x\n",
        b"000 bob FOO\n",
        b"000 bob mcast t p\n",
        b"000 . PING x\n",
        b"000 . PONG \n",
        b"000 bob UNSUBSCRIBE t PRESENCE\n",
        b"000 bob SUBSCRIBE t OTHER\n",
        b"000 bob SUBSCRIBE\n",
        b"000 bob MCAST t\n",
        b"000 bob MCAST t \n",
        b"000 bob UCAST alice\n",
        b"000 bob BCAST\n",
        b"000 bob BCAST \x00\x01abc\n",
        b"000 b*b MCAST t p\n",
        b"000 bob\n",
        b"000\n",
        b"000  bob PING\n",
        b"20\n",
        b"2000\n",
        b"200 \n",
        b"abc\n",
        b"\n",
        b"MCAST t p\n",
        b"200 " + b"p" * 1025 + b"\n",
    ],
)
def test_malformed_server_message_is_an_error(data):
    assert_bad_reply(data)


def test_server_message_error_comes_after_earlier_events():
    assert_bad_reply(b"200\n000 . PING\n000 bob FOO\n", before=[Reply(200, None), ServerPing(".")])


@pytest.mark.parametrize("data", [b"x", b"2x", b"20x", b"200x", b"000x", b"0000", b" "])
def test_server_message_that_cannot_become_valid_is_an_error_before_its_lf(data):
    assert_bad_reply(data)


@pytest.mark.parametrize("data", [b"2", b"20", b"200", b"200 ", b"000", b"000 bob", b"401 open"])
def test_server_message_prefix_waits_for_more(data):
    assert replies(data) == []


def test_partial_server_message_too_long_is_an_error():
    decoder = ReplyDecoder()
    with pytest.raises(RemoteProtocolError):
        list(decoder.feed(b"0" * (MAX_MESSAGE + 100)))


# -- encoders -------------------------------------------------------------------------------


def test_encode_payload_text_when_possible():
    assert codec.encode_payload(b"hello world") == b"hello world"
    assert codec.encode_payload(b"\x04\x00") == b"\x04\x00"
    assert codec.encode_payload(TEXT_1024) == TEXT_1024


@pytest.mark.parametrize(
    "data", [b"\x00", b"\x01a", b"\x02", b"\x03", b"a\nb", b"\n", b"\x00" * 1024]
)
def test_encode_payload_binary_when_needed(data):
    assert codec.encode_payload(data) == binary(data)


@pytest.mark.parametrize("data", [b"", b"x" * 1025, b"\x00" * 1025])
def test_encode_payload_refuses_what_ssmp_cannot_carry(data):
    assert codec.encode_payload(data) is None


def test_request_encoders_bytes():
    assert codec.login("alice", "open") == b"LOGIN alice open\n"
    assert codec.login("alice", "secret", b"pw") == b"LOGIN alice secret pw\n"
    assert codec.subscribe("t") == b"SUBSCRIBE t\n"
    assert codec.subscribe("t", presence=True) == b"SUBSCRIBE t PRESENCE\n"
    assert codec.unsubscribe("t") == b"UNSUBSCRIBE t\n"
    assert codec.mcast("t", b"hi") == b"MCAST t hi\n"
    assert codec.mcast("t", b"\n") == b"MCAST t \x00\x00\n\n"
    assert codec.ucast("bob", b"hi") == b"UCAST bob hi\n"
    assert codec.bcast(b"hi") == b"BCAST hi\n"
    assert codec.ping() == b"PING\n"
    assert codec.pong() == b"PONG\n"
    assert codec.close() == b"CLOSE\n"


@pytest.mark.parametrize(
    "call",
    [
        lambda: codec.login("bad id", "open"),
        lambda: codec.login("alice", ""),
        lambda: codec.login("alice", "secret", b""),
        lambda: codec.subscribe(ID64 + "x"),
        lambda: codec.unsubscribe("a\n"),
        lambda: codec.mcast("t", b""),
        lambda: codec.mcast("t", b"x" * 1025),
        lambda: codec.ucast("b*b", b"x"),
        lambda: codec.bcast(b""),
        lambda: codec.encode_reply(200, b""),
    ],
)
def test_encoders_refuse_invalid_values(call):
    with pytest.raises(ValueError):
        call()


def test_encode_reply():
    assert codec.encode_reply(200) == b"200\n"
    assert codec.encode_reply(401, b"open secret") == b"401 open secret\n"
    assert codec.encode_reply(200, b"\x00ab") == b"200 \x00\x02\x00ab\n"


@pytest.mark.parametrize("code", [-1, 1000, 12345])
def test_encode_reply_refuses_codes_that_are_not_3_digits(code):
    with pytest.raises(ValueError):
        codec.encode_reply(code)


ROUND_TRIP_PAYLOADS = [b"x", b"hello world", b"\x00", b"a\nb", b"\x03\xff", TEXT_1024, b"\n" * 1024]


@pytest.mark.parametrize("payload", ROUND_TRIP_PAYLOADS)
def test_request_encoders_round_trip(payload):
    frames = [
        (codec.login(ID64, "secret", payload), Login(ID64, "secret", payload)),
        (codec.login("a", "open"), Login("a", "open", None)),
        (codec.subscribe("t", presence=True), Subscribe("t", True)),
        (codec.subscribe("t"), Subscribe("t", False)),
        (codec.unsubscribe("t"), Unsubscribe("t")),
        (codec.mcast("t", payload), Mcast("t", payload, codec.mcast("t", payload)[:-1])),
        (codec.ucast("u", payload), Ucast("u", payload, codec.ucast("u", payload)[:-1])),
        (codec.bcast(payload), Bcast(payload, codec.bcast(payload)[:-1])),
        (codec.ping(), PING),
        (codec.pong(), PONG),
        (codec.close(), CLOSE),
    ]
    assert requests(b"".join(f for f, _ in frames)) == [e for _, e in frames]


@pytest.mark.parametrize("payload", ROUND_TRIP_PAYLOADS)
def test_reply_encoder_and_forwarded_lines_round_trip(payload):
    mcast_line = codec.mcast("t", payload)
    ucast_line = codec.ucast("u", payload)
    bcast_line = codec.bcast(payload)
    data = (
        codec.encode_reply(200, payload)
        + codec.encode_reply(404)
        + b"000 bob "
        + mcast_line
        + b"000 bob "
        + ucast_line
        + b"000 bob "
        + bcast_line
    )
    assert replies(data) == [
        Reply(200, payload),
        Reply(404, None),
        Delivery("bob", "MCAST", "t", payload),
        Delivery("bob", "UCAST", "u", payload),
        Delivery("bob", "BCAST", None, payload),
    ]
