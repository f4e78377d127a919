"""Routing an MCAST to a topic with queue groups (Micromessage2's ``queue``): every plain
subscriber gets it, and one member of each group. Split out of :mod:`msgbroker.hub`, whose
``Hub._route_with_queues`` calls this."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .message import Encoder, Message, RouteResult
from .queues import QueueGroup
from .topics import Peer, Topic, with_filtered

if TYPE_CHECKING:
    from .hub import Hub


def route_with_queues(
    hub: Hub,
    message: Message,
    topic: Topic,
    sender: Peer | None,
    groups: dict[Encoder, dict[Peer, None]] | None = None,
) -> int:
    """An MCAST to a topic with queue groups: the subscribers (``groups``, the topic's
    own when not given), then one member of each group. The observer's RouteResult
    counts the queue members that took it now (not those it reaches later, once a
    member has room)."""
    if groups is None:
        groups = with_filtered(topic, message) if topic.filtered else topic.by_encoder
    queues: list[QueueGroup] = list((topic.queues or {}).values())
    stats, observer = hub.stats, hub.observer
    if observer is None:
        delivered = hub._route(message, groups, sender)
        queued = sum(q.offer(message, sender) for q in queues)
        stats.delivered += queued
        return delivered + queued
    stats.routed += 1
    dropped_before, skipped_before = stats.dropped, stats.skipped
    per_protocol: dict[str, int] = {}
    delivered = hub._fan_out_groups(message, groups, sender, per_protocol)
    hub._counting = (message, per_protocol)
    try:
        queued = sum(q.offer(message, sender) for q in queues)
    finally:
        hub._counting = None
    stats.delivered += queued
    result = RouteResult(
        per_protocol, stats.skipped - skipped_before, stats.dropped - dropped_before
    )
    observer(message, result)
    return delivered + queued
