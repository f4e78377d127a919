"""The routing core: pure, no I/O, no clock, no Twisted.

Protocol sessions call the hub (``login``, ``subscribe``, ``unsubscribe``, ``multicast``,
``unicast``, ``broadcast``, ``close``) and the hub calls each recipient's ``send(frame)``
synchronously with bytes produced by the recipient's ``encode``. Recipients are grouped by
encoder so a message is encoded once per protocol per fan-out.

The hub owns: the identity table (a new login kicks the old holder, whatever its protocol),
exact topics (joining and leaving them: :mod:`msgbroker.membership`), sbus-style topic
patterns (:mod:`msgbroker.patterns`: indexed, a publish never scans every pattern),
presence watchers and the ordering of presence events, unicast, multicast (never back to
the sender, unless an sbus client asks for it), broadcast de-duplicated across shared
topics, and per-recipient skips when a protocol cannot carry a message.

Ordering: every delivery is a synchronous ``send`` into the recipient's FIFO output, so two
messages from one sender to one recipient keep their order, and a presence UNSUBSCRIBE event
can never overtake the SUBSCRIBE event it follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from . import membership
from .errors import (
    LimitExceeded,
    NoSuchIdentity,
    NotAllowed,
    NotSubscribed,
)
from .filters import Filter
from .framerouting import multicast_frame, multicast_frames, unicast_frame
from .message import ANONYMOUS, Encoder, Message, MessageRun, RouteResult
from .patterns import PatternIndex
from .queuerouting import route_with_queues
from .queues import QueueGroup
from .runs import multicast_run
from .topics import (
    HubLimits,
    HubStats,
    Peer,
    Topic,
    sharing,
    with_filtered,
)

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["Hub", "HubLimits", "HubStats", "Peer", "RouteObserver", "Topic"]


RouteObserver = Callable[[Message, RouteResult], None]


class Hub:
    """Routing core. See the module docstring."""

    def __init__(self, limits: HubLimits | None = None) -> None:
        self.identities: dict[str, Peer] = {}
        self.topics: dict[str, Topic] = {}
        self.stats = HubStats()
        self.limits = limits or HubLimits()
        #: called with (peer, error) when a limit refuses a request, for logging
        self.on_limit: Callable[[Peer, LimitExceeded], None] | None = None
        #: the most topics held since ``topics`` was last rebuilt (see :mod:`msgbroker.membership`)
        self._topics_peak = 0
        #: called when the hub let go of a lot of memory (the broker trims the heap)
        self.on_release: Callable[[], None] | None = None
        #: called after each routed message when set; ``None`` keeps the hot path free
        self.observer: RouteObserver | None = None
        #: called once for a run routed as a whole (``msgbroker_run_routed``); ``None``
        #: makes an observed hub route runs message by message
        self.run_observer: Callable[[MessageRun, RouteResult], None] | None = None
        #: called with (peer, message) for each skipped recipient, for logging
        self.on_skip: Callable[[Peer, Message], None] | None = None
        #: while an observed MCAST is offered to queue groups: it, and its counts
        self._counting: tuple[Message, dict[str, int]] | None = None
        #: pattern subscriptions (sbus); a publish consults them only when there are some
        self.patterns: PatternIndex[Peer] = PatternIndex()
        #: topic -> the pattern subscribers matching it, grouped by encoder; emptied
        #: whenever a pattern is added or removed
        self._pattern_groups: dict[str, dict[Encoder, dict[Peer, None]]] = {}
        #: the peer whose message is being routed now (multicasts), for recipients whose
        #: flood control pauses the publishers that feed them
        self.source: Peer | None = None
        #: bumped by every change of who receives what (subscriptions, patterns, closes;
        #: the broker's hooks): a protocol may cache a topic's recipients while this stays
        #: the same (:mod:`msgbroker.routecache`)
        self.generation = 0
        #: the other nodes of a cluster (:mod:`msgbroker.cluster`), told of what may
        #: concern them; ``None`` on a lone node (the memory engine): nothing more to do
        self.cluster: Cluster | None = None

    # -- identities ---------------------------------------------------------------------

    def login(self, peer: Peer, identity: str) -> None:
        """Register ``identity`` for ``peer``; a previous holder is closed (kicked) first.

        ``ANONYMOUS`` is never registered: several anonymous peers may coexist and none is
        a unicast target.
        """
        if peer.identity is not None:
            raise NotAllowed("already logged in")
        if identity != ANONYMOUS:
            old = self.identities.get(identity)
            if old is not None:
                self.close(old)
                self.stats.kicked += 1
                old.kick("identity logged in elsewhere")
            self.identities[identity] = peer
            if self.cluster is not None:
                self.cluster.claimed(identity)
        peer.identity = identity

    def kick(self, identity: str, reason: str) -> None:
        """Close the local holder of ``identity`` (another node's login took it), as a
        login here would: it leaves every topic first (presence events), then is kicked."""
        old = self.identities.get(identity)
        if old is not None:
            self.close(old)
            self.stats.kicked += 1
            old.kick(reason)

    def lookup(self, identity: str) -> Peer | None:
        return self.identities.get(identity)

    # -- subscriptions -------------------------------------------------------------------

    def subscribe(
        self,
        peer: Peer,
        topic_name: str,
        presence: bool = False,
        filters: Iterable[Filter] = (),
        queue: str | None = None,
    ) -> list[Message]:
        """Subscribe ``peer`` to ``topic_name``; with ``filters``, only to the MCASTs whose
        properties match them all (see :mod:`msgbroker.filters`). Filters do not apply to
        presence events, unicasts or broadcasts. With ``queue``, ``peer`` joins that queue
        group of the topic: each MCAST goes to one member of the group (see
        :mod:`msgbroker.queues`).

        Returns the presence snapshot for the new member (one SUBSCRIBE message per current
        member, in subscription order) when ``presence`` is set, else ``[]``. The caller
        acknowledges the subscription first, then sends the snapshot. Current watchers are
        told of the new member before this returns.
        """
        return membership.subscribe(self, peer, topic_name, presence, filters, queue)

    def watch(self, peer: Peer, topic_name: str) -> list[Message]:
        """Turn presence on for ``peer``, already a member of ``topic_name`` (a protocol
        whose second subscribe may ask for presence). Returns the snapshot as
        :meth:`subscribe` does, ``[]`` when ``peer`` watched already.
        :class:`NotSubscribed` when it is not a member."""
        return membership.watch(self, peer, topic_name)

    def unsubscribe(self, peer: Peer, topic_name: str) -> None:
        """Remove ``peer`` from ``topic_name`` and tell the topic's presence watchers."""
        if peer.identity is None or peer.identity == ANONYMOUS:
            raise NotAllowed("anonymous sessions cannot unsubscribe")
        topic = peer.subscriptions.get(topic_name)
        if topic is None:
            raise NotSubscribed(topic_name)
        membership.leave(self, peer, topic)

    def subscribe_pattern(self, peer: Peer, pattern: str) -> None:
        """Deliver to ``peer`` every MCAST whose topic matches ``pattern`` (sbus rules: see
        :mod:`msgbroker.patterns`), from any protocol. A peer may hold one pattern several
        times (it gets each message once). Checking that a peer may hold a secret
        (``!/cred/...``) pattern is its protocol's business. Patterns are not topic
        membership: no presence events, and no broadcasts."""
        membership.check_subscriptions(self, peer)
        self.patterns.add(peer, pattern)
        self._pattern_groups.clear()
        self.generation += 1
        if self.cluster is not None:
            self.cluster.pattern_added(pattern)

    def unsubscribe_pattern(self, peer: Peer, pattern: str) -> bool:
        """Remove one copy of ``pattern`` from ``peer``; False when it held none."""
        removed = self.patterns.remove(peer, pattern)
        if removed:
            self._pattern_groups.clear()
            self.generation += 1
            if self.cluster is not None:
                self.cluster.pattern_removed(pattern)
        return removed

    def pattern_recipients(self, topic_name: str) -> dict[Encoder, dict[Peer, None]]:
        """The pattern subscribers (sbus) an MCAST on ``topic_name`` reaches, grouped by
        encoder; memoized per topic until a pattern is added or removed (read-only: a
        protocol may cache them while :attr:`generation` stays the same)."""
        groups = self._pattern_groups.get(topic_name)
        if groups is None:
            groups = {}
            for peer in self.patterns.match(topic_name):
                group = groups.get(peer.encode)
                if group is None:
                    group = groups[peer.encode] = {}
                group[peer] = None
            if len(self._pattern_groups) >= 4096:
                self._pattern_groups.clear()
            self._pattern_groups[topic_name] = groups
        return groups

    def close(self, peer: Peer) -> None:
        """Forget ``peer``: leave every topic (telling watchers) and free its identity.

        Idempotent; every kind of close (CLOSE, kick, timeout, network loss, shutdown,
        slow consumer) ends here.
        """
        for topic in list(peer.subscriptions.values()):
            membership.leave(self, peer, topic)
        cluster = self.cluster
        if self.patterns:
            held = self.patterns.patterns_of(peer) if cluster is not None else ()
            if self.patterns.remove_all(peer):
                self._pattern_groups.clear()
                self.generation += 1
                for pattern in held:
                    cluster.pattern_removed(pattern)  # type: ignore[union-attr]
        identity = peer.identity
        if identity is not None and self.identities.get(identity) is peer:
            del self.identities[identity]
            if cluster is not None:
                cluster.released(identity)

    # -- routing ---------------------------------------------------------------------------

    def multicast(self, sender: Peer | None, message: Message, echo: bool = False) -> int:
        """Deliver an MCAST to every subscriber of ``message.topic`` (exact, filtered, queue
        groups and matching patterns) except ``sender`` — unless ``echo`` is set, then the
        sender too when it subscribes (sbus).

        Returns the number of deliveries. No subscribers is not an error.
        """
        self.source = sender
        exclude = None if echo else sender
        if self.cluster is not None:
            self.cluster.multicast(message)
        topic = self.topics.get(message.topic)  # type: ignore[arg-type]
        if topic is not None:
            topic.published += 1
        if self.patterns.count:  # an attribute, not __bool__: this runs per message
            matched = self.pattern_recipients(message.topic)  # type: ignore[arg-type]
            if matched:
                return self._route_with_patterns(message, topic, matched, exclude)
        if topic is None:
            self.stats.routed += 1
            if self.observer is not None:
                self.observer(message, RouteResult({}))
            return 0
        if topic.queues:
            return self._route_with_queues(message, topic, exclude)
        if topic.filtered:
            return self._route(message, with_filtered(topic, message), exclude)
        return self._route(message, topic.by_encoder, exclude)

    # MCASTs and UCASTs given as the sender's own frames (msgbroker.framerouting): the
    # Message is built only when something needs it
    multicast_frame = multicast_frame
    multicast_frames = multicast_frames
    unicast_frame = unicast_frame

    def _route_with_patterns(
        self,
        message: Message,
        topic: Topic | None,
        matched: dict[Encoder, dict[Peer, None]],
        exclude: Peer | None,
    ) -> int:
        """An MCAST that pattern subscribers receive, beside the topic's own members."""
        if topic is None:
            return self._route(message, matched, exclude)
        own = with_filtered(topic, message) if topic.filtered else topic.by_encoder
        groups = dict(own)
        for encoder, peers in matched.items():
            group = groups.get(encoder)
            groups[encoder] = peers if group is None else {**group, **peers}
        if topic.queues:
            return self._route_with_queues(message, topic, exclude, groups)
        return self._route(message, groups, exclude)

    def _route_with_queues(
        self,
        message: Message,
        topic: Topic,
        sender: Peer | None,
        groups: dict[Encoder, dict[Peer, None]] | None = None,
    ) -> int:
        return route_with_queues(self, message, topic, sender, groups)

    def _queue_delivered(self, peer: Peer, message: Message) -> None:
        counting = self._counting
        if counting is not None and counting[0] is message:
            counts = counting[1]
            counts[peer.protocol] = counts.get(peer.protocol, 0) + 1

    def ready(self, peer: Peer) -> int:
        """``peer`` has room again (its ack window opened): the queue groups it is in hand
        it waiting messages. Returns how many were delivered."""
        delivered = 0
        for topic in list(peer.subscriptions.values()):
            group = topic.queue_of(peer) if topic.queues else None
            if group is not None:
                delivered += group.drain()
        self.stats.delivered += delivered
        return delivered

    def redeliver(self, taken: Iterable[tuple[Message, QueueGroup]]) -> int:
        """Queue messages a peer took and never acknowledged (it is gone), oldest first: each
        back to its group, in order (:meth:`QueueGroup.redeliver_all`). Returns how many
        went to other members now."""
        by_group: dict[QueueGroup, list[Message]] = {}
        for message, group in taken:
            by_group.setdefault(group, []).append(message)
        delivered = sum(group.redeliver_all(messages) for group, messages in by_group.items())
        self.stats.delivered += delivered
        return delivered

    def _dropped(self, count: int) -> None:
        self.stats.dropped += count

    def multicast_run(self, sender: Peer | None, run: MessageRun) -> int:
        """Deliver ``run.count`` MCASTs to one topic at once: one frame per recipient (see
        :func:`msgbroker.runs.multicast_run`)."""
        cluster = self.cluster
        if cluster is None:
            return multicast_run(self, sender, run)
        cluster.multicast_run(run)  # the run crosses as one
        self.cluster = None  # routed here message by message, perhaps: not sent again
        try:
            return multicast_run(self, sender, run)
        finally:
            self.cluster = cluster

    def unicast(self, message: Message) -> int:
        """Deliver a UCAST to the identity ``message.topic``; :class:`NoSuchIdentity` if absent.

        A peer may unicast to itself. Returns 1, or 0 when the target's protocol cannot
        carry the message (counted as a skip).
        """
        target = self.identities.get(message.topic)  # type: ignore[arg-type]
        if target is None:
            if self.cluster is not None and self.cluster.unicast(message):
                self.stats.routed += 1
                return 1  # another node holds it
            raise NoSuchIdentity(message.topic)
        return self._route(message, {target.encode: {target: None}}, None)

    def broadcast(self, sender: Peer, message: Message) -> int:
        """Deliver a BCAST once to every peer sharing at least one topic with ``sender``."""
        if sender.identity is None or sender.identity == ANONYMOUS:
            raise NotAllowed("anonymous sessions cannot broadcast")
        if self.cluster is not None:
            self.cluster.broadcast(sender.subscriptions, message)
        return self._route(message, sharing(sender.subscriptions.values()), sender)

    def broadcast_to(self, topic_names: Iterable[str], message: Message) -> int:
        """Deliver a BCAST from another node once to every local member of these topics."""
        topics = self.topics
        found = [topics[name] for name in topic_names if name in topics]
        return self._route(message, sharing(found), None)

    def presence_event(self, event: Message) -> None:
        """A member on another node joined or left ``event.topic``: tell the local watchers."""
        topic = self.topics.get(event.topic)  # type: ignore[arg-type]
        if topic is not None and topic.watchers:
            self._fan_out(event, topic.watchers, None)


    def _route(
        self, message: Message, groups: dict[Encoder, dict[Peer, None]], sender: Peer | None
    ) -> int:
        stats = self.stats
        stats.routed += 1
        observer = self.observer
        if observer is None:
            return self._fan_out_groups(message, groups, sender)
        dropped_before, skipped_before = stats.dropped, stats.skipped
        per_protocol: dict[str, int] = {}
        delivered = self._fan_out_groups(message, groups, sender, per_protocol)
        observer(
            message,
            RouteResult(
                per_protocol, stats.skipped - skipped_before, stats.dropped - dropped_before
            ),
        )
        return delivered

    def _fan_out_groups(
        self,
        message: Message,
        groups: dict[Encoder, dict[Peer, None]],
        sender: Peer | None,
        per_protocol: dict[str, int] | None = None,
    ) -> int:
        delivered = 0
        for encoder, members in groups.items():
            frame = message.encoded(encoder)
            if frame is None:
                self._skip(message, members, sender)
                continue
            count = 0
            for peer in members:
                if peer is not sender:
                    peer.send(frame)
                    count += 1
            delivered += count
            if per_protocol is not None and count:
                name = next(iter(members)).protocol
                per_protocol[name] = per_protocol.get(name, 0) + count
        self.stats.delivered += delivered
        return delivered

    def _fan_out(self, message: Message, peers: Iterable[Peer], sender: Peer | None) -> None:
        """Deliver to peers of possibly different protocols (presence events)."""
        for peer in peers:
            if peer is sender:
                continue
            frame = message.encoded(peer.encode)
            if frame is None:
                self._skip(message, (peer,), None)
            else:
                peer.send(frame)

    def _skip(self, message: Message, members: Iterable[Peer], sender: Peer | None) -> None:
        for peer in members:
            if peer is sender:
                continue
            self.stats.skipped += 1
            if self.on_skip is not None:
                self.on_skip(peer, message)

    # -- introspection ---------------------------------------------------------------------

    def subscribers(self, topic_name: str) -> list[Any]:
        topic = self.topics.get(topic_name)
        return list(topic.members) if topic else []
