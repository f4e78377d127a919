"""One queue group of a cluster on this node: :class:`StreamGroup`, its local members, a
:class:`~msgbroker.queues.QueueGroup` the hub routes to like any other, whose messages come
from the group's store (:class:`~msgbroker.engine.QueueStore`) rather than from routing;
and the counters of :mod:`msgbroker.clusterqueues`, which makes the groups and explains
the whole (split out to keep each module readable)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from attrs import define, field

from . import clusterwire as wire
from .engine import QueueEntry, QueueKey
from .message import Message
from .queues import QueueGroup, _deliver_to

if TYPE_CHECKING:
    from .clusterqueues import ClusterQueues

#: what a member without an ack window counts for when a node reads for its members
UNBOUNDED_ROOM = 100
#: at most this many entries per read
MAX_READ = 1000


@define
class QueueCounters:
    """What the node's queue groups did, counted per message (plain ints, for metrics)."""

    #: messages this node added to a group's store
    added: int = 0
    #: messages handed to local members without the store (the engine was away)
    local: int = 0
    #: messages that could not be added (engine away or its buffer full)
    dropped: int = 0
    #: entries read from a store, and taken over after ``queue-redeliver-after``
    taken: int = 0
    claimed: int = 0
    #: entries acknowledged (members' acks), acknowledged unseen (no local member's filters
    #: match), given back (no local member left to take them), malformed (skipped, acked)
    acked: int = 0
    filtered: int = 0
    released: int = 0
    skipped: int = 0


