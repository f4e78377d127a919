"""The ACL file, parsed: Mosquitto's ``acl_file`` format adapted to the broker's four
actions and its identities (docs/operations.md, "Access control"). Pure: text in,
:class:`AclRules` or a :class:`~msgbroker.errors.ConfigError` naming the line out; no
Twisted, no clock.

::

    # before any user or cert line: the anonymous identity (.)
    topic write public/announcements
    user alice                   # alice's rules, up to the next user or cert line
    topic readwrite chat/        # publish and subscribe to chat/ and everything below
    topic deny chat/admin/       # ... but not there, whatever else allows it
    topic unicast bob            # unicast to the identity bob
    topic broadcast              # broadcast (no topic)
    user sbus:1000:*             # every sbus client of uid 1000
    topic read sensors/
    cert device-17.example.com   # sessions whose client certificate proves this name
    topic publish sensors/17/
    pattern publish users/%u/    # everyone (but anonymous sessions): %u is the identity

A rule is ``topic [deny] [ACCESS] TOPIC``; ACCESS is ``read`` (subscribe), ``write``
(publish), ``readwrite`` (both, the default), ``publish``, ``subscribe``, ``unicast``
(TOPIC is then the target identity) or ``broadcast`` (no TOPIC), or several of them joined
by commas. TOPIC is the rest of the line, an sbus-style pattern (:mod:`.patterns`), or a
JSON string (``"..."``) for one with spaces at its ends, or the empty pattern ``""``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from attrs import frozen

from msgbroker.errors import ConfigError

from .patterns import Template

#: the actions of ``msgbroker_authorize``
ACTIONS = ("publish", "subscribe", "unicast", "broadcast")
#: what an ACCESS word grants (or, after ``deny``, refuses)
ACCESS: Mapping[str, frozenset[str]] = {
    "read": frozenset({"subscribe"}),
    "write": frozenset({"publish"}),
    "readwrite": frozenset({"publish", "subscribe"}),
    **{action: frozenset({action}) for action in ACTIONS},
}
DEFAULT_ACCESS = ACCESS["readwrite"]
#: the anonymous identity: the rules before any ``user`` or ``cert`` line are its own
ANONYMOUS = "."
_ACCESS_WORDS = re.compile(r"[a-z]+(?:,[a-z]+)*")
_IDENTITY = re.compile(r"%[uc]")
#: what separates words (anything else, tabs in a topic too, is part of a word)
_BLANK = " \t\r"
_WORD = re.compile(r"([^ \t\r]*)[ \t\r]*(.*)", re.DOTALL)


@frozen
class Rule:
    """One ``topic`` or ``pattern`` line: ``actions`` allowed (or, ``deny``, refused) on
    the topics ``template`` matches; ``template`` is ``None`` for broadcast, which has
    no topic."""

    line: int
    deny: bool
    actions: frozenset[str]
    template: Template | None


@frozen
class AclRules:
    """What an ACL file says. ``users`` and ``certs`` hold each name's rules;
    ``user_prefixes`` the rules of ``user NAME*`` lines (every identity starting with
    NAME); ``patterns`` apply to every session."""

    source: str
    anonymous: tuple[Rule, ...] = ()
    users: Mapping[str, tuple[Rule, ...]] = {}
    user_prefixes: Mapping[str, tuple[Rule, ...]] = {}
    certs: Mapping[str, tuple[Rule, ...]] = {}
    patterns: tuple[Rule, ...] = ()

    @property
    def count(self) -> int:
        """How many rules the file holds."""
        blocks = (*self.users.values(), *self.user_prefixes.values(), *self.certs.values())
        return len(self.anonymous) + len(self.patterns) + sum(map(len, blocks))


class _LineError(Exception):
    """What is wrong with one line (the parser adds where)."""


def load_acl(path: str) -> AclRules:
    """Read and parse the ACL file at ``path``; :class:`ConfigError` says what is wrong
    (and on which line)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the ACL file {path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"ACL file {path} line {line}: not UTF-8 text") from None
    return parse_acl(text, f"ACL file {path}")


