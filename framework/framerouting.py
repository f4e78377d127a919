"""MCASTs and UCASTs given as the sender's own frames: routed without a Message when nothing
needs one.

The per-message path of a publisher that moves from topic to topic (no run to route as
one, see :mod:`msgbroker.runs`) is dominated by fixed costs: a request event, a
:class:`~msgbroker.message.Message` with its encoding memo, a fan-out per encoder. When
every member of the topic speaks the sender's protocol and takes the message as it is —
no property filters, no queue groups, no pattern subscribers, no cluster to cross to, no
``message_routed`` observer — the frame the sender's protocol built from the request is
all anyone needs, and the members get it directly. Otherwise the Message is built and
routed by :meth:`Hub.multicast` as usual. Split out of :mod:`msgbroker.hub`, whose
``Hub.multicast_frame``, ``Hub.multicast_frames`` and ``Hub.unicast_frame`` these are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .message import Encoder, Kind, Message
from .topics import Peer, Topic

if TYPE_CHECKING:
    from .hub import Hub


def plain_members(topic: Topic, encoder: Encoder) -> dict[Peer, None] | None:
    """The members of ``topic`` when each of them takes ``encoder``'s frame as it is (one
    protocol, no filters, no queue groups), else None."""
    groups = topic.by_encoder
    if len(groups) != 1 or topic.filtered or topic.queues:
        return None
    return groups.get(encoder)


def multicast_frame(
    hub: Hub, sender: Peer, topic_name: str, payload: bytes, encoder: Encoder, frame: bytes
) -> int:
    """The MCAST ``sender`` published on ``topic_name``: ``payload``, which ``encoder`` (the
    sender's protocol's) encodes as ``frame``. As :meth:`Hub.multicast`, with the Message
    built only when something needs more than ``frame`` (see the module docstring).
    Returns the number of deliveries."""
    topic = hub.topics.get(topic_name)
    if (
        topic is not None
        and hub.observer is None
        and hub.cluster is None
        and not hub.patterns.count
    ):
        members = plain_members(topic, encoder)
        if members is not None:
            hub.source = sender
            topic.published += 1
            stats = hub.stats
            stats.routed += 1
            count = 0
            for peer in members:
                if peer is not sender:
                    peer.send(frame)
                    count += 1
            stats.delivered += count
            return count
    return hub.multicast(sender, _message(sender, topic_name, payload, encoder, frame))


def multicast_frames(
    hub: Hub,
    sender: Peer,
    encoder: Encoder,
    topics: Sequence[str],
    frames: Sequence[bytes],
    payloads: Callable[[], Sequence[bytes]],
) -> int:
    """:func:`multicast_frame` for consecutive MCASTs of ``sender``, in order: the ``i``-th
    on ``topics[i]``, encoded as ``frames[i]``. ``payloads()`` gives their payloads; it is
    called once, and only when some message needs a Message. Returns the number of
    deliveries."""
    if hub.observer is not None or hub.cluster is not None or hub.patterns.count:
        every = payloads()
        return sum(
            hub.multicast(sender, _message(sender, topic, every[i], encoder, frames[i]))
            for i, topic in enumerate(topics)
        )
    get = hub.topics.get
    built: Sequence[bytes] | None = None
    routed = delivered = 0  # on the direct path; Hub.multicast counts its own
    total = 0
    for i, name in enumerate(topics):
        topic = get(name)
        if topic is None:  # nobody there: routed to no one
            routed += 1
            continue
        # plain_members(topic, encoder), inline: this loop is the per-message path
        groups = topic.by_encoder
        members = (
            groups.get(encoder)
            if len(groups) == 1 and not topic.filtered and not topic.queues
            else None
        )
        if members is None:
            if built is None:
                built = payloads()
            total += hub.multicast(sender, _message(sender, name, built[i], encoder, frames[i]))
            continue
        hub.source = sender
        topic.published += 1
        routed += 1
        frame = frames[i]
        for peer in members:
            if peer is not sender:
                peer.send(frame)
                delivered += 1
    stats = hub.stats
    stats.routed += routed
    stats.delivered += delivered
    return total + delivered


def unicast_frame(
    hub: Hub, sender: Peer, target_name: str, payload: bytes, encoder: Encoder, frame: bytes
) -> int:
    """:meth:`Hub.unicast` of the UCAST ``sender`` sent to ``target_name``: ``payload``,
    which ``encoder`` (the sender's protocol's) encodes as ``frame``. When the target is
    here and speaks the sender's protocol, and no ``message_routed`` observer is set, it
    gets ``frame`` and no Message is built (the request/reply path). Returns 1, or 0 when
    the target's protocol cannot carry it; :class:`NoSuchIdentity` when nobody holds
    ``target_name``."""
    target = hub.identities.get(target_name)
    if target is not None and target.encode is encoder and hub.observer is None:
        stats = hub.stats
        stats.routed += 1
        target.send(frame)
        stats.delivered += 1
        return 1
    return hub.unicast(_message(sender, target_name, payload, encoder, frame, Kind.UCAST))


def _message(
    sender: Peer,
    topic: str,
    payload: bytes,
    encoder: Encoder,
    frame: bytes,
    kind: Kind = Kind.MCAST,
) -> Message:
    message = Message(kind, sender.identity, sender.protocol, topic, payload)  # type: ignore[arg-type]
    message.preencode(encoder, frame)
    return message
