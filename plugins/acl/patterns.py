"""The ACL's topic patterns: sbus's pattern rules (docs/sbus.md, ``framework/patterns.py``)
on the broker's topics, with ``%u`` standing for the identity asking. Sans-IO, no Twisted.

A pattern is written as a :class:`Template`: text and the places where the identity goes
in. Two views of it serve the two questions the ACL asks:

- **does it match a topic?** :meth:`Template.regex` is one regular expression for every
  identity: it is matched against ``identity + "\\0" + topic``, the identity captured by
  the group ``u`` and compared with ``(?P=u)`` where ``%u`` stands. So a block of rules is
  one compiled expression, made when the file is loaded, and nothing is compiled per
  identity at login. (An identity holding a NUL would move the separator: the ACL refuses
  such identities everything, see :mod:`.policy`.)
- **does it cover a subscription pattern?** An sbus client subscribes with a pattern, not a
  topic: the ACL allows it when one allowed rule's pattern *contains* it (every topic it can
  match, the rule matches) and no denied rule's pattern *overlaps* it (no topic matches
  both). :class:`Shape` is a pattern as its segments, for those two tests.

The rules, as sbus has them: ``*`` matches the rest of a ``/``-separated segment and never
backtracks, so it must end its segment (``a*b`` matches nothing); a ``*`` that meets the
end of the topic matches nothing, so ``ab*`` as the last segment needs a segment longer
than ``ab``; a pattern ending in ``/`` matches that ``/`` and anything after it (at least
one more segment); otherwise the segment counts must be equal; the empty pattern matches
every topic. Unlike sbus subscriptions, secret topics (``!/cred/...``) are matched like
any other: which subscribers *receive* a secret topic is the hub's rule, whatever the ACL
says, and an ACL rule only ever narrows what a session may do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from attrs import frozen

#: the separator between the identity and the topic in the string the regex matches
SEPARATOR = "\0"
#: how a regex body starts: the identity, captured, then the separator
IDENTITY_PREFIX = r"(?P<u>[^\x00]*)\x00"


@frozen
class Template:
    """A pattern as written: ``parts`` alternate text and ``None``, where the identity of
    the session asking goes (``%u`` or ``%c`` in a ``pattern`` line)."""

    parts: tuple[str | None, ...]

    @classmethod
    def of(cls, parts: tuple[str | None, ...]) -> Template:
        """A template of ``parts``, empty texts left out."""
        return cls(tuple(part for part in parts if part != ""))

    @property
    def empty(self) -> bool:
        """The empty pattern: every topic."""
        return not self.parts

    @property
    def uses_identity(self) -> bool:
        return None in self.parts

    def __str__(self) -> str:
        return "".join("%u" if part is None else part for part in self.parts)

    def _tokens(self, identity: str | None) -> Iterator[tuple[str, bool]]:
        """``(character, is_wildcard)``: the template's ``*`` are wildcards, the
        identity's characters never are."""
        for part in self.parts:
            if part is None:
                for char in identity or "":
                    yield char, False
            else:
                for char in part:
                    yield char, char == "*"

    def ends_below(self) -> bool:
        """Whether the template's own text ends in ``/`` (an identity's ``/`` is literal)."""
        last = self.parts[-1] if self.parts else None
        return isinstance(last, str) and last.endswith("/")

    def regex(self) -> str:
        """The body of a regular expression matching, after :data:`IDENTITY_PREFIX`, the
        topics this pattern matches for the identity captured there (``re.DOTALL``)."""
        if self.empty:
            return r".*\Z"
        pieces: list[str] = []
        last_part = len(self.parts) - 1
        for index, part in enumerate(self.parts):
            if part is None:
                pieces.append("(?P=u)")
                continue
            for at, char in enumerate(part):
                if char == "*":
                    # something is left (a * meeting the end matches nothing), then the rest
                    # of the segment, possessively: a * never gives back what it took
                    pieces.append(r"(?=.)[^/]*+")
                elif char == "/" and index == last_part and at == len(part) - 1:
                    return "".join(pieces) + r"/.*\Z"
                else:
                    pieces.append(re.escape(char))
        return "".join(pieces) + r"\Z"

    def shape(self, identity: str | None = None) -> Shape | None:
        """This pattern for ``identity`` as segments, or ``None`` when it matches no topic."""
        if self.empty:
            return EVERYTHING
        tokens = list(self._tokens(identity))
        below = self.ends_below()
        if below:
            tokens.pop()
        segments: list[list[tuple[str, bool]]] = [[]]
        for char, wild in tokens:
            if char == "/" and not wild:
                segments.append([])
            else:
                segments[-1].append((char, wild))
        shaped = []
        for number, segment in enumerate(segments):
            stem = ""
            stars = 0
            for char, wild in segment:
                if wild:
                    stars += 1
                elif stars:
                    return None  # a * took the rest of the segment: nothing is left for this
                else:
                    stem += char
            last = number == len(segments) - 1 and not below
            if stars > 1 and last:
                return None  # the second * meets the end of the topic
            shaped.append(Segment(stem, prefix=stars > 0, longer=stars > 0 and last))
        return Shape(tuple(shaped), below)


