"""sbus routing keys and patterns: matching (the sbus README's "Routing keys", docs/sbus.md), secret
``!/cred/`` keys and subscriptions, and the key <-> topic mapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgbroker.plugins.sbus.patterns import (
    credentials,
    is_secret,
    key_to_topic,
    matches,
    resolve_subscription,
    secret_fields,
    topic_to_key,
)

# -- matching ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [b"a/b/c/", b"a/b/c/d/e", b"a/xyz/c/", b"a//c/"])
def test_spec_example_pattern_matches(key):
    assert matches(b"a/*/c/", key)


@pytest.mark.parametrize("key", [b"a/b/c", b"a/c/d", b"a/b/d/", b"b/b/c/", b"a/b"])
def test_spec_example_pattern_does_not_match(key):
    assert not matches(b"a/*/c/", key)


@pytest.mark.parametrize("key", [b"", b"a", b"a/b/c", b"*", b"!", b"!/x", b"\xff\0"])
def test_empty_pattern_matches_every_key(key):
    assert matches(b"", key)


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        (b"*", b"abc", True),
        (b"*", b"a/b", False),
        (b"*/b", b"a/b", True),
        (b"*/b", b"/b", True),
        (b"a/*", b"a/bc", True),
        (b"a/*", b"a/b/c", False),
        (b"*/*", b"x/y", True),
        (b"x*", b"xyz", True),
        (b"x*", b"yz", False),
    ],
)
def test_star_matches_up_to_next_slash_or_end(pattern, key, expected):
    assert matches(pattern, key) is expected


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        # docs/sbus.md's examples: the reference server's edges
        (b"a*", b"a", False),
        (b"a/*", b"a/", False),
        (b"*", b"", False),
        (b"a/*/c", b"a//c", True),
        (b"*/", b"/x", True),
        # so a pattern ending in ** matches nothing: its last * always meets the end
        (b"**", b"abc", False),
        (b"a/**", b"a/b", False),
        (b"**/", b"a/b", True),
        (b"a*/", b"a/", True),
        (b"!/cred/1/2/3/*", b"!/cred/1/2/3/", False),
    ],
)
def test_a_star_that_meets_the_end_of_the_key_matches_nothing(pattern, key, expected):
    assert matches(pattern, key) is expected


@pytest.mark.parametrize(
    ("pattern", "key"),
    [(b"a*b", b"ab"), (b"a*b", b"axb"), (b"*c", b"abc"), (b"*/c", b"a/b/c")],
)
def test_star_is_greedy_and_never_backtracks(pattern, key):
    assert not matches(pattern, key)


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        (b"a/", b"a/", True),
        (b"a/", b"a/b", True),
        (b"a/", b"a/b/c/d", True),
        (b"a/", b"a", False),
        (b"a/", b"ab", False),
        (b"/", b"/", True),
        (b"/", b"/anything", True),
        (b"/", b"x/", False),
        (b"*/", b"a/b", True),
        (b"*/", b"a", False),
    ],
)
def test_trailing_slash_matches_itself_and_anything_after(pattern, key, expected):
    assert matches(pattern, key) is expected


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        (b"a/b", b"a/b", True),
        (b"a/b", b"a/b/c", False),
        (b"a/b", b"a/bc", False),
        (b"a/b", b"a", False),
        (b"a/b/c", b"a/b", False),
        (b"a", b"*", False),
        (b"*", b"*", True),
        (b"\xff", b"\xff", True),
    ],
)
def test_other_patterns_match_the_whole_key_literally(pattern, key, expected):
    assert matches(pattern, key) is expected


@given(
    st.binary(max_size=30).filter(
        lambda b: b"*" not in b and not b.endswith(b"/") and not is_secret(b)
    )
)
def test_public_pattern_without_wildcards_matches_itself_not_longer_keys(literal):
    assert matches(literal, literal)
    assert not matches(literal, literal + b"x") or literal == b""


# -- secret keys ------------------------------------------------------------------------------

SECRET = b"!/cred/100/1000/1111/private"


@pytest.mark.parametrize(
    "pattern",
    [b"", b"*", b"!/", b"!/*/", b"!/cred/", b"!/cred/*/*/*/", b"!/cred/*/1000/1111/private"],
)
def test_secret_key_never_matches_empty_or_wildcard_pattern(pattern):
    assert not matches(pattern, SECRET)


@pytest.mark.parametrize(
    "pattern",
    [b"!/cred/100/1000/1111/private", b"!/cred/100/1000/1111/", b"!/cred/100/1000/1111/*"],
)
def test_secret_key_matches_full_cred_prefix_pattern(pattern):
    assert matches(pattern, SECRET)


def test_secret_key_with_empty_fields_does_not_match_unresolved_pattern():
    assert not matches(b"!/cred////x", b"!/cred////x")


def test_secret_key_requires_the_right_credentials():
    assert not matches(b"!/cred/100/1000/2222/", SECRET)


@pytest.mark.parametrize(
    ("key", "expected"),
    [(b"!/cred/1/2/3/x", True), (b"!/cred/", True), (b"!/cre", False), (b"a/!/cred/", False)],
)
def test_is_secret_means_starts_with_cred_prefix(key, expected):
    assert is_secret(key) is expected


@pytest.mark.parametrize(
    ("key", "fields"),
    [
        (b"!/cred/100/1000/1111/x", (b"100", b"1000", b"1111", b"x")),
        (b"!/cred////", (b"", b"", b"", b"")),
        (
            b"!/cred/100/1000/1111/!/cred/1000/1000/19211",
            (b"100", b"1000", b"1111", b"!/cred/1000/1000/19211"),
        ),
        (b"!/cred/1/2/3/a\nb", (b"1", b"2", b"3", b"a\nb")),
        (b"!/cred/1/2/3", None),
        (b"!/cred/1/2", None),
        (b"!/cred/", None),
        (b"!/cred/*/2/3/x", None),
        (b"!/cred/1/x/3/x", None),
        (b"a/b", None),
    ],
)
def test_secret_fields_follow_the_spec_regex(key, fields):
    assert secret_fields(key) == fields


def test_credentials_are_written_like_whoami():
    assert credentials(100, 1000, 1111) == b"!/cred/100/1000/1111"


@pytest.mark.parametrize(
    ("pattern", "stored"),
    [
        (b"a/*/c/", b"a/*/c/"),
        (b"", b""),
        (b"!/x", b"!/x"),
        (b"!/cred/100/1000/1111/x", b"!/cred/100/1000/1111/x"),
        (b"!/cred////x", b"!/cred/100/1000/1111/x"),
        (b"!/cred//1000//", b"!/cred/100/1000/1111/"),
        (b"!/cred/100/1000/1111/*", b"!/cred/100/1000/1111/*"),
    ],
)
def test_subscription_allowed_with_own_credentials_empty_fields_filled(pattern, stored):
    assert resolve_subscription(pattern, 100, 1000, 1111) == stored


@pytest.mark.parametrize(
    "pattern",
    [
        b"!/cred/101/1000/1111/x",
        b"!/cred/100/0/1111/x",
        b"!/cred///2/",
        b"!/cred/0100/1000/1111/x",
        b"!/cred/*/1000/1111/x",
        b"!/cred/100/*/1111/",
        b"!/cred/100/1000/1111",
        b"!/cred/100",
        b"!/cred/",
    ],
)
def test_subscription_refused_for_other_credentials_wildcards_or_truncation(pattern):
    assert resolve_subscription(pattern, 100, 1000, 1111) is None


def test_resolved_subscription_receives_its_secret_messages():
    stored = resolve_subscription(b"!/cred////", 100, 1000, 1111)
    assert stored is not None
    assert matches(stored, SECRET)


# -- key <-> topic ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "topic"),
    [(b"a/b", "a/b"), (b"caf\xc3\xa9", "caf\u00e9"), (b"\xff", "\udcff"), (b"", "")],
)
def test_key_maps_to_topic_with_surrogateescape(key, topic):
    assert key_to_topic(key) == topic
    assert topic_to_key(topic) == key


@given(st.binary().filter(lambda b: b"\0" not in b))
def test_key_topic_mapping_is_lossless(key):
    assert topic_to_key(key_to_topic(key)) == key


@pytest.mark.parametrize("topic", ["a\0b", "\ud800", "x\udc00"])
def test_topic_no_key_can_carry_raises_value_error(topic):
    with pytest.raises(ValueError):  # UnicodeEncodeError, or the NUL refused
        topic_to_key(topic)
