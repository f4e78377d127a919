"""Queue groups across the nodes of a cluster (Micromessage2's ``queue``), on an engine with a
:class:`~msgbroker.engine.QueueStore` (Redis: a stream and its consumer group per group).

A message published on any node reaches **one member of each group in the whole cluster**:

- **publishing**: the publishing node adds each MCAST once to the store of every group the
  topic has anywhere (every group it has seen with members, here or in the other nodes'
  state, until the store says the group is gone; the durable ones it knows), collected
  during the reactor turn and written with the cluster's flush: one engine write per
  turn. A group's own node never hands a published message to its
  members directly: what arrives from other nodes' publications is not for the group
  either (:meth:`~msgbroker.streamgroup.StreamGroup.offer` declines it).
- **reading**: a node with members reads from the store what no node took yet, as many as
  its members have room for (their ack windows), when the store says entries were added;
  each entry goes to one local member through the ordinary queue path (round-robin, the
  member's filters, its window). The store's entry stays *held* by the node until the
  member acknowledges it (``ack``/``batch-ack``: the store's acknowledgement; a member
  without an ack window: acknowledged when sent).
- **redelivery**: the node renews what it holds every quarter of ``queue-redeliver-after``.
  What a member took and never acknowledged goes to another member of the same node at
  once when it leaves (as on one node); what no member of the node can take is given back:
  no longer renewed, so any node with room claims it ``queue-redeliver-after`` later. A
  node that dies renews nothing: its messages are claimed the same way.
- **filters** apply on the node that read the message: a message none of that node's
  members takes (their filters) is acknowledged unseen and counted (``filtered``), as one
  node's group does not take a message no member's filters match.
- **engine away**: a message published meanwhile goes to the local members of its groups,
  as on one node, or is dropped and counted when the node has none.
- **lifetime**: the store deletes a group that is not durable when the last node with
  members closes it, and lets it expire when the nodes with members died (never on the
  word of a view, which may take a node that is only late for dead).

:class:`ClusterQueues` is the node's part (made by :class:`~msgbroker.cluster.Cluster` when
its engine has a store); :class:`~msgbroker.streamgroup.StreamGroup` is one group's local
members, a :class:`~msgbroker.queues.QueueGroup` the hub routes to as to any other.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from attrs import asdict

from . import clusterwire as wire
from .engine import QueueKey, QueueStore
from .message import Message, MessageRun
from .streamgroup import QueueCounters, StreamGroup

if TYPE_CHECKING:
    from .cluster import Cluster

class ClusterQueues:
    """This node's queue groups across the cluster (see the module docstring)."""

    def __init__(self, cluster: Cluster, store: QueueStore) -> None:
        self.cluster = cluster
        self.store = store
        self.hub = cluster.hub
        self.settings = cluster.settings
        self.counters = QueueCounters()
        #: this node's groups (those with local members)
        self.groups: dict[QueueKey, StreamGroup] = {}
        #: groups holding entries (closed ones too, until their members acknowledge)
        self.leases: dict[StreamGroup, None] = {}
        #: durable groups known (opened anywhere): topic -> group names
        self.durables: dict[str, set[str]] = {}
        #: every group seen with members (here or in the view): topic -> group names, kept
        #: until the store says a group is gone, so that a node missing from the view for
        #: a while (its heartbeats late) still gets its group's messages
        self.seen: dict[str, set[str]] = {}
        #: messages to add, by group, with the next flush
        self._adds: dict[QueueKey, list[bytes]] = {}
        self._changed: dict[StreamGroup, None] = {}
        #: topic -> its groups anywhere, until the view or the local groups change
        self._targets: dict[str, tuple[QueueKey, ...]] = {}
        self._targets_key = -1
        self._generation = 0
        self._view_generation = -1
        self._timer: Any = None

    @property
    def connected(self) -> bool:
        return self.cluster.connected

    def durable(self, name: str) -> bool:
        return self.settings.durable(name)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _schedule(self) -> None:
        period = self.settings.queue_redeliver_after / 4
        self._timer = self.cluster.reactor.callLater(period, self._tick)

    def _tick(self) -> None:
        """Every quarter of ``queue-redeliver-after``: renew what is held, claim what others
        left, read what a lost wake-up may have left, keep the stores."""
        if self.connected:
            for group in list(self.leases):
                if group.held:
                    self.store.touch(group.key, list(group.entry_ids))
                else:
                    del self.leases[group]
            for group in list(self.groups.values()):
                self.store.keep(group.key, group.durable)
                group.more = True
                group.want()
                group.claim()
            self.cluster._mark()
        self._schedule()

    def engine_connected(self) -> None:
        """(Re)connected: the store's groups are made again by the engine; read them all,
        and learn the durable groups."""
        self.store.durables().addCallbacks(self._durables_read, self._durables_failed)
        for group in list(self.groups.values()):
            group.more = True
            group.want()

    def _durables_read(self, keys: list[QueueKey]) -> None:
        for topic, name in keys:
            if self.durable(name):
                self._durable(topic, name)

    def _durables_failed(self, failure: Any) -> None:
        self.trouble("durables", failure.getErrorMessage())

    def _durable(self, topic: str, name: str) -> None:
        names = self.durables.setdefault(topic, set())
        if name not in names:
            names.add(name)
            self._generation += 1

    # -- groups ----------------------------------------------------------------------------

    def group(
        self, topic: str, name: str, limit: int, on_drop: Any, on_deliver: Any
    ) -> StreamGroup:
        """A new group of this node (its first local member is joining)."""
        key = (topic, name)
        durable = self.durable(name)
        group = StreamGroup(
            topic, name, limit=limit, on_drop=on_drop, on_deliver=on_deliver,
            manager=self, durable=durable,
        )  # fmt: skip
        old = self.groups.get(key)
        if old is not None:
            old.closed = True
        self.groups[key] = group
        self.store.open(key, durable, lambda: self._woken(key))
        if durable:
            self._durable(topic, name)
        self.seen.setdefault(topic, set()).add(name)
        self._generation += 1
        self.cluster._mark()
        return group

    def _woken(self, key: QueueKey) -> None:
        group = self.groups.get(key)
        if group is not None:
            group.woken()

    def members_changed(self, group: StreamGroup) -> None:
        """The group's local members changed: this node's state says how many there are."""
        count = len(group.members)
        self.cluster._change(
            wire.queue_field(group.topic, group.name), wire.pack(count) if count else None
        )

    def group_closed(self, group: StreamGroup) -> None:
        """The group's last local member left: the store forgets this node's part (and
        deletes a group that is not durable when no node has members left)."""
        key = group.key
        if self.groups.get(key) is group:
            del self.groups[key]
            self.store.close(key)
            self._generation += 1

    def local_state(self) -> dict[bytes, bytes]:
        """This node's queue fields (its whole state is stored again after a reconnect)."""
        return {
            wire.queue_field(topic, name): wire.pack(len(group.members))
            for (topic, name), group in self.groups.items()
            if group.members
        }

    def view_changed(self) -> None:
        """The other nodes' state changed: their groups are remembered (the durable ones
        for good; the others until the store says they are gone)."""
        view = self.cluster.view
        if view.queue_generation != self._view_generation:
            self._view_generation = view.queue_generation
            seen = self.seen
            for topic, groups in view.queues.items():
                names = seen.get(topic)
                if names is None:
                    names = seen[topic] = set()
                for name in groups:
                    if name not in names:
                        names.add(name)
                        self._generation += 1
                    if self.durable(name):
                        self._durable(topic, name)

    def _missing(self, key: QueueKey) -> None:
        """The store has no group ``key`` any more (no member anywhere left, not durable):
        nothing more is added to it, until a node has members again."""
        topic, name = key
        if key in self.groups or name in self.cluster.view.queues.get(topic, {}):
            return  # being made again
        names = self.seen.get(topic)
        if names is not None and name in names:
            names.discard(name)
            if not names:
                del self.seen[topic]
            self._generation += 1

    # -- publishing ------------------------------------------------------------------------

    def targets(self, topic: str) -> tuple[QueueKey, ...]:
        """The groups ``topic`` has anywhere in the cluster (those of durable groups too)."""
        if self._targets_key != self._generation:
            self._targets.clear()
            self._targets_key = self._generation
        found = self._targets.get(topic)
        if found is None:
            names = self.seen.get(topic, set()) | self.durables.get(topic, set())
            found = tuple((topic, name) for name in sorted(names))
            if len(self._targets) >= 65_536:
                self._targets.clear()
            self._targets[topic] = found
        return found

    def publish(self, message: Message) -> None:
        """An MCAST published on this node: into every group of its topic."""
        if self.seen or self.durables:
            targets = self.targets(message.topic)  # type: ignore[arg-type]
            if targets:
                self._add(targets, [wire.entry(message, self.cluster.node)])

    def publish_run(self, run: MessageRun) -> None:
        if self.seen or self.durables:
            targets = self.targets(run.topic)
            if targets:
                self._add(targets, wire.run_entries(run, self.cluster.node))

    def _add(self, targets: tuple[QueueKey, ...], entries: list[bytes]) -> None:
        if not self.connected:
            # the local groups share them meanwhile (StreamGroup.offer); the others lose them
            lost = sum(len(entries) for key in targets if key not in self.groups)
            if lost:
                self.counters.dropped += lost
                self.trouble("dropped", f"queue messages could not be stored ({lost} now)")
            return
        adds = self._adds
        for key in targets:
            waiting = adds.get(key)
            if waiting is None:
                adds[key] = list(entries)
            else:
                waiting.extend(entries)
        self.cluster._mark()

    # -- writing ---------------------------------------------------------------------------

    def changed(self, group: StreamGroup | None) -> None:
        """``group`` has acks or releases to write (None: a command is waiting); the next
        flush writes them."""
        if group is not None:
            self._changed[group] = None
            if group.held:
                self.leases[group] = None
        self.cluster._mark()

    def flush(self) -> None:
        """Write what was collected (the cluster's flush calls this before the engine's)."""
        store, counters = self.store, self.counters
        if self._adds:
            adds, self._adds = self._adds, {}
            for key, entries in adds.items():
                if store.add(key, entries, partial(self._missing, key)):
                    counters.added += len(entries)
                else:
                    counters.dropped += len(entries)
                    self.trouble("dropped", "queue messages could not be stored")
        if self._changed:
            changed, self._changed = self._changed, {}
            for group in changed:
                if group.acks:
                    acks, group.acks = group.acks, []
                    store.ack(group.key, acks)
                if group.releases:
                    releases, group.releases = group.releases, []
                    store.touch(group.key, releases)  # from now on, nobody renews them

    # -- troubles and figures --------------------------------------------------------------

    def trouble(self, key: str, text: str) -> None:
        self.cluster.log_trouble(f"queue {key}", f"cluster queues: {text}")

    def metrics(self) -> dict[str, Any]:
        return {
            **asdict(self.counters),
            "groups": len(self.groups),
            "held": sum(len(group.held) for group in self.leases),
        }
