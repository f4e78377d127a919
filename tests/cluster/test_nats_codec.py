"""The NATS engine's sans-IO parts: the protocol codec (fuzzed), topics as subject tokens
(reversible for every topic), the state parts, the URL and its redaction."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgbroker import ConfigError
from msgbroker import clusterwire as wire
from msgbroker.plugins.nats import codec, statewire
from msgbroker.plugins.nats.urls import parse_url, redact
from tests.fuzzing import mutated

# every code point, lone surrogates (what surrogateescape makes of bad UTF-8) included
any_text = st.text(st.characters(codec="utf-8", exclude_categories=()) | st.characters(
    min_codepoint=0xD800, max_codepoint=0xDFFF))


# -- topics as tokens ----------------------------------------------------------------------


@given(any_text)
def test_every_topic_is_one_valid_token_that_gives_it_back(topic: str) -> None:
    token = codec.topic_token(topic)
    assert codec.valid_subject(b"msgbroker.t." + token)
    assert b"." not in token and token not in (b"*", b">")
    if token.startswith(b"#"):
        assert len(token) == 65 and codec.token_topic(token) is None
        assert 3 * len(topic.encode("utf-8", "surrogatepass")) > codec.MAX_TOKEN
    else:
        assert len(token) <= codec.MAX_TOKEN
        assert codec.token_topic(token) == topic


def test_tokens_of_awkward_topics() -> None:
    assert codec.topic_token("news") == b"news"
    assert codec.topic_token("dev/kitchen/temp") == b"dev/kitchen/temp"
    assert codec.topic_token("a b.c") == b"a%20b%2Ec"
    assert codec.topic_token("*") == b"%2A"
    assert codec.topic_token(">") == b"%3E"
    assert codec.topic_token("%") == b"%25"
    assert codec.topic_token("") == b"%"
    assert codec.topic_token("prix €") == b"prix%20%E2%82%AC"
    long = "x" * 300
    assert codec.topic_token(long) != codec.topic_token(long + "y")
    for token in (b"%2", b"%zz", b"%41", b"a b", b"", b"a.b"):  # never made by topic_token
        with pytest.raises(ValueError):
            codec.token_topic(token)


@given(any_text, any_text)
def test_distinct_topics_have_distinct_tokens(one: str, other: str) -> None:
    if one != other:
        assert codec.topic_token(one) != codec.topic_token(other)


def test_valid_subjects() -> None:
    assert codec.valid_subject(b"a.b.c")
    assert not codec.valid_subject(b"a..b")
    assert not codec.valid_subject(b"a.*")
    assert codec.valid_subject(b"a.*", wildcards=True)
    assert codec.valid_subject(b"a.>", wildcards=True)
    assert not codec.valid_subject(b"a.>.b", wildcards=True)
    assert not codec.valid_subject(b"a b")
    assert not codec.valid_subject(b"")


# -- the protocol --------------------------------------------------------------------------

STREAM = (
    b'INFO {"server_id":"x","max_payload":1048576,"tls_required":false}\r\n'
    b"+OK\r\nPING\r\nPONG\r\n"
    b"MSG msgbroker.t.news 16 5\r\nhello\r\n"
    b"MSG msgbroker.q 3 msgbroker.r.n1.7 0\r\n\r\n"
    b"MSG a 2 4\r\n\r\n\r\n\r\n"
    b"HMSG a 2 reply 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
    b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n"
)
EVENTS = [
    codec.Info({"server_id": "x", "max_payload": 1048576, "tls_required": False}),
    codec.Ok(),
    codec.Ping(),
    codec.Pong(),
    codec.Msg(b"msgbroker.t.news", 16, None, b"hello"),
    codec.Msg(b"msgbroker.q", 3, b"msgbroker.r.n1.7", b""),
    codec.Msg(b"a", 2, None, b"\r\n\r\n"),
    codec.Msg(b"a", 2, b"reply", b"hi", b"NATS/1.0\r\n\r\n"),
    codec.Err('Permissions Violation for Publish to "x"'),
]


def test_a_stream_parses_into_its_events() -> None:
    assert codec.Parser().feed(STREAM) == EVENTS
    info = EVENTS[0]
    assert isinstance(info, codec.Info) and info.max_payload == 1 << 20
    assert not info.tls_required


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_a_stream_cut_anywhere_parses_the_same(cuts: list[int]) -> None:
    parser = codec.Parser()
    events, at = [], 0
    for cut in [*sorted(cuts), len(STREAM)]:
        events += parser.feed(STREAM[at:cut])
        at = cut
    assert events == EVENTS and parser.buffered == 0


@given(mutated(STREAM))
def test_mutated_streams_parse_or_are_refused_never_crash(data: bytes) -> None:
    parser = codec.Parser(max_control_line=256)
    try:
        for event in parser.feed(data):
            assert isinstance(event, codec.Info | codec.Msg | codec.Ping | codec.Pong | codec.Ok
                              | codec.Err)
    except codec.NatsProtocolError:
        pass


@given(st.binary(max_size=600))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    with contextlib.suppress(codec.NatsProtocolError):
        codec.Parser(max_control_line=128, max_payload=1000).feed(data)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"MSG a 1 x\r\n", "bad message line"),
        (b"MSG a 1\r\n", "bad message line"),
        (b"MSG a 1 -3\r\n", "bad message line"),
        (b"HMSG a 1 9 3\r\n", "bad message line"),
        (b"MSG a 1 3\r\nabcXY", "not followed by CRLF"),
        (b"MSG a 1 99999\r\n", "above"),
        (b"INFO [1]\r\n", "not a JSON object"),
        (b"INFO {\r\n", "not JSON"),
        (b"HELLO\r\n", "unknown operation"),
        (b"x" * 300, "too long"),
    ],
)
def test_what_is_not_the_protocol_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(codec.NatsProtocolError, match=why):
        codec.Parser(max_control_line=256, max_payload=1000).feed(data)


def test_what_a_client_writes() -> None:
    assert codec.pub(b"a.b", b"xy") == b"PUB a.b 2\r\nxy\r\n"
    assert codec.pub(b"a.b", b"", b"r.1") == b"PUB a.b r.1 0\r\n\r\n"
    assert codec.sub(b"a.*", 7) == b"SUB a.* 7\r\n"
    assert codec.unsub(7) == b"UNSUB 7\r\n"
    assert codec.connect({"verbose": False}) == b'CONNECT {"verbose":false}\r\n'


# -- state parts ---------------------------------------------------------------------------


@given(st.dictionaries(st.binary(max_size=60), st.binary(max_size=60), max_size=200),
       st.integers(200, 5000))
def test_a_state_in_parts_within_the_limit_gives_it_back(
    state: dict[bytes, bytes], limit: int
) -> None:
    parts = statewire.state_parts("n1", state, limit)
    got: dict[bytes, bytes] = {}
    for index, data in enumerate(parts):
        assert len(data) <= limit + 64
        node, at, count, flat = statewire.read_part(data)
        assert (node, at, count) == ("n1", index, len(parts))
        got.update(zip(flat[::2], flat[1::2], strict=True))
    assert got == state


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x93\x01",
        b"\x95\x02\xa1n\x00\x01\x90",  # another version
        b"\x95\x01\xa1n\x01\x01\x90",  # part 1 of 1
        b"\x95\x01\xa1n\x00\x01\x91\xc4\x00",  # a field without its value
    ],
)
def test_what_is_no_state_part_is_refused(data: bytes) -> None:
    with pytest.raises(statewire.StateWireError):
        statewire.read_part(data)


def test_a_large_announcement_splits_into_announcements_of_the_same_sender() -> None:
    changes = [(wire.identity_field(f"user{i}"), b"" if i % 3 else None) for i in range(500)]
    data = wire.header("n1", "e1") + wire.body(wire.CHANGES, [list(c) for c in changes])
    parts = statewire.split_changes(data, changes, 1000)
    assert len(parts) > 5
    got = []
    for part in parts:
        assert len(part) <= 1100
        node, epoch, op, items = wire.decode(part)
        assert (node, epoch, op) == ("n1", "e1", wire.CHANGES)
        got += wire.read_changes(items)
    assert got == changes


# -- the URL -------------------------------------------------------------------------------


def test_urls_credentials_and_what_is_logged() -> None:
    plain = parse_url("nats://10.0.0.5", None)
    assert (plain.host, plain.port, plain.tls, plain.credentials()) == ("10.0.0.5", 4222, False, {})
    tls = parse_url("tls://h:4443", None)
    assert (tls.port, tls.tls) == (4443, True)
    assert parse_url("nats+tls://h", None).tls
    userpass = parse_url("nats://bob:s3cret@h:1", None)
    assert userpass.credentials() == {"user": "bob", "pass": "s3cret"}
    assert userpass.redacted == "nats://bob:***@h:1"
    token = parse_url("nats://t0ken@h:1", None)
    assert token.credentials() == {"auth_token": "t0ken"}
    assert token.redacted == "nats://***@h:1"
    assert "t0ken" not in repr(token) and "s3cret" not in repr(userpass)
    # the [cluster] password: the URL user's password, or a token without a user
    assert parse_url("nats://bob@h", "pw").credentials() == {"user": "bob", "pass": "pw"}
    assert parse_url("nats://h", "tk").credentials() == {"auth_token": "tk"}
    assert redact("nats://h:4222") == "nats://h:4222"
    with pytest.raises(ConfigError, match="no path"):
        parse_url("nats://u:s3cret@h/x", None)
    with pytest.raises(ConfigError) as bad:
        parse_url("nats://u:s3cret@h:99999", None)
    assert "s3cret" not in str(bad.value)


def test_what_the_engine_refuses_at_start(tmp_path: Any) -> None:
    from twisted.internet.task import Clock

    from msgbroker.engine import ClusterSettings, EngineContext
    from msgbroker.plugins.nats.engine import NatsEngine

    def engine(url: str, **settings: Any) -> NatsEngine:
        context = EngineContext(
            "n1", url, ClusterSettings(url=url, **settings), Clock(), None, lambda k, t: None
        )
        return NatsEngine(context)

    assert engine("nats://h", prefix="prod.msgbroker").announce_subject == b"prod.msgbroker.a"
    for prefix in ("a b", "a.*", "a..b", "a.>"):
        with pytest.raises(ConfigError, match="no NATS subject"):
            engine("nats://h", prefix=prefix)
    with pytest.raises(ConfigError, match="cannot read the cluster's TLS files"):
        engine("tls://h", tls_ca=str(tmp_path / "missing.pem"))
