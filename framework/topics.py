"""What the hub is made of: the :class:`Peer` interface, one exact :class:`Topic` with its
members, and the shared :class:`HubStats`; and the helpers that read a topic for routing.
Split out of :mod:`msgbroker.hub` to keep it readable; ``msgbroker.hub`` re-exports them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from attrs import define, field, frozen

from .filters import FilterIndex
from .message import ANONYMOUS, Encoder, Kind, Message
from .queues import DEFAULT_QUEUE_BACKLOG, QueueGroup


class Peer(Protocol):
    """What the hub needs of a connection (``msgbroker.session.Session`` provides it)."""

    identity: str | None
    protocol: str
    encode: Encoder
    subscriptions: dict[str, Topic]

    def send(self, frame: bytes) -> None: ...

    def kick(self, reason: str) -> None:
        """Close this connection because the hub says so (its identity was taken over)."""


@define(eq=False)
class Topic:
    """One exact topic: its members in subscription order, grouped by encoder."""

    name: str
    #: member -> True when it watches presence; insertion order = subscription order
    members: dict[Peer, bool] = field(factory=dict)
    #: encoder -> members using it; what a fan-out iterates
    by_encoder: dict[Encoder, dict[Peer, None]] = field(factory=dict)
    #: members that watch presence
    watchers: dict[Peer, None] = field(factory=dict)
    #: members with property filters (not in ``by_encoder``); made with the first one
    filtered: FilterIndex[Peer] | None = None
    #: queue groups by name (their members are in neither of the above)
    queues: dict[str, QueueGroup] | None = None
    #: MCASTs published on it while it existed (a run counts each of its messages; one
    #: increment per MCAST or run, which the admin plugin samples to rank busy topics)
    published: int = 0

    def queue_of(self, peer: Peer) -> QueueGroup | None:
        for group in (self.queues or {}).values():
            if peer in group.members:
                return group
        return None


@define
class HubStats:
    """Counters the hub and the sessions share. Plain ints: cheap on the hot path."""

    routed: int = 0
    delivered: int = 0
    skipped: int = 0
    dropped: int = 0
    kicked: int = 0
    #: requests a configured limit refused (subscriptions, topics, connections, logins)
    refused: int = 0


@frozen
class HubLimits:
    """The hub's share of the configured limits (0: no limit)."""

    #: topics, patterns and filtered or queue subscriptions one peer may hold
    max_subscriptions: int = 0
    #: distinct exact topics
    max_topics: int = 0
    #: bytes a queue group holds for members without room
    queue_backlog: int = DEFAULT_QUEUE_BACKLOG


def presence_snapshot(topic: Topic, leave_out: Peer | None) -> list[Message]:
    """One SUBSCRIBE presence event per member of ``topic`` (but ``leave_out``), in
    subscription order, each saying whether that member watches presence itself."""
    return [
        Message(Kind.SUBSCRIBE, m.identity or ANONYMOUS, m.protocol, topic.name, presence=w)
        for m, w in topic.members.items()
        if m is not leave_out
    ]


def one_by_one(topic: Topic | None) -> bool:
    """Whether MCASTs to ``topic`` must be routed one by one (filters and queue groups
    look at each message)."""
    return topic is not None and bool(topic.filtered or topic.queues)


def with_filtered(topic: Topic, message: Message) -> dict[Encoder, dict[Peer, None]]:
    """``topic.by_encoder`` plus the filtered members whose filters ``message`` matches
    (the topic's own groups are copied before anything is added to them)."""
    matched = topic.filtered.match(message.properties)  # type: ignore[union-attr]
    if not matched:
        return topic.by_encoder
    own = topic.by_encoder
    groups = dict(own)
    for peer in matched:
        encoder = peer.encode
        group = groups.get(encoder)
        if group is None or group is own.get(encoder):
            group = groups[encoder] = dict(group) if group else {}
        group[peer] = None
    return groups


def sharing(shared: Iterable[Topic]) -> dict[Encoder, dict[Peer, None]]:
    """Every member of these topics, once, grouped by encoder (a BCAST's recipients):
    filtered and queue members too, since filters are for MCASTs."""
    groups: dict[Encoder, dict[Peer, None]] = {}
    for topic in shared:
        for encoder, members in topic.by_encoder.items():
            group = groups.get(encoder)
            if group is None:
                groups[encoder] = dict(members)
            else:
                group.update(members)
        if topic.filtered:
            for peer in topic.filtered:
                groups.setdefault(peer.encode, {})[peer] = None
        for queue in (topic.queues or {}).values():
            for peer in queue.members:
                groups.setdefault(peer.encode, {})[peer] = None
    return groups