def parse_acl(text: str, source: str = "ACL") -> AclRules:
    """Parse an ACL file's text; ``source`` names it in errors (``SOURCE line N: ...``)."""
    reading = _Reading()
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(_BLANK)
        if not line or line.startswith("#"):
            continue
        try:
            reading.line(number, *_first(line))
        except _LineError as e:
            raise ConfigError(f"{source} line {number}: {e}") from None
    return AclRules(
        source,
        tuple(reading.anonymous),
        {name: tuple(rules) for name, rules in reading.users.items()},
        {name: tuple(rules) for name, rules in reading.prefixes.items()},
        {name: tuple(rules) for name, rules in reading.certs.items()},
        tuple(reading.patterns),
    )


class _Reading:
    """The rules read so far, and the block ``topic`` lines go to."""

    def __init__(self) -> None:
        self.anonymous: list[Rule] = []
        self.users: dict[str, list[Rule]] = {}
        self.prefixes: dict[str, list[Rule]] = {}
        self.certs: dict[str, list[Rule]] = {}
        self.patterns: list[Rule] = []
        self.block = self.anonymous

    def line(self, number: int, keyword: str, rest: str) -> None:
        if keyword == "user":
            name = _name(rest, "user")
            if name == ANONYMOUS:
                self.block = self.anonymous
            elif name.endswith("*"):
                self.block = self.prefixes.setdefault(name[:-1], [])
            else:
                self.block = self.users.setdefault(name, [])
        elif keyword == "cert":
            self.block = self.certs.setdefault(_name(rest, "cert"), [])
        elif keyword == "topic":
            self.block.append(_rule(rest, number, templated=False))
        elif keyword == "pattern":
            self.patterns.append(_rule(rest, number, templated=True))
        else:
            raise _LineError(
                f"unknown keyword {keyword[:40]!r} (a line is user, cert, topic or pattern)"
            )


def _first(text: str) -> tuple[str, str]:
    """The first word of ``text`` and the rest, without the blanks between or after."""
    found = _WORD.fullmatch(text)
    assert found is not None  # every text matches
    return found[1], found[2].rstrip(_BLANK)


def _name(text: str, keyword: str) -> str:
    if not text:
        raise _LineError(f"{keyword} needs a name")
    return _text(text, f"{keyword} name")


def _text(text: str, what: str) -> str:
    """``text`` as written, or the JSON string it is when it starts with a quote."""
    if text.startswith('"'):
        try:
            value = json.loads(text)
        except ValueError:
            raise _LineError(f"bad quoted {what} {text[:60]}: not a JSON string") from None
        if not isinstance(value, str):
            raise _LineError(f"bad quoted {what} {text[:60]}: not a JSON string")
        text = value
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _LineError(f"the {what} {text[:60]!r} is not text (a lone surrogate)") from None
    return text


def _rule(text: str, number: int, templated: bool) -> Rule:
    deny = False
    word, rest = _first(text)
    if word == "deny":
        deny = True
        text = rest
        word, rest = _first(text)
    actions = DEFAULT_ACCESS
    if _ACCESS_WORDS.fullmatch(word):
        words = word.split(",")
        if any(w in ACCESS for w in words):
            unknown = [w for w in words if w not in ACCESS]
            if unknown:
                raise _LineError(
                    f"unknown access {unknown[0][:40]!r} (read, write, readwrite, "
                    "publish, subscribe, unicast, broadcast)"
                )
            actions = frozenset().union(*(ACCESS[w] for w in words))
            text = rest
    if "broadcast" in actions:
        if actions != ACCESS["broadcast"]:
            raise _LineError("broadcast has no topic: give it a line of its own")
        if text:
            raise _LineError(f"broadcast takes no topic, not {text[:60]!r}")
        return Rule(number, deny, actions, None)
    if not text:
        raise _LineError("the topic is missing")
    topic = _text(text, "topic")
    if templated:
        pieces = _IDENTITY.split(topic)
        parts: list[str | None] = [pieces[0]]
        for piece in pieces[1:]:
            parts += [None, piece]
        template = Template.of(tuple(parts))
    else:
        template = Template.of((topic,))
    # an identity without * or /, as most are, shows what the pattern is made of
    if template.shape("x") is None:
        raise _LineError(
            f"the pattern {topic[:60]!r} matches no topic: a * takes the rest of its "
            "segment (it must end it), and ** cannot end the pattern"
        )
    return Rule(number, deny, actions, template)