@frozen
class Segment:
    """One ``/``-separated segment of a pattern: exactly ``stem``, or (``prefix``) ``stem``
    and anything without a ``/`` after it, at least one character more when ``longer``
    (a ``*`` that would meet the end of the topic)."""

    stem: str
    prefix: bool = False
    longer: bool = False

    @property
    def least(self) -> int:
        """The shortest segment this matches."""
        return len(self.stem) + self.longer

    def within(self, other: Segment) -> bool:
        """Whether every segment this one matches, ``other`` matches."""
        if not other.prefix:
            return not self.prefix and self.stem == other.stem
        return self.stem.startswith(other.stem) and self.least >= other.least

    def meets(self, other: Segment) -> bool:
        """Whether some segment matches both."""
        if self.prefix and other.prefix:
            return self.stem.startswith(other.stem) or other.stem.startswith(self.stem)
        if not self.prefix and not other.prefix:
            return self.stem == other.stem
        exact, prefix = (other, self) if self.prefix else (self, other)
        return exact.stem.startswith(prefix.stem) and len(exact.stem) >= prefix.least


@frozen
class Shape:
    """A pattern as segments; ``below``: it ends in ``/`` (at least one segment more, any).
    ``segments is None`` is the empty pattern, which matches every topic."""

    segments: tuple[Segment, ...] | None
    below: bool = False

    def within(self, other: Shape) -> bool:
        """Whether every topic this matches, ``other`` matches."""
        if other.segments is None:
            return True
        if self.segments is None:
            return False
        mine, theirs = self.segments, other.segments
        if not other.below:
            if self.below or len(mine) != len(theirs):
                return False
        elif len(mine) < len(theirs) + (not self.below):
            return False
        return all(a.within(b) for a, b in zip(mine, theirs, strict=False))

    def meets(self, other: Shape) -> bool:
        """Whether some topic matches both."""
        if self.segments is None or other.segments is None:
            return True
        mine, theirs = self.segments, other.segments
        if self.below and other.below:
            pass
        elif self.below:
            if len(theirs) < len(mine) + 1:
                return False
        elif other.below:
            if len(mine) < len(theirs) + 1:
                return False
        elif len(mine) != len(theirs):
            return False
        return all(a.meets(b) for a, b in zip(mine, theirs, strict=False))


#: the empty pattern
EVERYTHING = Shape(None)


def compile_alternatives(bodies: list[str]) -> re.Pattern[str] | None:
    """One expression matching ``identity + "\\0" + topic`` when any of the regex bodies
    (:meth:`Template.regex`) does; ``None`` for none."""
    if not bodies:
        return None
    alternatives = "|".join(f"(?:{body})" for body in dict.fromkeys(bodies))
    return re.compile(IDENTITY_PREFIX + f"(?:{alternatives})", re.DOTALL)
