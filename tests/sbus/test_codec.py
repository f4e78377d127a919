"""sbus codec conformance: the packet grammar of the sbus README ("Protocol") as fixed by
docs/sbus.md ("Decisions"), its error cases, and round trips."""

from __future__ import annotations

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.sbus.codec import (
    BLOCKING_HARD,
    BLOCKING_SOFT,
    DEFAULT_MAX_PACKET,
    ECHO_OFF,
    ECHO_ON,
    FLOOD_CONTROL,
    ORDER,
    WHOAMI,
    ControlMessage,
    Publish,
    Subscribe,
    Unsubscribe,
    encode_packet,
    parse_packet,
    whoami_reply,
)

# -- the four kinds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "packet"),
    [
        (b"SUB a/*/c/", Subscribe(b"a/*/c/")),
        (b"SUB ", Subscribe(b"")),
        (b"SUB a/b\0ignored", Subscribe(b"a/b")),
        (b"SUB a\0", Subscribe(b"a")),
        (b"SUB  x", Subscribe(b" x")),
        (b"SUB !/cred/100/1000/1111/x", Subscribe(b"!/cred/100/1000/1111/x")),
        (b"UNSUB a/*/c/", Unsubscribe(b"a/*/c/")),
        (b"UNSUB ", Unsubscribe(b"")),
        (b"UNSUB a\0ignored\0too", Unsubscribe(b"a")),
    ],
)
def test_sub_and_unsub_pattern_ends_at_first_nul_rest_ignored(data, packet):
    assert parse_packet(data, DEFAULT_MAX_PACKET) == packet


@pytest.mark.parametrize(
    ("data", "packet"),
    [
        (b"MSG a/b/c\0hello", Publish(b"a/b/c", b"hello")),
        (b"MSG a\0", Publish(b"a", b"")),
        (b"MSG \0x", Publish(b"", b"x")),
        (b"MSG k\0pay\0load\0", Publish(b"k", b"pay\0load\0")),
        (b"MSG k\0\xff\xfe", Publish(b"k", b"\xff\xfe")),
        (b"MSG k\xff\0p", Publish(b"k\xff", b"p")),
    ],
)
def test_msg_key_up_to_first_nul_payload_is_everything_after(data, packet):
    assert parse_packet(data, DEFAULT_MAX_PACKET) == packet


@pytest.mark.parametrize(
    ("data", "packet"),
    [
        (b"CMSG !/cred/whoami", ControlMessage(WHOAMI, b"")),
        (b"CMSG !/cred/whoami\0", ControlMessage(WHOAMI, b"")),
        (b"CMSG echo/off", ControlMessage(b"echo/off")),
        (b"CMSG blocking/soft/queue\0x\0y", ControlMessage(b"blocking/soft/queue", b"x\0y")),
        (b"CMSG k\0p", ControlMessage(b"k", b"p")),
    ],
)
def test_cmsg_nul_and_payload_may_be_omitted(data, packet):
    assert parse_packet(data, DEFAULT_MAX_PACKET) == packet


def test_max_size_defaults_to_212960():
    assert DEFAULT_MAX_PACKET == 212_960
    at_limit = b"MSG k\0" + b"x" * (DEFAULT_MAX_PACKET - 6)
    assert parse_packet(at_limit) == Publish(b"k", b"x" * (DEFAULT_MAX_PACKET - 6))
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        parse_packet(at_limit + b"x")


# -- malformed packets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"SUB",
        b"UNSUB",
        b"MSG",
        b"CMSG",
        b"FOO x",
        b"sub x",
        b"Sub x",
        b" SUB x",
        b"SUBx",
        b"SUB\0x",
        b"SUB\tx",
        b"MSGS k\0p",
        b"PUB k\0p",
        b"\0",
        b"\xff\xfe x",
    ],
)
def test_malformed_packets_raise_remote_protocol_error(data):
    with pytest.raises(RemoteProtocolError):
        parse_packet(data, DEFAULT_MAX_PACKET)


@pytest.mark.parametrize("data", [b"MSG key", b"MSG ", b"MSG a/b/c"])
def test_msg_without_nul_is_rejected(data):
    with pytest.raises(RemoteProtocolError, match="NUL"):
        parse_packet(data, DEFAULT_MAX_PACKET)


def test_empty_packet_is_rejected():
    with pytest.raises(RemoteProtocolError, match="empty"):
        parse_packet(b"", DEFAULT_MAX_PACKET)


def test_unknown_verb_is_rejected():
    with pytest.raises(RemoteProtocolError, match="unknown verb"):
        parse_packet(b"FOO x", DEFAULT_MAX_PACKET)


@pytest.mark.parametrize("max_size", [0, 5, 10])
def test_packet_over_configured_max_size_is_rejected(max_size):
    data = b"MSG k\0" + b"p" * 5  # 11 bytes
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        parse_packet(data, max_size)
    assert parse_packet(data, 11) == Publish(b"k", b"ppppp")


# -- encoding and round trips -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("packet", "data"),
    [
        (Subscribe(b"a/*/c/"), b"SUB a/*/c/"),
        (Subscribe(b""), b"SUB "),
        (Unsubscribe(b"x"), b"UNSUB x"),
        (Publish(b"a/b", b"hi\0"), b"MSG a/b\0hi\0"),
        (Publish(b"", b""), b"MSG \0"),
        (ControlMessage(WHOAMI), b"CMSG !/cred/whoami\0"),
        (ControlMessage(b"k", b"p"), b"CMSG k\0p"),
    ],
)
def test_encode_packet_writes_the_spec_forms_and_parses_back(packet, data):
    assert encode_packet(packet) == data
    assert parse_packet(data, DEFAULT_MAX_PACKET) == packet


def test_cmsg_is_always_encoded_with_its_nul():
    assert encode_packet(ControlMessage(b"order/stack")) == b"CMSG order/stack\0"


@pytest.mark.parametrize(
    "packet",
    [Subscribe(b"a\0b"), Unsubscribe(b"\0"), Publish(b"k\0", b"p"), ControlMessage(b"\0k")],
)
def test_encode_refuses_nul_in_pattern_or_key(packet):
    with pytest.raises(ValueError, match="NUL"):
        encode_packet(packet)


def test_encode_refuses_what_is_not_a_packet():
    with pytest.raises(TypeError):
        encode_packet(b"MSG k\0p")  # type: ignore[arg-type]


def test_whoami_reply_carries_the_credentials():
    reply = whoami_reply(100, 1000, 1111)
    assert reply == ControlMessage(b"!/cred/whoami", b"!/cred/100/1000/1111")
    assert encode_packet(reply) == b"CMSG !/cred/whoami\0!/cred/100/1000/1111"


def test_control_keys_name_the_spec_messages():
    assert ECHO_OFF == b"echo/off"
    assert ECHO_ON == b"echo/on"
    assert {
        b"blocking/soft/queue",
        b"blocking/soft/discard",
        b"blocking/soft/block",
        b"blocking/soft/error",
    } == BLOCKING_SOFT
    assert {b"blocking/hard/discard", b"blocking/hard/block", b"blocking/hard/error"} == (
        BLOCKING_HARD
    )
    assert {b"order/queue", b"order/stack", b"order/random"} == ORDER
    assert FLOOD_CONTROL == BLOCKING_SOFT | BLOCKING_HARD | ORDER
    assert parse_packet(b"CMSG blocking/hard/block\0") == ControlMessage(b"blocking/hard/block")
