"""Wildcard topic subscriptions: :class:`PatternIndex` finds every subscriber with a pattern
that matches a topic without trying each pattern in turn.

The rules are sbus's (``msgbroker.plugins.sbus.patterns.matches``), applied to the broker's
str topics (an sbus key maps to ``key.decode("utf-8", "surrogateescape")``):

- ``*`` matches the rest of a ``/``-separated segment and never backtracks, so a segment of
  a pattern is either exact (``ab``), a prefix (``ab*``, ``ab**``: every segment starting
  with ``ab``), or never matches (``a*b``: the ``*`` has eaten the ``b``);
- a ``*`` that meets the end of the topic matches nothing (the reference server does so,
  DECISIONS.md), while one followed by a ``/`` may match zero bytes: so a prefix that is
  the pattern's last segment (``ab*``, no ``/`` after it) needs a topic segment longer than
  ``ab``, and one ending in ``**`` there never matches (its second ``*`` meets the end);
- a pattern ending in ``/`` matches keys with at least one segment more, otherwise the
  segment counts must be equal;
- the empty pattern matches every topic but a secret one;
- a secret topic (``!/cred/...``) matches only patterns of the full form
  ``!/cred/<gid>/<uid>/<pid>/...`` with three non-empty decimal fields.

So the index is a trie over segments, one for ordinary patterns and one for the full secret
patterns, and a secret topic looks in the second only. Results are memoized per topic: a
publish on a topic seen before costs one dict lookup.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Generic, TypeVar

from attrs import define, field

P = TypeVar("P")  # hashable: peers are dict keys

#: topics starting with this are secret
CRED_PREFIX = "!/cred/"
_SECRET = re.compile(r"!/cred/[0-9]+/[0-9]+/[0-9]+/.*", re.DOTALL)
#: when the cache holds this many topics it is emptied before the next one goes in
CACHE_LIMIT = 4096
#: a lone byte that is not UTF-8, as surrogateescape decodes it
_ESCAPES = ("\udc80", "\udcff")


@define(eq=False)
class _Node(Generic[P]):
    """The patterns that share their first segments. Counts: a peer may subscribe to one
    pattern twice, and ``a*`` and ``a**`` file under the same prefix."""

    exact: dict[str, _Node[P]] = field(factory=dict)
    #: ``stem*`` segments by stem
    prefix: dict[str, _Node[P]] = field(factory=dict)
    #: patterns ending here: the topic must end here too
    ends: dict[P, int] = field(factory=dict)
    #: patterns ending here with a ``/``: the topic must go on
    below: dict[P, int] = field(factory=dict)

    def __bool__(self) -> bool:
        return bool(self.exact or self.prefix or self.ends or self.below)


def _starts(segment: str, stem: str) -> bool:
    """Whether ``segment`` starts with ``stem`` as the keys' bytes would. A stem ending in a
    surrogate escape is a cut UTF-8 sequence (``b"\\xc3*"``) that the topic may complete
    (``é``), so that one compares encoded."""
    if segment.startswith(stem):
        return True
    if not stem or not _ESCAPES[0] <= stem[-1] <= _ESCAPES[1]:
        return False
    try:
        raw = segment.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # no key has this topic
        return False
    return raw.startswith(stem.encode("utf-8", "surrogateescape"))


def _parse(pattern: str) -> tuple[list[tuple[bool, str]], bool] | None:
    """``([(is_prefix, text) per segment], ends_with_slash)`` of a non-empty pattern, or
    None when no topic can match it."""
    trailing = pattern.endswith("/")
    segments = (pattern[:-1] if trailing else pattern).split("/")
    if not trailing and segments[-1].endswith("**"):
        return None  # the first * eats the topic's last segment, the second meets its end
    steps = []
    for segment in segments:
        stem = segment.rstrip("*")
        if "*" in stem:
            return None
        steps.append((stem != segment, stem))
    return steps, trailing


@define(eq=False)
class PatternIndex(Generic[P]):
    """Subscribers (``P``: anything hashable, a session) and their topic patterns."""

    _by_peer: dict[P, list[str]] = field(factory=dict, init=False)
    #: stored subscriptions (see ``__len__``): a plain attribute, so that the hub's test
    #: for "any pattern at all?" on every message costs no call
    count: int = field(default=0, init=False)
    #: empty patterns: every topic but a secret one
    _everything: dict[P, int] = field(factory=dict, init=False)
    _plain: _Node[P] = field(factory=_Node, init=False)
    _secret: _Node[P] = field(factory=_Node, init=False)
    _cache: dict[str, dict[P, None]] = field(factory=dict, init=False)

    def __len__(self) -> int:
        """Stored subscriptions, copies and never-matching patterns included."""
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def count_of(self, peer: P) -> int:
        """How many patterns ``peer`` holds (a pattern held twice counts twice)."""
        patterns = self._by_peer.get(peer)
        return len(patterns) if patterns else 0

    def patterns_of(self, peer: P) -> list[str]:
        """``peer``'s patterns in subscription order (a copy)."""
        return list(self._by_peer.get(peer, ()))

    def add(self, peer: P, pattern: str) -> None:
        """Subscribe ``peer`` to ``pattern`` once more (twice is stored twice)."""
        self._by_peer.setdefault(peer, []).append(pattern)
        self.count += 1
        self._file(peer, pattern, +1)

    def remove(self, peer: P, pattern: str) -> bool:
        """Take one copy of ``pattern`` from ``peer``; False when it had none."""
        patterns = self._by_peer.get(peer)
        if patterns is None or pattern not in patterns:
            return False
        patterns.remove(pattern)
        if not patterns:
            del self._by_peer[peer]
        self.count -= 1
        self._file(peer, pattern, -1)
        return True

    def remove_all(self, peer: P) -> bool:
        """Forget every pattern of ``peer`` (it closed); False when it had none."""
        patterns = self._by_peer.pop(peer, [])
        for pattern in patterns:
            self.count -= 1
            self._file(peer, pattern, -1)
        return bool(patterns)

    def match(self, topic: str) -> Mapping[P, None]:
        """Every peer with a pattern matching ``topic``, once each, in a stable order
        (the empty pattern's first, in subscription order, then the trie's).

        The mapping is the cached one, shared with later calls until the next change:
        callers must not mutate it.
        """
        found = self._cache.get(topic)
        if found is not None:
            return found
        if topic.startswith(CRED_PREFIX):
            found = {}
            _collect(self._secret, topic.split("/"), found)
        else:
            found = dict.fromkeys(self._everything)
            _collect(self._plain, topic.split("/"), found)
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[topic] = found
        return found

    def _file(self, peer: P, pattern: str, change: int) -> None:
        """Count one copy of ``pattern`` in (+1) or out (-1), pruning emptied nodes."""
        self._cache.clear()
        if not pattern:
            _count(self._everything, peer, change)
            return
        parsed = _parse(pattern)
        if parsed is None:  # kept in _by_peer only: nothing to find it by
            return
        steps, trailing = parsed
        node = self._secret if _SECRET.fullmatch(pattern) else self._plain
        path: list[tuple[dict[str, _Node[P]], str, _Node[P]]] = []
        for is_prefix, text in steps:
            table = node.prefix if is_prefix else node.exact
            child = table.get(text)
            if child is None:
                child = table[text] = _Node()
            path.append((table, text, child))
            node = child
        _count(node.below if trailing else node.ends, peer, change)
        for table, text, child in reversed(path):
            if child:
                break
            del table[text]


def _count(counts: dict[P, int], peer: P, change: int) -> None:
    left = counts.get(peer, 0) + change
    if left:
        counts[peer] = left
    else:
        del counts[peer]


def _collect(root: _Node[P], segments: list[str], found: dict[P, None]) -> None:
    """Add to ``found`` the peers of the patterns under ``root`` matching ``segments``."""
    nodes = [root]
    last = len(segments) - 1
    for at, segment in enumerate(segments):
        following: list[_Node[P]] = []
        for node in nodes:
            found.update(dict.fromkeys(node.below))
            child = node.exact.get(segment)
            if child is not None:
                following.append(child)
            for stem, child in node.prefix.items():
                # in the topic's last segment only ``ends`` is looked at after this, and a
                # pattern ending in ``stem*`` there needs its * to eat at least one byte
                if _starts(segment, stem) and (at < last or segment != stem):
                    following.append(child)
        if not following:
            return
        nodes = following
    for node in nodes:
        found.update(dict.fromkeys(node.ends))
