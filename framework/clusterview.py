"""The replicated view of the other nodes (pure: no Twisted, no I/O, no clock).

Each remote node's state is a set of fields (:mod:`msgbroker.clusterwire`): the members of
its exact topics, its sbus patterns, the identities it holds, its queue groups. The view
keeps them per node and the indexes routing asks about without a round trip: which nodes
have members in a topic (and which of them members outside queue groups), which nodes'
patterns match a topic, who holds an identity, which queue groups a topic has. Applying a change
returns what it means for the local sessions: presence events to tell and identities
claimed, for :class:`msgbroker.cluster.Cluster` to act on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attrs import define, field, frozen

from . import clusterwire as wire
from .patterns import PatternIndex


@frozen
class MemberEvent:
    """A remote member joined (``joined``) or left a topic: a presence event."""

    joined: bool
    topic: str
    identity: str
    protocol: str
    presence: bool


@define
class RemoteNode:
    """One other node: its incarnation (``epoch``), when it was last heard from, its state."""

    name: str
    epoch: str
    last_heard: float
    fields: dict[bytes, bytes] = field(factory=dict)
    #: its state is being read (announcements wait in ``waiting``)
    syncing: bool = False
    waiting: list[tuple[str, Any]] = field(factory=list)


class RemoteView:
    """Every other node's state, and the indexes routing reads."""

    def __init__(self) -> None:
        self.nodes: dict[str, RemoteNode] = {}
        #: topic -> (node, identity) -> (protocol, presence), in the order they joined
        self.members: dict[str, dict[tuple[str, str], tuple[str, bool]]] = {}
        #: topic -> node -> how many of its members are in it
        self.topic_nodes: dict[str, dict[str, int]] = {}
        #: topic -> node -> its members in it that are in no queue group (plain members get
        #: the topic's publications; queue members read their group's store), never 0
        self.plain: dict[str, dict[str, int]] = {}
        self.patterns: PatternIndex[str] = PatternIndex()
        #: identity -> the node holding it (the last to claim it)
        self.identities: dict[str, str] = {}
        #: topic -> queue group -> node -> how many of its members are in the group
        self.queues: dict[str, dict[str, dict[str, int]]] = {}
        #: bumped whenever ``queues`` changes
        self.queue_generation = 0
        #: bumped whenever who receives what changes (a route cache key)
        self.generation = 0

    # -- reading ---------------------------------------------------------------------------

    def pattern_nodes(self, topic: str) -> list[str]:
        """The nodes whose patterns match ``topic``, but that have no member in it."""
        if not self.patterns:
            return []
        exact = self.topic_nodes.get(topic, {})
        return [node for node in self.patterns.match(topic) if node not in exact]

    def pattern_matches(self, topic: str) -> list[str]:
        """Every node with a pattern matching ``topic``."""
        return list(self.patterns.match(topic)) if self.patterns else []

    def plain_nodes(self, topic: str) -> list[str]:
        """The nodes with members in ``topic`` other than queue group members (those get
        the topic's messages through their group's store, not its publications)."""
        counts = self.plain.get(topic)
        return [node for node, count in counts.items() if count > 0] if counts else []

    def plain_members(self, topic: str) -> bool:
        """Whether some node has members in ``topic`` other than queue group members."""
        return any(count > 0 for count in self.plain.get(topic, {}).values())

    def nodes_in(self, topics: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for topic in topics:
            found.update(self.topic_nodes.get(topic, ()))
        return found

    # -- changing --------------------------------------------------------------------------

    def apply(
        self, node: RemoteNode, changes: Iterable[tuple[bytes, bytes | None]]
    ) -> tuple[list[MemberEvent], list[str]]:
        """Apply one node's changes: ``(presence events, identities it claimed)``."""
        events: list[MemberEvent] = []
        claims: list[str] = []
        for key, value in changes:
            old = node.fields.get(key)
            if value is None:
                if old is None:
                    continue
                del node.fields[key]
                self._remove(node.name, key, old, events)
            else:
                node.fields[key] = value
                if old is None:
                    self._add(node.name, key, value, events, claims)
                elif old != value:
                    self._update(node.name, key, value)
        return events, claims

    def replace(
        self, node: RemoteNode, state: Mapping[bytes, bytes]
    ) -> tuple[list[MemberEvent], list[str]]:
        """``node``'s whole state is now ``state``: the differences, as :meth:`apply`."""
        changes: list[tuple[bytes, bytes | None]] = [
            (key, None) for key in node.fields if key not in state
        ]
        changes += [(k, v) for k, v in state.items() if node.fields.get(k) != v]
        return self.apply(node, changes)

    def drop(self, name: str) -> tuple[RemoteNode | None, list[MemberEvent]]:
        """Forget a node (gone): its members' departures."""
        node = self.nodes.pop(name, None)
        if node is None:
            return None, []
        events, _ = self.apply(node, [(key, None) for key in list(node.fields)])
        return node, events

    def _add(
        self, node: str, key: bytes, value: bytes, events: list[MemberEvent], claims: list[str]
    ) -> None:
        what = wire.read_field(key)
        if what is None:
            return
        self.generation += 1
        if what[0] == wire.MEMBER:
            _, topic, identity = what
            protocol, presence = wire.read_member_value(value)
            self.members.setdefault(topic, {})[node, identity] = (protocol, presence)
            counts = self.topic_nodes.setdefault(topic, {})
            counts[node] = counts.get(node, 0) + 1
            self._plain(topic, node, 1)
            events.append(MemberEvent(True, topic, identity, protocol, presence))
        elif what[0] == wire.PATTERN:
            self.patterns.add(node, what[1])
        elif what[0] == wire.QUEUE:
            self._queue_count(node, what[1], what[2], wire.read_queue_value(value))
        else:
            self.identities[what[1]] = node
            claims.append(what[1])

    def _plain(self, topic: str, node: str, delta: int) -> None:
        """``node`` has ``delta`` more plain members in ``topic``: a member joined (+1) or
        left, or joined or left a queue group (its count in the group changed, the other
        way; the two fields of one change may come in either order: a count may be below
        0 for a moment)."""
        counts = self.plain.setdefault(topic, {})
        count = counts.get(node, 0) + delta
        if count:
            counts[node] = count
        else:
            del counts[node]
            if not counts:
                del self.plain[topic]

    def _queue_count(self, node: str, topic: str, group: str, count: int) -> None:
        self.queue_generation += 1
        groups = self.queues.setdefault(topic, {})
        nodes = groups.setdefault(group, {})
        was = nodes.get(node, 0)
        if count != was:
            self._plain(topic, node, was - count)
        if count:
            nodes[node] = count
            return
        nodes.pop(node, None)
        if not nodes:
            del groups[group]
            if not groups:
                del self.queues[topic]

    def _update(self, node: str, key: bytes, value: bytes) -> None:
        what = wire.read_field(key)
        if what is not None and what[0] == wire.QUEUE:
            self.generation += 1
            self._queue_count(node, what[1], what[2], wire.read_queue_value(value))
        elif what is not None and what[0] == wire.MEMBER:
            _, topic, identity = what
            members = self.members.get(topic)
            if members is not None and (node, identity) in members:
                members[node, identity] = wire.read_member_value(value)

    def _remove(self, node: str, key: bytes, value: bytes, events: list[MemberEvent]) -> None:
        what = wire.read_field(key)
        if what is None:
            return
        self.generation += 1
        if what[0] == wire.MEMBER:
            _, topic, identity = what
            members = self.members.get(topic, {})
            protocol, _presence = members.pop((node, identity), ("?", False))
            if not members:
                self.members.pop(topic, None)
            self._plain(topic, node, -1)
            counts = self.topic_nodes.get(topic, {})
            left = counts.get(node, 1) - 1
            if left > 0:
                counts[node] = left
            else:
                counts.pop(node, None)
                if not counts:
                    self.topic_nodes.pop(topic, None)
            events.append(MemberEvent(False, topic, identity, protocol, False))
        elif what[0] == wire.PATTERN:
            self.patterns.remove(node, what[1])
        elif what[0] == wire.QUEUE:
            self._queue_count(node, what[1], what[2], 0)
        elif self.identities.get(what[1]) == node:
            del self.identities[what[1]]
            # another node may hold it too (claims crossing on an unordered engine)
            for other in self.nodes.values():
                if other.name != node and key in other.fields:
                    self.identities[what[1]] = other.name
                    break