@define(eq=False)
class StreamGroup(QueueGroup):
    """One queue group of the cluster: this node's members in it (see the module
    docstring). ``held`` is every entry this node holds: sent to a member and not
    acknowledged, or waiting in the backlog for a member with room."""

    manager: ClusterQueues = field(kw_only=True)
    durable: bool = field(default=False, kw_only=True)
    #: id(message) -> (message, its entry id), and the entry ids held
    held: dict[int, tuple[Message, bytes]] = field(factory=dict, kw_only=True)
    entry_ids: set[bytes] = field(factory=set, kw_only=True)
    #: entries to acknowledge and to give back, with the next flush
    acks: list[bytes] = field(factory=list, kw_only=True)
    releases: list[bytes] = field(factory=list, kw_only=True)
    #: a read or claim is on its way; entries may be waiting (woken since the last read)
    reading: bool = field(default=False, kw_only=True)
    claiming: bool = field(default=False, kw_only=True)
    more: bool = field(default=True, kw_only=True)
    #: no local member any more (a new subscription makes a new group)
    closed: bool = field(default=False, kw_only=True)

    tracks_acks = True

    @property
    def key(self) -> QueueKey:
        return self.topic, self.name

    # -- from the hub ----------------------------------------------------------------------

    def offer(self, message: Message, sender: Any = None) -> int:
        """A message routed on this node: it reached the group's store from its publishing
        node (:meth:`ClusterQueues.publish`), so it is not for the members from here —
        unless the engine is away: then the local members share it, as on one node."""
        if self.manager.connected:
            return 0
        self.manager.counters.local += 1
        return super().offer(message, sender)

    def add(self, peer: Any, filters: tuple[Any, ...] = ()) -> int:
        delivered = super().add(peer, filters)
        self.manager.members_changed(self)
        self.want()
        return delivered

    def remove(self, peer: Any) -> None:
        super().remove(peer)
        self.manager.members_changed(self)
        if self.members:
            self.drain()  # what waited for the member that left goes to the others
        else:
            self.closed = True
            self.manager.group_closed(self)

    def drain(self) -> int:
        delivered = super().drain()
        self.want()
        return delivered

    def acked(self, message: Message) -> None:
        entry = self.held.pop(id(message), None)
        if entry is not None:
            self.entry_ids.discard(entry[1])
            self.acks.append(entry[1])
            self.manager.counters.acked += 1
            self.manager.changed(self)

    def _let_go(self, messages: list[Message], unmatched: bool) -> None:
        """Entries no local member takes: acknowledged unseen when the remaining members'
        filters do not match them (counted ``filtered``); given back when nobody is left
        (another node claims them later). A message handed over while the engine was away
        is not an entry: dropped, as on one node."""
        counters = self.manager.counters
        for message in messages:
            entry = self.held.pop(id(message), None)
            if entry is None:
                self._dropped(1)
                continue
            entry_id = entry[1]
            self.entry_ids.discard(entry_id)
            if unmatched and self.members:
                self.acks.append(entry_id)
                counters.filtered += 1
            else:
                self.releases.append(entry_id)
                counters.released += 1
        self.manager.changed(self)

    # -- from the store --------------------------------------------------------------------

    def credit(self) -> int:
        """How many entries to read for the members: their room, less what waits."""
        total = 0
        for peer in self.members:
            room = getattr(peer, "room", None)
            count = room() if room is not None else None
            total += UNBOUNDED_ROOM if count is None else count
        return min(total, MAX_READ) - len(self.backlog)

    def woken(self) -> None:
        self.more = True
        self.want()

    def want(self) -> None:
        """Read what no node took yet, when there may be some and the members have room."""
        if self.closed or self.reading or not self.more:
            return
        manager = self.manager
        if not manager.connected:
            return
        credit = self.credit()
        if credit <= 0:
            return
        self.reading = True
        self.more = False
        d = manager.store.read(self.key, credit)
        manager.changed(None)
        d.addCallbacks(self._read, self._failed, callbackArgs=(credit,), errbackArgs=("read",))

    def _read(self, entries: list[QueueEntry], asked: int) -> None:
        self.reading = False
        self.take(entries, claimed=False)
        if len(entries) >= asked:
            self.more = True
        self.want()

    def claim(self) -> None:
        """Take over what other nodes (or members) left unrenewed for
        ``queue-redeliver-after``, as much as the members have room for."""
        if self.closed or self.claiming or not self.manager.connected:
            return
        credit = self.credit()
        if credit <= 0:
            return
        self.claiming = True
        d = self.manager.store.claim(self.key, credit)
        self.manager.changed(None)
        d.addCallbacks(self._claimed, self._failed, errbackArgs=("claim",))

    def _claimed(self, entries: list[QueueEntry]) -> None:
        self.claiming = False
        self.take(entries, claimed=True)

    def _failed(self, failure: Any, what: str) -> None:
        if what == "read":
            self.reading = False
            self.more = True  # read again once connected
        else:
            self.claiming = False
        if self.manager.connected:  # else the cluster says the engine is away
            self.manager.trouble(what, f"could not {what}: {failure.getErrorMessage()}")

    def take(self, entries: Iterable[QueueEntry], claimed: bool) -> None:
        """Entries this node now holds: each to one member (or the backlog); given back at
        once when no member is left, acknowledged when none takes it."""
        manager = self.manager
        counters = manager.counters
        lookup = manager.hub.identities.get
        delivered = 0
        for entry_id, data in entries:
            if entry_id in self.entry_ids:
                continue  # held already (a claim of our own, after a stall)
            if claimed:
                counters.claimed += 1
            else:
                counters.taken += 1
            try:
                message = wire.read_entry(data)
            except wire.WireError as e:
                counters.skipped += 1
                self.acks.append(entry_id)
                manager.trouble("entry", f"skipped a malformed entry ({e})")
                continue
            if self.closed:
                self.releases.append(entry_id)
                counters.released += 1
                continue
            self.held[id(message)] = (message, entry_id)
            self.entry_ids.add(entry_id)
            # a member never gets its own message back, as on one node
            sender = lookup(message.sender)
            peer = self._pick(message, sender)
            if peer is not None:
                _deliver_to(peer, message, self)
                delivered += 1
            elif self._matching(message, sender):
                self._keep(message)
            else:
                self._let_go([message], unmatched=True)
        manager.hub.stats.delivered += delivered
        manager.changed(self)
