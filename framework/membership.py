"""Joining and leaving topics, for :class:`~msgbroker.hub.Hub`'s ``subscribe``, ``watch``,
``unsubscribe`` and ``close``: the subscription and topic limits, where a member goes in a
topic (plain, filtered, a queue group), presence events and snapshots, forgetting a topic
nobody holds, and telling the cluster.

Split out of :mod:`msgbroker.hub`, which keeps routing (what runs per message) and calls
these; none of this runs per message. The hub's methods stay the API protocols call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

from .errors import AlreadySubscribed, LimitExceeded, NotAllowed, NotSubscribed
from .filters import Filter, FilterIndex
from .message import ANONYMOUS, Kind, Message
from .patterns import CRED_PREFIX
from .queues import QueueGroup
from .topics import Peer, Topic, presence_snapshot

if TYPE_CHECKING:
    from .hub import Hub


def subscribe(
    hub: Hub,
    peer: Peer,
    topic_name: str,
    presence: bool,
    filters: Iterable[Filter],
    queue: str | None,
) -> list[Message]:
    """:meth:`Hub.subscribe <msgbroker.hub.Hub.subscribe>` (see there)."""
    identity = peer.identity
    if identity is None or identity == ANONYMOUS:
        raise NotAllowed("anonymous sessions cannot subscribe")
    if topic_name in peer.subscriptions:
        raise AlreadySubscribed(topic_name)
    if topic_name.startswith(CRED_PREFIX):
        # secret topics (sbus ``!/cred/<gid>/<uid>/<pid>/...``) go only to the sbus
        # patterns of subscribers with those credentials (DECISIONS.md)
        raise NotAllowed("secret topics are for sbus subscribers with those credentials")
    check_subscriptions(hub, peer)
    topic = hub.topics.get(topic_name)
    new_group = None
    if queue is not None and (topic is None or queue not in (topic.queues or {})):
        new_group = _new_queue_group(hub, topic_name, queue)  # a cluster may refuse
    if topic is None:
        max_topics = hub.limits.max_topics
        if max_topics and len(hub.topics) >= max_topics:
            _refuse(hub, peer, LimitExceeded("max-topics", f"{len(hub.topics)} topics"))
        topic = hub.topics[topic_name] = Topic(topic_name)
        hub._topics_peak = max(hub._topics_peak, len(hub.topics))
    cluster = hub.cluster
    snapshot = presence_snapshot(topic, None) if presence else []
    if presence and cluster is not None:
        snapshot += cluster.presence_snapshot(topic_name)
    first = not topic.members
    topic.members[peer] = presence
    filters = tuple(filters)
    if queue is not None:
        if topic.queues is None:
            topic.queues = {}
        queue_group = topic.queues.get(queue) or new_group
        assert queue_group is not None  # made above when the topic had none
        topic.queues[queue] = queue_group
        hub.stats.delivered += queue_group.add(peer, filters)
    elif filters:
        if topic.filtered is None:
            topic.filtered = FilterIndex()
        topic.filtered.add(peer, filters)
    else:
        group = topic.by_encoder.get(peer.encode)
        if group is None:
            group = topic.by_encoder[peer.encode] = {}
        group[peer] = None
    peer.subscriptions[topic_name] = topic
    hub.generation += 1
    if topic.watchers:
        event = Message(Kind.SUBSCRIBE, identity, peer.protocol, topic_name, presence=presence)
        hub._fan_out(event, topic.watchers, None)
    if presence:
        topic.watchers[peer] = None
    if cluster is not None:
        cluster.joined(peer, topic_name, presence, first)
    return snapshot


def _new_queue_group(hub: Hub, topic_name: str, queue: str) -> QueueGroup:
    """A queue group of one node, or one of the whole cluster (which may refuse:
    :class:`NotAllowed` when its engine cannot hold queue groups)."""
    limit = hub.limits.queue_backlog
    if hub.cluster is not None:
        return hub.cluster.queue_group(topic_name, queue, limit, hub._dropped, hub._queue_delivered)
    return QueueGroup(
        topic_name, queue, limit=limit, on_drop=hub._dropped, on_deliver=hub._queue_delivered
    )


def watch(hub: Hub, peer: Peer, topic_name: str) -> list[Message]:
    """:meth:`Hub.watch <msgbroker.hub.Hub.watch>` (see there)."""
    topic = peer.subscriptions.get(topic_name)
    if topic is None:
        raise NotSubscribed(topic_name)
    if peer in topic.watchers:
        return []
    topic.members[peer] = True
    topic.watchers[peer] = None
    snapshot = presence_snapshot(topic, peer)
    cluster = hub.cluster
    if cluster is not None:
        snapshot += cluster.presence_snapshot(topic_name)
        cluster.joined(peer, topic_name, True, False)
    return snapshot


def leave(hub: Hub, peer: Peer, topic: Topic) -> None:
    """``peer`` leaves ``topic`` (unsubscribed, or closed): the watchers are told, a topic
    left empty is forgotten."""
    hub.generation += 1
    del peer.subscriptions[topic.name]
    del topic.members[peer]
    topic.watchers.pop(peer, None)
    group = topic.by_encoder.get(peer.encode)
    queue = topic.queue_of(peer) if topic.queues else None
    if group is not None and peer in group:
        del group[peer]
        if not group:
            del topic.by_encoder[peer.encode]
    elif queue is not None:
        queue.remove(peer)
        if not queue.members:
            del topic.queues[queue.name]  # type: ignore[union-attr]
    else:
        topic.filtered.remove(peer)  # type: ignore[union-attr]
    if not topic.members:
        _forget_topic(hub, topic.name)
    elif topic.watchers:
        event = Message(Kind.UNSUBSCRIBE, peer.identity or ANONYMOUS, peer.protocol, topic.name)
        hub._fan_out(event, topic.watchers, None)
    if hub.cluster is not None:
        hub.cluster.left(peer, topic.name, not topic.members)


def check_subscriptions(hub: Hub, peer: Peer) -> None:
    """Refuse one more subscription (a topic or a pattern) beyond ``max-subscriptions``."""
    limit = hub.limits.max_subscriptions
    if limit:
        held = len(peer.subscriptions)
        if hub.patterns:
            held += hub.patterns.count_of(peer)
        if held >= limit:
            _refuse(hub, peer, LimitExceeded("max-subscriptions", f"{held} held"))


def _refuse(hub: Hub, peer: Peer, error: LimitExceeded) -> NoReturn:
    """Count the refusal, have it logged (``hub.on_limit``), raise ``error``."""
    hub.stats.refused += 1
    if hub.on_limit is not None:
        hub.on_limit(peer, error)
    raise error


def _forget_topic(hub: Hub, name: str) -> None:
    """Delete a topic nobody subscribes to any more. A dict never shrinks by deleting,
    so after a flood of topics has gone (to a quarter of its peak) the table is rebuilt
    and its memory returned."""
    topics = hub.topics
    del topics[name]
    if hub._topics_peak > 4096 and len(topics) * 4 < hub._topics_peak:
        hub.topics = dict(topics)
        hub._topics_peak = len(topics)
        if hub.on_release is not None:
            hub.on_release()
