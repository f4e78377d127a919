"""The ACL compiled for deciding fast: :class:`Policy` (a file's rules, each block's
patterns as one regular expression per action) and :class:`Grants` (what one identity,
with its certificate names, may do; decisions remembered). Pure, no Twisted.

Which rules apply to a session: its ``user`` block (exact name), every ``user NAME*``
block its identity starts with (not for the anonymous identity), the ``cert`` block of each
name its verified client certificate proves, and every ``pattern`` rule (those using
``%u``/``%c`` not for the anonymous identity, which is nobody in particular: as
Mosquitto's patterns skip clients without a username); the anonymous identity ``.`` has the
rules before the first ``user`` or ``cert`` line. A request is refused when a ``deny``
rule among them matches, else allowed when an allowing rule matches, else refused: an ACL
allows nothing it does not say.

Cost: the blocks are compiled once per file (a block's rules for one action are one
regular expression, whatever the identity: see :mod:`.patterns`); a session's
:class:`Grants` are found at its first request (a dict lookup per name) and shared by every
session of the same identity and names; each (action, topic) is decided once and then
looked up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from attrs import define, field, frozen

from .patterns import SEPARATOR, Template, compile_alternatives
from .rules import ACTIONS, ANONYMOUS, AclRules, Rule

#: protocols whose subscriptions are patterns, not topics (``msgbroker_authorize`` gets
#: the pattern): sbus. Their subscribe is allowed when one allowed pattern contains the
#: subscription's and no denied one overlaps it.
PATTERN_SUBSCRIBERS = frozenset({"sbus"})
#: decisions remembered per Grants, and Grants per Policy, before starting again
CACHE_LIMIT = 4096
_TOPIC_ACTIONS = tuple(action for action in ACTIONS if action != "broadcast")


@frozen
class Block:
    """Rules of one ``user``, ``cert`` or anonymous block (or the ``pattern`` rules),
    compiled: per action, one expression for the denied topics and one for the allowed
    (matched against ``identity + "\\0" + topic``), and the templates for subscription
    patterns."""

    deny: dict[str, re.Pattern[str] | None]
    allow: dict[str, re.Pattern[str] | None]
    deny_templates: tuple[Template, ...]
    allow_templates: tuple[Template, ...]
    broadcast_denied: bool
    broadcast_allowed: bool

    @classmethod
    def of(cls, rules: Iterable[Rule]) -> Block:
        rules = tuple(rules)
        deny: dict[str, re.Pattern[str] | None] = {}
        allow: dict[str, re.Pattern[str] | None] = {}
        for action in _TOPIC_ACTIONS:
            for denied, table in ((True, deny), (False, allow)):
                table[action] = compile_alternatives(
                    [
                        rule.template.regex()
                        for rule in rules
                        if rule.deny is denied
                        and action in rule.actions
                        and rule.template is not None
                    ]
                )

        def templates(denied: bool) -> tuple[Template, ...]:
            return tuple(
                rule.template
                for rule in rules
                if rule.deny is denied and "subscribe" in rule.actions and rule.template is not None
            )

        def broadcast(denied: bool) -> bool:
            return any(rule.deny is denied and "broadcast" in rule.actions for rule in rules)

        return cls(deny, allow, templates(True), templates(False), broadcast(True),
                   broadcast(False))  # fmt: skip


class Policy:
    """A loaded ACL file, compiled (once, when it is loaded: a reload makes a new one)."""

    def __init__(self, rules: AclRules) -> None:
        self.rules = rules
        self.anonymous = Block.of(rules.anonymous)
        self.users = {name: Block.of(block) for name, block in rules.users.items()}
        self.user_prefixes = {stem: Block.of(block) for stem, block in rules.user_prefixes.items()}
        self.certs = {name: Block.of(block) for name, block in rules.certs.items()}
        self.plain_patterns = Block.of(r for r in rules.patterns if not _templated(r))
        self.identity_patterns = Block.of(r for r in rules.patterns if _templated(r))
        self._grants: dict[tuple[str, frozenset[str] | None, bool], Grants] = {}

    def grants(
        self, identity: str, names: frozenset[str] | None = None, patterns: bool = False
    ) -> Grants:
        """What ``identity`` may do, with the names its client certificate proves
        (``names``), subscribing with patterns (``patterns``: sbus) or to topics."""
        key = (identity, names, patterns)
        found = self._grants.get(key)
        if found is None:
            if len(self._grants) >= CACHE_LIMIT:
                self._grants.clear()
            found = self._grants[key] = Grants(self, identity, self._blocks(identity, names),
                                               patterns)  # fmt: skip
        return found

    def _blocks(self, identity: str, names: frozenset[str] | None) -> tuple[Block, ...]:
        if SEPARATOR in identity:
            return ()  # it would move the separator the expressions rely on: nothing allowed
        if identity == ANONYMOUS:
            return (self.anonymous, self.plain_patterns)
        blocks = []
        own = self.users.get(identity)
        if own is not None:
            blocks.append(own)
        blocks += [block for stem, block in self.user_prefixes.items() if identity.startswith(stem)]
        for name in sorted(names or ()):
            block = self.certs.get(name)
            if block is not None:
                blocks.append(block)
        return (*blocks, self.plain_patterns, self.identity_patterns)


def _templated(rule: Rule) -> bool:
    return rule.template is not None and rule.template.uses_identity


@define(eq=False)
class Grants:
    """What one identity may do (with its certificate names): :meth:`allows`, decided
    once per (action, topic)."""

    policy: Policy
    identity: str
    blocks: tuple[Block, ...]
    #: subscriptions are patterns (sbus): a subscribe's topic is a pattern
    patterns: bool = False
    _decided: dict[tuple[str, str | None], bool] = field(factory=dict, init=False)

    def allows(self, action: str, topic: str | None) -> bool:
        """May this identity do ``action`` (publish, subscribe, unicast, broadcast) on
        ``topic`` (the topic; the target identity for unicast; a pattern for a
        pattern subscriber's subscribe; ``None`` for broadcast)? An unknown action is
        refused."""
        key = (action, topic)
        found = self._decided.get(key)
        if found is None:
            if len(self._decided) >= CACHE_LIMIT:
                self._decided.clear()
            found = self._decided[key] = self._decide(action, topic)
        return found

    def _decide(self, action: str, topic: str | None) -> bool:
        blocks = self.blocks
        if action == "broadcast":
            if any(block.broadcast_denied for block in blocks):
                return False
            return any(block.broadcast_allowed for block in blocks)
        if topic is None or action not in _TOPIC_ACTIONS:
            return False
        if action == "subscribe" and self.patterns:
            return self._covers(topic)
        subject = self.identity + SEPARATOR + topic
        for block in blocks:
            denied = block.deny[action]
            if denied is not None and denied.match(subject):
                return False
        for block in blocks:
            allowed = block.allow[action]
            if allowed is not None and allowed.match(subject):
                return True
        return False

    def _covers(self, pattern: str) -> bool:
        """A subscription to ``pattern``: contained in an allowed pattern, and meeting no
        denied one (a pattern that matches no topic is contained in every pattern)."""
        wanted = Template.of((pattern,)).shape()
        identity = self.identity
        if wanted is not None:
            for block in self.blocks:
                for template in block.deny_templates:
                    denied = template.shape(identity)
                    if denied is not None and wanted.meets(denied):
                        return False
        for block in self.blocks:
            for template in block.allow_templates:
                allowed = template.shape(identity)
                if allowed is not None and (wanted is None or wanted.within(allowed)):
                    return True
        return False
