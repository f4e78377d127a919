"""Property tests of the sbus codec and pattern matcher (hypothesis).

- Garbage (random bytes, token soup, mutated valid packets): :func:`parse_packet` returns a
  packet or raises ``RemoteProtocolError``, never anything else.
- Differential: :func:`parse_packet` agrees with an oracle built from the sbus README's regular
  expressions, and :func:`matches` with a regex translation of the pattern rules.
- Round trips: generated packets of every kind survive encode then parse.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.sbus.codec import (
    DEFAULT_MAX_PACKET,
    ControlMessage,
    Publish,
    Subscribe,
    Unsubscribe,
    encode_packet,
    parse_packet,
)
from msgbroker.plugins.sbus.patterns import is_secret, matches
from tests.fuzzing import mutated

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies -------------------------------------------------------------------------------

TOKENS = [b"SUB", b"UNSUB", b"MSG", b"CMSG", b" ", b"\0", b"/", b"*", b"!", b"a", b"\xff"]
keys = st.one_of(
    st.binary(max_size=20).map(lambda b: b.replace(b"\0", b"")),
    st.lists(st.sampled_from([b"a", b"b", b"/", b"*", b"!", b"!/cred/", b"1"]), max_size=8).map(
        b"".join
    ),
)
payloads = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\0", b"\0\0x", b"SUB x"]))
packets = st.one_of(
    keys.map(Subscribe),
    keys.map(Unsubscribe),
    st.builds(Publish, keys, payloads),
    st.builds(ControlMessage, keys, payloads),
)
max_sizes = st.sampled_from([0, 1, 4, 10, 64, DEFAULT_MAX_PACKET])


garbage = st.one_of(
    st.binary(max_size=80),
    st.lists(st.sampled_from(TOKENS), max_size=12).map(b"".join),
    packets.map(encode_packet).flatmap(mutated),
)

# -- oracles: the sbus README's regular expressions read literally ----------------------------

_GRAMMAR = [
    (re.compile(rb"SUB ([^\x00]*)(\x00.*)?", re.DOTALL), lambda m: Subscribe(m[1])),
    (re.compile(rb"UNSUB ([^\x00]*)(\x00.*)?", re.DOTALL), lambda m: Unsubscribe(m[1])),
    (re.compile(rb"MSG ([^\x00]*)\x00(.*)", re.DOTALL), lambda m: Publish(m[1], m[2])),
    (
        re.compile(rb"CMSG ([^\x00]*)(\x00(.*))?", re.DOTALL),
        lambda m: ControlMessage(m[1], m[3] or b""),
    ),
]


def oracle_parse(data, max_size):
    if not data or len(data) > max_size:
        return None
    for regex, build in _GRAMMAR:
        found = regex.fullmatch(data)
        if found:
            return build(found)
    return None


def oracle_matches(pattern, key):
    """The pattern rules as a regex: ``*`` is ``[^/]*+`` (possessive: greedy, no
    backtracking) that may not start at the end of the key (docs/sbus.md: such a ``*``
    matches nothing), a final ``/`` is ``/.*``, other bytes are literal, the whole key must
    match; the empty pattern matches every key. Secret keys are left out."""
    if not pattern:
        return True
    out = []
    for index, byte in enumerate(pattern):
        if byte == ord("*"):
            out.append(rb"(?!\Z)[^/]*+")
        elif byte == ord("/") and index == len(pattern) - 1:
            out.append(rb"/.*")
        else:
            out.append(re.escape(bytes([byte])))
    return re.fullmatch(b"".join(out), key, re.DOTALL) is not None


# -- properties -------------------------------------------------------------------------------


@FUZZ
@given(garbage, max_sizes)
def test_only_remote_protocol_error_escapes_parse_packet(data, max_size):
    try:
        packet = parse_packet(data, max_size)
    except RemoteProtocolError:
        return
    assert isinstance(packet, Subscribe | Unsubscribe | Publish | ControlMessage)


@FUZZ
@given(garbage, max_sizes)
def test_parse_packet_agrees_with_the_spec_regexes(data, max_size):
    expected = oracle_parse(data, max_size)
    try:
        got = parse_packet(data, max_size)
    except RemoteProtocolError:
        got = None
    assert got == expected


@FUZZ
@given(packets)
def test_encode_then_parse_gives_the_packet_back(packet):
    assert parse_packet(encode_packet(packet), DEFAULT_MAX_PACKET) == packet


@FUZZ
@given(packets, st.integers(0, 80))
def test_encoded_packet_over_max_size_is_rejected_else_parsed(packet, max_size):
    data = encode_packet(packet)
    if len(data) > max_size:
        try:
            parse_packet(data, max_size)
        except RemoteProtocolError:
            return
        raise AssertionError("an oversized packet was accepted")
    assert parse_packet(data, max_size) == packet


@FUZZ
@given(keys, keys)
def test_matches_agrees_with_regex_translation_for_public_keys(pattern, key):
    if is_secret(key):
        return
    assert matches(pattern, key) is oracle_matches(pattern, key)


@FUZZ
@given(keys, keys.map(lambda k: b"!/cred/" + k))
def test_secret_key_matches_only_full_cred_pattern(pattern, key):
    if matches(pattern, key):
        assert re.match(rb"!/cred/[0-9]+/[0-9]+/[0-9]+/", pattern)
