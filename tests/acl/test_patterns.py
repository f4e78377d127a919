"""The ACL's topic patterns (plugins/acl/patterns.py): sbus's matching rules, as one regular
expression for every identity, and containment and overlap of patterns for sbus
subscriptions, each checked against sbus's own ``matches`` and against brute force."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgbroker.plugins.acl.patterns import (
    EVERYTHING,
    SEPARATOR,
    Template,
    compile_alternatives,
)
from msgbroker.plugins.sbus.patterns import matches


def regex_matches(template: Template, topic: str, identity: str = "id") -> bool:
    compiled = compile_alternatives([template.regex()])
    assert compiled is not None
    return compiled.match(identity + SEPARATOR + topic) is not None


def sbus_matches(pattern: str, topic: str) -> bool:
    """sbus's rule, without its secret-key exception (the ACL matches secret topics like
    any other; the tests keep clear of ``!/cred/`` where it matters)."""
    return matches(pattern.encode(), topic.encode())


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a/*/c/", "a/b/c/", True),
        ("a/*/c/", "a/b/c/d/e", True),
        ("a/*/c/", "a/b/c", False),
        ("a/*/c", "a//c", True),
        ("*", "abc", True),
        ("*", "a/b", False),
        ("*", "", False),  # a * that meets the end matches nothing
        ("a*", "a", False),
        ("a*", "ab", True),
        ("*/b", "/b", True),
        ("chat/", "chat/", True),
        ("chat/", "chat", False),
        ("chat/", "chat/room/1", True),
        ("", "anything/at/all", True),
        ("", "!/cred/1/2/3/x", True),  # secret topics are topics like any other here
        ("news", "news", True),
        ("news", "news/", False),
        ("a.b+c", "a.b+c", True),  # regex characters are literal
        ("a.b+c", "axbbc", False),
    ],
)
def test_matching(pattern, topic, expected):
    assert regex_matches(Template.of((pattern,)), topic) is expected


ALPHABET = "ab/*"
TOPIC_ALPHABET = "ab/"


@settings(max_examples=500)
@given(st.text(ALPHABET, max_size=8), st.text(TOPIC_ALPHABET + "*.", max_size=10))
def test_the_regex_is_sbus_matching(pattern, topic):
    assert regex_matches(Template.of((pattern,)), topic) is sbus_matches(pattern, topic)


@settings(max_examples=300)
@given(
    st.text(ALPHABET, max_size=4),
    st.text(ALPHABET, max_size=4),
    st.text("ab/*.", min_size=1, max_size=4),
    st.text(TOPIC_ALPHABET + "*.", max_size=10),
)
def test_the_identity_is_literal(before, after, identity, topic):
    """``%u`` stands for the identity as it is: its ``*`` and ``/`` are plain characters,
    never a wildcard or the "and below" of a final ``/``."""
    template = Template.of((before, None, after))
    expected = token_match(before, identity, after, topic)
    assert regex_matches(template, topic, identity) is expected


def token_match(before: str, identity: str, after: str, topic: str) -> bool:
    """sbus's matching algorithm (``msgbroker.plugins.sbus.patterns.matches``) on tokens:
    the template's characters (``*`` a wildcard, a final ``/`` "and below") with the
    identity's characters in between, each a plain character."""
    tokens = [(c, c == "*") for c in before] + [(c, False) for c in identity]
    tokens += [(c, c == "*") for c in after]
    below = len(tokens) - 1 if after.endswith("/") else -1
    at, end = 0, len(topic)
    for index, (char, wild) in enumerate(tokens):
        if wild:
            if at == end:
                return False
            slash = topic.find("/", at)
            at = end if slash < 0 else slash
        elif index == below:
            return at < end and topic[at] == "/"
        elif at < end and topic[at] == char:
            at += 1
        else:
            return False
    return at == end


# -- containment and overlap ---------------------------------------------------------------------

#: every topic over {a, b, /} up to 6 characters: enough to tell these short patterns apart
TOPICS = ["".join(t) for n in range(7) for t in itertools.product("ab/", repeat=n)]


def topics_of(pattern: str) -> set[str]:
    return {topic for topic in TOPICS if sbus_matches(pattern, topic)}


@settings(max_examples=400)
@given(st.text("ab/*", max_size=4), st.text("ab/*", max_size=4))
def test_containment_and_overlap_are_exact(small, big):
    """``within`` and ``meets`` against the sets of topics the two patterns match. The
    patterns are at most 4 characters, so a topic of up to 6 tells them apart."""
    mine, theirs = topics_of(small), topics_of(big)
    small_shape = Template.of((small,)).shape()
    big_shape = Template.of((big,)).shape()
    assert (small_shape is None) is (not mine)
    assert (big_shape is None) is (not theirs)
    if small_shape is None or big_shape is None:
        return
    assert small_shape.within(big_shape) is (mine <= theirs), (small, big)
    assert small_shape.meets(big_shape) is bool(mine & theirs), (small, big)


def test_shapes_of_examples():
    assert Template.of(("",)).shape() is EVERYTHING
    assert Template.of(("a*b",)).shape() is None
    assert Template.of(("a/**",)).shape() is None
    shape = Template.of(("chat/*/",)).shape()
    assert shape is not None
    assert Template.of(("chat/room/x",)).shape().within(shape)
    assert not Template.of(("chat/room",)).shape().within(shape)
    assert EVERYTHING.meets(shape) and not EVERYTHING.within(shape)


def test_an_identity_with_wildcards_stays_literal_in_a_shape():
    template = Template.of(("users/", None, "/"))
    own = template.shape("x*")
    assert own is not None
    # the literal "x*" segment is not the wildcard "x*": users/xy/ is someone else's
    assert own.segments[1].stem == "x*" and not own.segments[1].prefix
    assert not Template.of(("users/x*/inbox",)).shape().within(own)
    assert not Template.of(("users/xy/inbox",)).shape().within(own)
    assert not Template.of(("users/*/",)).shape().within(own)
    assert Template.of(("users/x*/inbox",)).shape().meets(own)  # the topic users/x*/inbox


def test_alternatives_share_one_expression():
    compiled = compile_alternatives(
        [Template.of(("a/",)).regex(), Template.of(("own/", None)).regex()]
    )
    assert compiled is not None and isinstance(compiled, re.Pattern)
    assert compiled.match("bob\0a/x")
    assert compiled.match("bob\0own/bob")
    assert not compiled.match("bob\0own/alice")
    assert compile_alternatives([]) is None
