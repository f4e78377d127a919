"""PatternIndex (framework/patterns.py): the sbus pattern rules on str topics, found through a
trie, must give exactly the peers that checking every pattern with sbus's ``matches`` would,
through adds, removals and the result cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from msgbroker.patterns import CACHE_LIMIT, PatternIndex
from msgbroker.plugins.sbus.patterns import key_to_topic, matches, topic_to_key


def matched(pattern: str, topic: str) -> bool:
    return matches(topic_to_key(pattern), topic_to_key(topic))


def one(pattern: str) -> PatternIndex[str]:
    index: PatternIndex[str] = PatternIndex()
    index.add("p", pattern)
    return index


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a/*/c/", "a/b/c/", True),
        ("a/*/c/", "a/b/c/d/e", True),
        ("a/*/c/", "a/b/c", False),
        ("a/*/c/", "a/c/d", False),
        ("a*b", "ab", False),  # the * eats the b
        ("a*b", "axb", False),
        ("a*b", "a*b", False),
        ("a/*/c", "a//c", True),
        ("a/*/c", "a/b/c/", False),
        ("*", "abc", True),
        ("*", "a/b", False),
        # a * that meets the end of the key matches nothing (docs/sbus.md, the reference)
        ("*", "", False),
        ("a*", "a", False),
        ("a*", "ab", True),
        ("a/*", "a/", False),
        ("a/*", "a/b", True),
        ("**", "abc", False),  # the second * meets the end
        ("a**", "abc", False),
        ("a**", "bc", False),
        ("**/", "a/b", True),  # the second * is followed by a /: zero bytes
        ("a/**/c", "a/b/c", True),
        ("a*/", "a/x", True),
        ("*/", "/x", True),
        ("*/", "/", True),
        ("*/*", "/", False),
        ("a/*/", "a//", True),
        ("*/", "a/b", True),
        ("*/", "a/", True),
        ("*/", "a", False),
        ("/", "/x", True),
        ("/", "x/", False),
        ("a", "a", True),
        ("a", "ab", False),
        ("ab", "a", False),
        ("a*", "ab/c", False),
        ("", "", True),
        ("", "a/b/c", True),
        ("", "!/credx", True),  # not secret: no slash after cred
        ("!/cre*/x", "!/crex/x", True),
        ("\udcc3*", "é", True),  # b"\xc3*" matches b"\xc3\xa9"
        ("\udcc3", "é", False),
    ],
)
def test_documented_examples(pattern, topic, expected):
    assert matched(pattern, topic) is expected  # the reference agrees
    assert ("p" in one(pattern).match(topic)) is expected


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("!/cred/1/2/3/x", "!/cred/1/2/3/x", True),
        ("!/cred/1/2/3/x", "!/cred/1/2/3/y", False),
        ("!/cred/1/2/3/", "!/cred/1/2/3/x/y", True),
        ("!/cred/1/2/3/", "!/cred/1/2/3", False),
        ("!/cred/1/2/3/*", "!/cred/1/2/3/abc", True),
        ("!/cred/1/2/3/*", "!/cred/1/2/4/abc", False),
        ("!/cred/1/2/3/*", "!/cred/1/2/3/", False),  # the * meets the end
        ("!/cred/1/2/3/x", "a", False),
        # never a secret topic for anything short of the full form
        ("", "!/cred/1/2/3/x", False),
        ("*", "!/cred/", False),
        ("*/", "!/cred/1/2/3/x", False),
        ("!/*/1/2/3/x", "!/cred/1/2/3/x", False),
        ("!/cred/", "!/cred/1/2/3/x", False),
        ("!/cred/1/2/", "!/cred/1/2/3/x", False),
        ("!/cred//2/3/", "!/cred//2/3/x", False),  # empty fields are not given ones
        ("!/cred/*/2/3/x", "!/cred/1/2/3/x", False),
        ("!/cred/1/2/3", "!/cred/1/2/3", False),
    ],
)
def test_secret_topics(pattern, topic, expected):
    assert matched(pattern, topic) is expected
    assert ("p" in one(pattern).match(topic)) is expected


def test_a_secret_pattern_beside_plain_ones():
    index: PatternIndex[str] = PatternIndex()
    for peer, pattern in [("all", ""), ("star", "*/"), ("cred", "!/cred/1/2/3/"), ("bang", "!/")]:
        index.add(peer, pattern)
    assert list(index.match("!/cred/1/2/3/x")) == ["cred"]
    assert set(index.match("!/x")) == {"all", "star", "bang"}
    assert set(index.match("!/cred")) == {"all", "star", "bang"}  # no slash: not secret


def test_duplicates_are_stored_twice_and_delivered_once():
    index: PatternIndex[str] = PatternIndex()
    index.add("p", "a/*/")
    index.add("p", "a/*/")
    index.add("p", "a/**/")  # the same prefix node
    assert len(index) == 3
    assert index.patterns_of("p") == ["a/*/", "a/*/", "a/**/"]
    assert list(index.match("a/b/c")) == ["p"]
    assert index.remove("p", "a/*/")
    assert index.remove("p", "a/**/")
    assert list(index.match("a/b/c")) == ["p"]  # one copy left
    assert index.patterns_of("p") == ["a/*/"]
    assert index.remove("p", "a/*/")
    assert not index.match("a/b/c")
    assert not index
    assert not index.remove("p", "a/*/")


def test_removing_what_is_not_there():
    index: PatternIndex[str] = PatternIndex()
    assert not index.remove("p", "a")
    index.add("p", "a")
    assert not index.remove("p", "b")
    assert not index.remove("q", "a")
    assert index.patterns_of("p") == ["a"]
    assert list(index.match("a")) == ["p"]


@pytest.mark.parametrize(("pattern", "topic"), [("a*b/c", "ab/c"), ("a/**", "a/b")])
def test_never_matching_patterns_are_stored_and_removable(pattern, topic):
    index: PatternIndex[str] = PatternIndex()
    index.add("p", pattern)
    assert index
    assert len(index) == 1
    assert not index.match(topic)
    assert index.patterns_of("p") == [pattern]
    assert index.remove("p", pattern)
    assert not index
    assert not index._plain


def test_remove_all():
    index: PatternIndex[str] = PatternIndex()
    for pattern in ["", "a", "a/", "a*b", "!/cred/1/2/3/x", "a"]:
        index.add("p", pattern)
    index.add("q", "a")
    assert len(index) == 7
    assert index.remove_all("p")
    assert len(index) == 1
    assert index.patterns_of("p") == []
    assert list(index.match("a")) == ["q"]
    assert not index.match("a/b")
    assert not index.match("!/cred/1/2/3/x")
    assert not index.remove_all("p")  # nothing left: no error
    assert index.remove_all("q")
    assert not index
    assert not index._plain
    assert not index._secret


def test_removal_prunes_the_trie():
    index: PatternIndex[int] = PatternIndex()
    patterns = ["a/b/c", "a/b*/c/", "a/*/*", "!/cred/1/2/3/x/y", "", "/", "a/"]
    for round_ in range(3):
        for peer, pattern in enumerate(patterns):
            index.add(peer + round_, pattern)
    for round_ in range(3):
        for peer, pattern in enumerate(patterns):
            assert index.remove(peer + round_, pattern)
    assert not index._plain
    assert not index._plain.exact
    assert not index._secret
    assert not index._everything
    assert not index._by_peer


def test_the_cache_is_invalidated_by_every_change():
    index: PatternIndex[str] = PatternIndex()
    assert not index.match("a/b")
    index.add("p", "a/*")
    assert list(index.match("a/b")) == ["p"]
    first = index.match("a/b")
    assert index.match("a/b") is first  # cached
    index.add("q", "")
    assert list(index.match("a/b")) == ["q", "p"]  # the empty pattern's first
    index.remove("p", "a/*")
    assert list(index.match("a/b")) == ["q"]
    index.add("p", "a/*")
    index.remove_all("q")
    assert list(index.match("a/b")) == ["p"]


def test_the_cache_is_bounded():
    index: PatternIndex[str] = PatternIndex()
    index.add("p", "*")
    for n in range(CACHE_LIMIT * 2):
        assert list(index.match(str(n))) == ["p"]
    assert len(index._cache) <= CACHE_LIMIT


# -- against the reference ----------------------------------------------------------------------

# bytes, so that topics are what the sbus plugin makes of keys; \xc3\xa9 is é, alone they are
# surrogate escapes
PIECES = [b"a", b"b", b"/", b"*", b"!", b"\xc3", b"\xa9"]
HEADS = [b"", b"", b"", b"!/cred/1/2/3/", b"!/cred/1/2/4/", b"!/cred/", b"!/cred//2/3/"]


@st.composite
def texts(draw: st.DrawFn, size: int = 6) -> str:
    head = draw(st.sampled_from(HEADS))
    body = draw(st.lists(st.sampled_from(PIECES), max_size=size))
    return key_to_topic(head + b"".join(body))


PEERS = st.sampled_from(["p", "q", "r"])


def expected(subscriptions: list[tuple[str, str]], topic: str) -> set[str]:
    return {peer for peer, pattern in subscriptions if matched(pattern, topic)}


@settings(max_examples=300)
@given(st.lists(st.tuples(PEERS, texts()), max_size=12), st.lists(texts(), min_size=1))
def test_match_is_matches_on_every_pattern(subscriptions, topics):
    index: PatternIndex[str] = PatternIndex()
    for peer, pattern in subscriptions:
        index.add(peer, pattern)
    for topic in topics + topics:  # the second time from the cache
        assert set(index.match(topic)) == expected(subscriptions, topic)
        assert len(index.match(topic)) == len(set(index.match(topic)))


class IndexMachine(RuleBasedStateMachine):
    """Adds, removals and matches in any order, against a list of subscriptions."""

    def __init__(self) -> None:
        super().__init__()
        self.index: PatternIndex[str] = PatternIndex()
        self.model: list[tuple[str, str]] = []

    @rule(peer=PEERS, pattern=texts())
    def add(self, peer, pattern):
        self.index.add(peer, pattern)
        self.model.append((peer, pattern))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove_one(self, data):
        peer, pattern = data.draw(st.sampled_from(self.model))
        assert self.index.remove(peer, pattern)
        self.model.remove((peer, pattern))

    @rule(peer=PEERS, pattern=texts())
    def remove_any(self, peer, pattern):
        had = (peer, pattern) in self.model
        assert self.index.remove(peer, pattern) is had
        if had:
            self.model.remove((peer, pattern))

    @rule(peer=PEERS)
    def remove_all(self, peer):
        assert self.index.remove_all(peer) is any(p == peer for p, _ in self.model)
        self.model = [(p, pattern) for p, pattern in self.model if p != peer]

    @rule(topic=texts())
    def match(self, topic):
        found = self.index.match(topic)
        assert set(found) == expected(self.model, topic)
        assert len(found) == len(set(found))

    @invariant()
    def bookkeeping(self):
        assert len(self.index) == len(self.model)
        assert bool(self.index) == bool(self.model)
        for peer in ["p", "q", "r"]:
            assert self.index.patterns_of(peer) == [pat for p, pat in self.model if p == peer]
        if not self.model:
            assert not self.index._plain
            assert not self.index._secret


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
