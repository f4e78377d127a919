"""A node of a cluster: what it tells the other nodes and hears from them, on any engine
(:mod:`msgbroker.engine`).

The hub calls the node when something may concern other nodes (``hub.cluster``; ``None``
with the memory engine, so a lone broker does nothing more per message):

- **messages**: an MCAST (or a pipelined run) crosses only when some other node has
  interest in its topic (a plain member, or a matching sbus pattern), which the node knows
  from its replicated view, without a round trip; a UCAST to an identity no local session
  holds goes to the node holding it; a BCAST to the nodes with members in the sender's
  topics. Routes, batches, publications and what comes in: :mod:`msgbroker.clustertraffic`.
- **state**: each topic member, sbus pattern and identity is a field of this node's state,
  announced to every node and stored by the engine for those that (re)connect later.
  A node's announcements reach every node in one order, so an identity claimed on two
  nodes at once ends with the later claim: the earlier holder is kicked (a node does not
  give way to a claim that came before its own, still unannounced one).

Micromessage2 queue groups span the cluster on an engine with a queue store
(:mod:`msgbroker.clusterqueues`); on an engine without one, a queue subscription is
refused. Announcements from the other nodes change the view and become presence events
for local watchers and kicks. Nodes beat every ``heartbeat``; one not heard from for
``node_timeout`` is gone: its members leave (presence events), its identities are free.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from attrs import asdict
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from . import clustersync
from . import clusterwire as wire
from .clusterliveness import ReadLag
from .clusterqueues import ClusterQueues
from .clustertraffic import NODE_LOCAL, NOWHERE, ClusterCounters, Traffic
from .clusterview import MemberEvent, RemoteNode, RemoteView
from .clusterwatch import ClusterChanges
from .engine import ClusterSettings, Engine, EngineContext, EngineSpec, queue_store
from .errors import NotAllowed
from .message import ANONYMOUS, Kind, Message, MessageRun

if TYPE_CHECKING:
    from .broker import Broker
    from .queues import QueueGroup
    from .topics import Peer

log = Logger(namespace="msgbroker.cluster")

class Cluster:
    """This node of a cluster (see the module docstring)."""

    def __init__(self, broker: Broker, settings: ClusterSettings, node: str) -> None:
        self.broker = broker
        self.hub = broker.hub
        self.reactor = broker.reactor
        self.settings = settings
        self.node = node
        #: this run of the node (a restarted node with the same name is another)
        self.epoch = os.urandom(6).hex()
        self.header = wire.header(node, self.epoch)
        self.view = RemoteView()
        self.counters = ClusterCounters()
        self.connected = False
        #: told after each change of what this node knows (see msgbroker.clusterwatch)
        self.changes = ClusterChanges()
        #: identity -> our claims announced but not yet seen come back
        self._claims: dict[str, int] = {}
        #: local sbus patterns (never secret ones) -> copies held
        self._patterns: dict[str, int] = {}
        self._view_generation = 0
        #: the messages to and from the other nodes (routes, batches, publications)
        self.traffic = Traffic(self)
        #: changes of this node's state, waiting for the batcher's flush
        self._changes: list[tuple[bytes, bytes | None]] = []
        self._marked = False
        self._snapshotting = False
        self._synced_waiters: list[Deferred[None]] = []
        self._timer: Any = None
        self._ticks = 0
        #: how far behind this node reads (its own heartbeats not back yet)
        self.read_lag = ReadLag(settings.heartbeat, settings.timeout)
        self._stopping = False
        self.engine: Engine
        #: the engine's announcements reach every node in one order (EngineSpec.ordered)
        self.ordered = True
        #: why MM2 queue subscriptions are refused on this engine ('': they are not)
        self.no_queue_groups = ""
        #: queue groups across nodes, when the engine has a queue store
        self.queues: ClusterQueues | None = None

    @classmethod
    def join(
        cls, broker: Broker, spec: EngineSpec, settings: ClusterSettings, node: str
    ) -> Cluster | None:
        """This node, on the engine ``spec`` builds; ``None`` when it builds none (memory)."""
        cluster = cls(broker, settings, node)
        context = EngineContext(
            node, settings.url, settings, cluster.reactor, cluster, cluster.log_trouble
        )
        engine = spec.build(context)
        if engine is None:
            return None
        cluster.engine = engine
        cluster.ordered = spec.ordered
        cluster.no_queue_groups = spec.no_queue_groups
        store = queue_store(engine)
        if store is not None:
            cluster.queues = ClusterQueues(cluster, store)
        return cluster

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.hub.cluster = self
        self.engine.start()
        self._schedule()
        if self.queues is not None:
            self.queues.start()

    def stop(self) -> Deferred[None]:
        """Leave the cluster: say bye, let the engine delete this node's state, close."""
        self._stopping = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self.queues is not None:
            self.queues.stop()
        self.flush()
        self.engine.announce(self.header + wire.body(wire.BYE), ())
        self.hub.cluster = None
        return self.engine.stop()

    def when_synced(self) -> Deferred[None]:
        """Fires once the engine is connected and the other nodes' state is read (at once
        when it is now)."""
        d: Deferred[None] = Deferred()
        if self.connected and not self._snapshotting:
            d.callback(None)
        else:
            self._synced_waiters.append(d)
        return d

    def _schedule(self) -> None:
        self._timer = self.reactor.callLater(self.settings.heartbeat / 4, self._tick)

    def _tick(self) -> None:
        """Every quarter heartbeat: beat on every fourth, and see who is gone."""
        self._ticks += 1
        now = self.reactor.seconds()
        if self._ticks % 4 == 1 and self.connected:
            self.engine.beat()
            if self.engine.announce(self.header + wire.body(wire.HEARTBEAT), ()):
                self.read_lag.sent(now)
            self.engine.flush()
        if self.connected:  # unheard while we hear nobody proves nothing
            # reading behind, we hear everyone late: they get as much longer (clusterliveness)
            timeout = self.settings.timeout + self.read_lag.allowance(now)
            for node in list(self.view.nodes.values()):
                if now - node.last_heard > timeout:
                    self._gone(node.name, f"no heartbeat for {now - node.last_heard:.2f} s")
        self._schedule()

    # -- from the hub: what may cross ------------------------------------------------------

    def interested(self, topic: str) -> bool:
        """Whether another node wants what is published on ``topic``."""
        return self.traffic.route(topic) is not NOWHERE

    def multicast(self, message: Message) -> None:
        route = self.traffic.route(message.topic)  # type: ignore[arg-type]
        if route is not NOWHERE:
            self.traffic.queue(route, wire.message_item(message))
        if self.queues is not None:
            self.queues.publish(message)

    def multicast_run(self, run: MessageRun) -> None:
        route = self.traffic.route(run.topic)
        if route is not NOWHERE:
            self.traffic.queue(route, wire.run_item(run))
        if self.queues is not None:
            self.queues.publish_run(run)

    def queue_group(
        self, topic: str, name: str, limit: int, on_drop: Any, on_deliver: Any
    ) -> QueueGroup:
        """A queue group of the whole cluster (its first member on this node joins):
        :class:`NotAllowed` when the engine has no queue store."""
        if self.queues is None:
            raise NotAllowed(
                self.no_queue_groups
                or "queue groups across the cluster need an engine with a queue store "
                "(Redis); this cluster's engine has none"
            )
        return self.queues.group(topic, name, limit, on_drop, on_deliver)

    def unicast(self, message: Message) -> bool:
        """A UCAST to an identity no local session holds: True when a node holds it."""
        node = self.view.identities.get(message.topic)  # type: ignore[arg-type]
        if node is None:
            return False
        self.traffic.unicast(node, wire.message_item(message))
        return True

    def broadcast(self, topics: Iterable[str], message: Message) -> None:
        topics = list(topics)
        nodes = self.view.nodes_in(topics)
        if nodes:
            self.traffic.broadcast(sorted(nodes), wire.broadcast_item(message, topics))

    def presence_snapshot(self, topic: str) -> list[Message]:
        """One SUBSCRIBE event per member of ``topic`` on other nodes."""
        members = self.view.members.get(topic, {})
        return [
            Message(Kind.SUBSCRIBE, identity, protocol, topic, presence=presence)
            for (_node, identity), (protocol, presence) in members.items()
        ]

    # -- from the hub: this node's state ---------------------------------------------------

    def joined(self, peer: Peer, topic: str, presence: bool, first: bool) -> None:
        """``peer`` joined ``topic`` (or turned presence on): ``first`` when it is the
        topic's first local member (the engine listens from now on)."""
        if topic.startswith(NODE_LOCAL):
            return  # nothing of it crosses: no other node needs to know
        if first:
            self.engine.listen(topic)
        self._change(
            wire.member_field(topic, peer.identity or ANONYMOUS),
            wire.member_value(peer.protocol, presence),
        )

    def left(self, peer: Peer, topic: str, last: bool) -> None:
        if topic.startswith(NODE_LOCAL):
            return
        self._change(wire.member_field(topic, peer.identity or ANONYMOUS), None)
        if last:
            self.engine.unlisten(topic)

    def claimed(self, identity: str) -> None:
        self._claims[identity] = self._claims.get(identity, 0) + 1
        self._change(wire.identity_field(identity), b"")

    def released(self, identity: str) -> None:
        self._change(wire.identity_field(identity), None)

    def pattern_added(self, pattern: str) -> None:
        if pattern.startswith(NODE_LOCAL):
            return  # credentials are host-local, _sys/ is this node's: such a pattern stays
        held = self._patterns.get(pattern, 0)
        self._patterns[pattern] = held + 1
        if not held:
            self._change(wire.pattern_field(pattern), b"")

    def pattern_removed(self, pattern: str) -> None:
        held = self._patterns.get(pattern, 0)
        if held > 1:
            self._patterns[pattern] = held - 1
        elif held:
            del self._patterns[pattern]
            self._change(wire.pattern_field(pattern), None)

    def _change(self, key: bytes, value: bytes | None) -> None:
        self._changes.append((key, value))
        self._mark()

    def local_state(self) -> dict[bytes, bytes]:
        """This node's whole state, from the hub (stored again after a (re)connect)."""
        state: dict[bytes, bytes] = {}
        for name, topic in self.hub.topics.items():
            for member, presence in topic.members.items():
                key = wire.member_field(name, member.identity or ANONYMOUS)
                state[key] = wire.member_value(member.protocol, presence)
        for pattern in self._patterns:
            state[wire.pattern_field(pattern)] = b""
        for identity in self.hub.identities:
            state[wire.identity_field(identity)] = b""
        if self.queues is not None:
            state.update(self.queues.local_state())
        return state

    # -- writing ---------------------------------------------------------------------------

    def _mark(self) -> None:
        if not self._marked:
            self._marked = True
            self.broker.batcher.mark(self)

    def flush(self) -> None:
        """Write what was collected (the broker's batcher calls this): the state changes,
        the messages (:meth:`Traffic.flush`), the queue entries, then one engine write."""
        self._marked = False
        engine, head = self.engine, self.header
        if self._changes:
            changes, self._changes = self._changes, []
            if self.connected:
                data = head + wire.body(wire.CHANGES, [list(c) for c in changes])
                engine.announce(data, changes)
            # when not connected, the whole state is stored again on connect
        self.traffic.flush()
        if self.queues is not None:
            self.queues.flush()
        engine.flush()

    # -- from the engine -------------------------------------------------------------------

    def engine_connected(self) -> None:
        self.counters.connects += 1
        self.connected = True
        self.read_lag.reset()
        now = self.reactor.seconds()
        for node in self.view.nodes.values():
            node.last_heard = now  # each gets a whole timeout to be heard again
        self._changes.clear()  # the whole state goes now
        self.engine.replace_state(self.local_state())
        self.engine.beat()
        self.engine.announce(self.header + wire.body(wire.JOIN), ())
        if self.queues is not None:
            self.queues.engine_connected()
        self.engine.flush()
        log.info(
            "cluster: node {node} connected to {engine}",
            node=self.node,
            engine=self.engine.status().get("url", "the engine"),
        )
        self._snapshotting = True
        clustersync.read_every_node(self)
        self.changes.notify()

    def synced(self) -> None:
        """Every node's state is read (or could not be): those waiting are told."""
        self._snapshotting = False
        self.broker.batcher.flush()
        waiters, self._synced_waiters = self._synced_waiters, []
        for d in waiters:
            d.callback(None)
        self.changes.notify()

    def engine_lost(self, reason: str) -> None:
        if self.connected:
            log.info("cluster: lost the engine ({reason}); reconnecting", reason=reason)
        self.connected = False
        self.read_lag.reset()
        self.changes.notify()

    def delivered(self, data: bytes) -> None:
        self.traffic.delivered(data)

    def chunk_done(self) -> None:
        self.broker.batcher.flush()
        self.changes.notify()

    def announced(self, data: bytes) -> None:
        try:
            name, epoch, op, items = wire.decode(data)
            changes = wire.read_changes(items) if op == wire.CHANGES else ()
        except wire.WireError as e:
            self._skip(str(e))
            return
        if name == self.node:
            if epoch == self.epoch:
                if op == wire.HEARTBEAT:
                    self.read_lag.heard()
                self._own(changes)
            else:
                self.log_trouble("twin", f"cluster: another node is named {name!r} too")
            return
        view = self.view
        node = view.nodes.get(name)
        if node is not None and node.epoch and node.epoch != epoch:
            self._gone(name, "restarted")
            node = None
        now = self.reactor.seconds()
        if node is None:
            if op == wire.BYE:
                return
            node = view.nodes[name] = RemoteNode(name, epoch, now, syncing=True)
            log.info("cluster: node {node} joined", node=name)
            node.waiting.append((op, changes))
            clustersync.read_node(self, node)
            return
        node.epoch = epoch
        node.last_heard = now
        if node.syncing:
            node.waiting.append((op, changes))
            return
        self.handle(node, op, changes)

    def handle(self, node: RemoteNode, op: str, changes: Any) -> None:
        if op == wire.CHANGES:
            self.apply_events(self.view.apply(node, changes), announced=True, claimant=node.name)
        elif op == wire.JOIN:
            node.syncing = True
            clustersync.read_node(self, node)
        elif op == wire.BYE:
            self._gone(node.name, "left")

    def _own(self, changes: Any) -> None:
        """Our own announcement came back: our claims in it are now in everyone's order."""
        for key, value in changes:
            if value is not None:
                what = wire.read_field(key)
                if what is not None and what[0] == wire.IDENTITY:
                    left = self._claims.get(what[1], 0) - 1
                    if left > 0:
                        self._claims[what[1]] = left
                    else:
                        self._claims.pop(what[1], None)

    def apply_events(
        self, result: tuple[list[MemberEvent], list[str]], announced: bool, claimant: str = ""
    ) -> None:
        events, claims = result
        hub = self.hub
        for event in events:
            kind = Kind.SUBSCRIBE if event.joined else Kind.UNSUBSCRIBE
            hub.presence_event(
                Message(kind, event.identity, event.protocol, event.topic, presence=event.presence)
            )
        if announced:
            for identity in claims:
                # a later claim than ours (or ours is long announced): the local holder goes
                if identity in hub.identities and self._gives_way(identity, claimant):
                    hub.kick(identity, "identity logged in on another node")
        if self._view_generation != self.view.generation:
            # who receives what changed: what protocols cached of the routes is stale
            self._view_generation = self.view.generation
            hub.generation += 1
            if self.queues is not None:
                self.queues.view_changed()

    def _gives_way(self, identity: str, claimant: str) -> bool:
        """Whether the local holder of ``identity`` goes for ``claimant``'s claim: yes,
        unless our own claim is not yet announced back — then, on an engine whose
        announcements reach every node in one order, the other claim came first and ours
        wins. Without that order (NATS: only each node's own announcements keep theirs)
        both nodes may see the other's claim first: the greater node name wins, so one
        holder stays (at worst both go, never both stay)."""
        if not self._claims.get(identity):
            return True
        return not self.ordered and claimant > self.node

    def _gone(self, name: str, why: str) -> None:
        node, events = self.view.drop(name)
        if node is None:
            return
        self.counters.nodes_gone += 1
        log.info("cluster: node {node} is gone ({why})", node=name, why=why)
        self.apply_events((events, []), announced=False)
        self.broker.batcher.flush()
        self.changes.notify()  # on a timer too (a missed heartbeat), not in a chunk

    # -- troubles --------------------------------------------------------------------------

    def _skip(self, why: str) -> None:
        self.skipped(f"a malformed or foreign publication ({why})")

    def skipped(self, what: str) -> None:
        """Malformed input skipped (the engine's own too): counted and logged."""
        self.counters.skipped += 1
        self.log_trouble("skipped", f"cluster: skipped {what}")

    def log_trouble(self, key: str, text: str) -> None:
        self.broker.rate_limited_log(f"cluster {key}", self.reactor.seconds(), text)

    def metrics(self) -> dict[str, Any]:
        """The node's cluster state and counters (for /metrics and the status line)."""
        counters = self.counters
        return {
            "node": self.node,
            "connected": self.connected,
            "nodes": len(self.view.nodes),
            "remote_topics": len(self.view.topic_nodes),
            "remote_identities": len(self.view.identities),
            **asdict(counters),
            "engine": dict(self.engine.status()),
            "queues": self.queues.metrics() if self.queues is not None else None,
        }

