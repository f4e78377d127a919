"""The messages between this node and the others (split out of :mod:`msgbroker.cluster`):
where each one must go, the batches collected over a reactor turn, the publications they
become at the flush, and what comes in from the other nodes.

**Routes.** A topic's route says which nodes must get what is published on it: the nodes
with plain members in it (queue group members read their group's store instead) and the
nodes whose sbus patterns match it, from the replicated view (:mod:`msgbroker.clusterview`),
memoized per topic until the view changes. Topics about this node alone (``NODE_LOCAL``)
go nowhere.

**Publications.** What crosses during one reactor turn is collected in order, as runs of
consecutive items with the same route, and written at the flush:

- when the whole turn has one route, as one publication: on the topic's channel when
  some node has plain members in it (the engine fans it out to every node listening
  there), plus one on the own channel of each node whose patterns match but that does not
  listen on the topic; or on each target node's channel (UCASTs to one node, BCASTs);
- otherwise (topics or kinds alternating), as one publication per node that must get
  something, on its own channel, holding exactly its items in the order they were
  published: a turn costs one publication per interested node, not one per change of
  topic. The engines deliver one connection's publications in the order they were
  written, whatever their channels (docs/cluster.md), so order from one sender to one
  recipient is kept in both forms.

A node delivers what comes in the same way whichever channel it came on (:meth:`Traffic.
delivered`): through the hub, to its members and patterns at that moment, with its own
filters — a node that both has members in a topic and a matching pattern gets each
message once (from one publication), and one whose members left delivers it to its
matching patterns only, if any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attrs import define

from . import clusterwire as wire
from .errors import NoSuchIdentity
from .message import Kind, MessageRun
from .patterns import CRED_PREFIX

if TYPE_CHECKING:
    from .cluster import Cluster

#: topics (and sbus patterns) about this node alone, which never cross: sbus credentials
#: (host-local) and the ``_sys/`` topics, each node's own state (the admin plugin's)
NODE_LOCAL = (CRED_PREFIX, "_sys/")

#: where a message goes: ``(topic whose channel to publish on, or None; the nodes to send
#: it to on their own channels beside that; every node that must get it)``
Route = tuple[str | None, tuple[str, ...], tuple[str, ...]]
#: a topic's route when no other node wants it
NOWHERE: Route = (None, (), ())


@define
class ClusterCounters:
    """What crossed (plain ints, read by metrics)."""

    #: messages this node sent to others (once per publication that carried them), and
    #: received from them
    messages_out: int = 0
    messages_in: int = 0
    #: publications written (one per turn, or per node when a turn's routes differ)
    #: and received
    publications_out: int = 0
    publications_in: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    #: messages that could not cross (engine away, or its buffer full)
    dropped: int = 0
    #: malformed or foreign input skipped (publications, the engine's own: Cluster.skipped),
    #: and received UCASTs whose target had left
    skipped: int = 0
    #: nodes seen gone (timeout or bye), and connections to the engine made
    nodes_gone: int = 0
    connects: int = 0


def _count(items: list[Any]) -> int:
    """Messages in these items (a run counts its payloads)."""
    return sum(len(item[4]) if item[0] == "r" else 1 for item in items)


class Traffic:
    """This node's messages to and from the other nodes (see the module docstring)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.view = cluster.view
        self.counters = cluster.counters
        #: topic -> route, until the view changes
        self._routes: dict[str, Route] = {}
        self._routes_generation = -1
        #: node -> the route of a message to it alone
        self._to_node: dict[str, Route] = {}
        #: (route, items) in the order they were started; the last one's items
        self._runs: list[tuple[Route, list[Any]]] = []
        self._last_route: Route | None = None
        self._last_items: list[Any] = []

    # -- where messages go -----------------------------------------------------------------

    def route(self, topic: str) -> Route:
        """Where an MCAST to ``topic`` goes (:data:`NOWHERE`: no other node wants it)."""
        view = self.view
        if self._routes_generation != view.generation:
            self._routes.clear()
            self._routes_generation = view.generation
        route = self._routes.get(topic)
        if route is None:
            route = self._find(topic)
            if len(self._routes) >= 65_536:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _find(self, topic: str) -> Route:
        if topic.startswith(NODE_LOCAL):
            return NOWHERE
        view = self.view
        plain = view.plain_nodes(topic)  # queue members read their group's store
        matched = view.pattern_matches(topic)
        if plain:
            listening = view.topic_nodes.get(topic, {})
            beside = tuple(node for node in matched if node not in listening)
            every = (*plain, *(node for node in matched if node not in plain))
            return (topic, beside, every)
        if matched:
            return (None, tuple(matched), tuple(matched))
        return NOWHERE

    def unicast(self, node: str, item: Any) -> None:
        route = self._to_node.get(node)
        if route is None:
            if len(self._to_node) >= 4096:
                self._to_node.clear()
            route = self._to_node[node] = (None, (node,), (node,))
        self.queue(route, item)

    def broadcast(self, nodes: list[str], item: Any) -> None:
        targets = tuple(nodes)
        self.queue((None, targets, targets), item)

    def queue(self, route: Route, item: Any) -> None:
        """``item`` goes where ``route`` says, at the flush (after what was queued before)."""
        last = self._last_route
        if route is last or route == last:
            self._last_items.append(item)
            return
        items = [item]
        self._runs.append((route, items))
        self._last_route, self._last_items = route, items
        self.cluster._mark()

    # -- writing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what was collected: one publication when the turn had one route, else
        one per node that must get something (see the module docstring)."""
        runs = self._runs
        if not runs:
            return
        self._runs, self._last_route, self._last_items = [], None, []
        engine, head = self.cluster.engine, self.cluster.header
        sent = dropped = 0
        if len(runs) == 1:
            (topic, nodes, _every), items = runs[0]
            data = head + wire.body(wire.MESSAGES, items)
            count = _count(items)
            writes: list[tuple[Callable[[str, bytes], bool], str]] = [
                (engine.send, node) for node in nodes
            ]
            if topic is not None:
                writes.insert(0, (engine.publish, topic))
            for write, target in writes:
                if self._write(write, target, data):
                    sent += count
                else:
                    dropped += count
        else:
            # a run that goes to several nodes is packed once, whatever their number;
            # stretches of runs for one node alone are packed in one go
            per_node: dict[str, tuple[list[Any], list[int]]] = {}
            for (_topic, _nodes, every), items in runs:
                count = _count(items)
                part: Any = wire.packed_items(items) if len(every) > 1 else None
                for node in every:
                    got = per_node.get(node)
                    if got is None:
                        got = per_node[node] = ([], [0, 0])
                    parts, sizes = got
                    if part is not None:
                        parts.append(part)
                    elif parts and isinstance(parts[-1], list):
                        parts[-1] += items
                    else:
                        parts.append(list(items))
                    sizes[0] += len(items)
                    sizes[1] += count
            for node, (parts, (length, count)) in per_node.items():
                packed = [p if isinstance(p, bytes) else wire.packed_items(p) for p in parts]
                data = head + wire.messages_body(packed, length)
                if self._write(engine.send, node, data):
                    sent += count
                else:
                    dropped += count
        counters = self.counters
        counters.messages_out += sent
        if dropped:
            counters.dropped += dropped
            self.cluster.log_trouble(
                "dropped", f"cluster: messages could not cross ({dropped} now)"
            )

    def _write(self, write: Callable[[str, bytes], bool], target: str, data: bytes) -> bool:
        if not write(target, data):
            return False
        counters = self.counters
        counters.publications_out += 1
        counters.bytes_out += len(data)
        return True

    # -- from the engine -------------------------------------------------------------------

    def delivered(self, data: bytes) -> None:
        """A publication on a topic this node listens on, or on its own channel: both are
        delivered alike, to the members and patterns this node has now."""
        cluster = self.cluster
        if data.startswith(cluster.header):
            return  # our own publication, on a topic we listen on too
        counters = self.counters
        counters.publications_in += 1
        counters.bytes_in += len(data)
        try:
            node, epoch, op, items = wire.decode(data)
            if op != wire.MESSAGES or not isinstance(items, list):
                items = [None]  # not an item: refused below
            decoded = [wire.read_item(item, node) for item in items]
        except wire.WireError as e:
            cluster._skip(str(e))
            return
        sender = cluster.view.nodes.get(node)
        if sender is not None and sender.epoch == epoch:
            # its data is a sign of life as good as a heartbeat (clusterliveness)
            sender.last_heard = cluster.reactor.seconds()
        hub = cluster.hub
        hub.cluster = None  # what comes from another node is not sent on
        try:
            for what in decoded:
                if isinstance(what, MessageRun):
                    counters.messages_in += what.count
                    hub.multicast_run(None, what)
                elif isinstance(what, tuple):
                    counters.messages_in += 1
                    hub.broadcast_to(what[1], what[0])
                elif what.kind is Kind.UCAST:
                    counters.messages_in += 1
                    try:
                        hub.unicast(what)
                    except NoSuchIdentity:
                        counters.skipped += 1  # it left meanwhile
                else:
                    counters.messages_in += 1
                    hub.multicast(None, what)
        finally:
            hub.cluster = cluster

