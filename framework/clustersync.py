"""Reading the other nodes' states: every node's when this node connects to the engine,
one node's when it is first heard of or connects again.

An answer may come long before its request ends (the NATS engine takes the answers that
come within a heartbeat): what a node already known announces meanwhile waits in its
``waiting`` list and is applied on top of its answer, never overwritten by it (an older
answer would otherwise undo what the node announced after giving it). A node first heard
of meanwhile has its state read on its own, asked later, so answered later: the older
answer is skipped for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from . import clusterwire as wire
from .clusterview import RemoteNode

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["read_every_node", "read_node"]

log = Logger(namespace="msgbroker.cluster")


def read_every_node(cluster: Cluster) -> None:
    """Ask for every node's state (this node just connected to the engine)."""
    asked = {name: node for name, node in cluster.view.nodes.items() if not node.syncing}
    for node in asked.values():
        node.syncing = True
    cluster.engine.snapshot(None).addCallbacks(
        _every_node_read, _every_node_failed,
        callbackArgs=(cluster, asked), errbackArgs=(cluster, asked),
    )  # fmt: skip


def _every_node_read(
    states: dict[str, Any], cluster: Cluster, asked: dict[str, RemoteNode]
) -> None:
    """Every node's state (``asked``: the nodes known when it was asked for)."""
    now = cluster.reactor.seconds()
    for name, state in states.items():
        if name == cluster.node:
            continue
        node = cluster.view.nodes.get(name)
        if node is None:
            node = cluster.view.nodes[name] = RemoteNode(name, "", now)
        elif asked.get(name) is not node:
            # first heard of meanwhile: its state was read on its own, asked later
            # (so answered later) than this; this older answer would undo its changes
            continue
        node.last_heard = now
        cluster.apply_events(cluster.view.replace(node, state), announced=False)
    _release(cluster, asked)
    others = sorted(cluster.view.nodes)
    log.info("cluster: {count} other node(s): {names}", count=len(others),
             names=", ".join(others) or "none")
    cluster.synced()


def _every_node_failed(failure: Any, cluster: Cluster, asked: dict[str, RemoteNode]) -> None:
    cluster.log_trouble(
        "snapshot", f"cluster: could not read the other nodes' state: {failure.getErrorMessage()}"
    )
    _release(cluster, asked)
    cluster.synced()


def _release(cluster: Cluster, asked: dict[str, RemoteNode]) -> None:
    """The announcements the nodes of ``asked`` made while every node's state was
    being read, applied in order (those made before its answer again: each sets or
    deletes a field, so the state ends as the node has it)."""
    for name, node in asked.items():
        if cluster.view.nodes.get(name) is not node or not node.syncing:
            continue  # gone meanwhile
        node.syncing = False
        waiting, node.waiting = node.waiting, []
        for index, (op, changes) in enumerate(waiting):
            if cluster.view.nodes.get(name) is not node:
                break  # it said bye
            if op == wire.JOIN:
                # it connected again: what it changed meanwhile it did not announce
                node.waiting = waiting[index + 1:]
                node.syncing = True
                read_node(cluster, node)
                break
            cluster.handle(node, op, changes)


def read_node(cluster: Cluster, node: RemoteNode) -> None:
    """Ask for ``node``'s state (first heard of, or connected again); what it announces
    meanwhile waits in its ``waiting`` list and is applied on top."""
    def read(states: dict[str, Any]) -> None:
        if cluster.view.nodes.get(node.name) is not node:
            return
        state = states.get(node.name)
        if state is not None:
            cluster.apply_events(cluster.view.replace(node, state), announced=False)
        node.syncing = False
        waiting, node.waiting = node.waiting, []
        for op, changes in waiting:
            if op != wire.JOIN:
                cluster.handle(node, op, changes)
        cluster.broker.batcher.flush()
        cluster.changes.notify()  # a snapshot may complete on a timer, not in a chunk

    def failed(failure: Any) -> None:
        node.syncing = False
        cluster.log_trouble("snapshot", f"cluster: could not read node {node.name}'s state")
        cluster.changes.notify()

    cluster.engine.snapshot([node.name]).addCallbacks(read, failed)
