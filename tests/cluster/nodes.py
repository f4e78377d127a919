"""Broker nodes of one cluster, in the shared reactor thread (tests/ssmp/e2e_support)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from msgbroker import BrokerConfig, Listener
from msgbroker.service import BrokerService
from tests.cluster.redis_support import wait_for
from tests.ssmp.e2e_support import WAIT, ReactorThread, parse_address, reactor_thread

LISTENERS = (
    "ssmp=tcp:0:interface=127.0.0.1",
    "stmp=tcp:0:interface=127.0.0.1",
    "mm2=tcp:0:interface=127.0.0.1",
)


class Node:
    """One broker of the cluster, running in the reactor thread."""

    def __init__(self, thread: ReactorThread, url: str, listeners: tuple[str, ...],
                 cluster: dict[str, Any], config: dict[str, Any],
                 sections: dict[str, Any] | None = None) -> None:
        self.thread = thread
        config.setdefault("shutdown_grace", 3.0)
        self.config = BrokerConfig(
            listeners=tuple(Listener.parse(text) for text in listeners),
            sections={"cluster": {"url": url, **cluster}, **(sections or {})},
            **config,
        ).validate()
        self.service: BrokerService = thread.call(self._start)
        self.addresses = {
            listener.protocol: address for listener, address in self.broker.listening
        }
        self.name: str = self.cluster.node

    def _start(self) -> BrokerService:
        service = BrokerService(self.config, self.thread.reactor)
        service.startService()
        return service

    @property
    def broker(self) -> Any:
        return self.service.broker

    @property
    def cluster(self) -> Any:
        return self.broker.cluster

    def reactor_seconds(self) -> float:
        return float(self.thread.reactor.seconds())

    def address(self, protocol: str = "ssmp") -> tuple[str, int]:
        return parse_address(self.addresses[protocol])

    def call(self, fn: Any, *args: Any, timeout: float = WAIT, **kwargs: Any) -> Any:
        return self.thread.call(fn, *args, timeout=timeout, **kwargs)

    def synced(self) -> None:
        self.call(self.cluster.when_synced)

    def sees(self, *others: Node) -> bool:
        names = {o.name for o in others}
        return self.call(lambda: names <= {
            n.name for n in self.cluster.view.nodes.values() if not n.syncing
        })

    def interested(self, topic: str) -> bool:
        return bool(self.call(lambda: self.cluster.interested(topic)))

    def holds_remotely(self, identity: str) -> bool:
        return identity in self.call(lambda: dict(self.cluster.view.identities))

    def stop(self) -> None:
        if self.service.running:
            self.call(self.service.stopService, timeout=self.config.shutdown_grace + WAIT)

    def crash(self) -> None:
        """Die without a word, as kill -9 looks from Redis: the connection is cut, no bye,
        no more heartbeats (the process's sockets stay open but silent)."""

        def crash() -> None:
            cluster = self.broker.cluster
            cluster._stopping = True
            if cluster._timer is not None and cluster._timer.active():
                cluster._timer.cancel()
            engine = cluster.engine
            engine._stopped = True
            engine.conn.transport.abortConnection()

        self.call(crash)


@contextlib.contextmanager
def cluster_nodes(
    url: str, count: int = 3, listeners: Any = LISTENERS,
    cluster: dict[str, Any] | None = None, sections: Any = None, **config: Any,
) -> Iterator[list[Node]]:
    """``count`` nodes on the engine at ``url``, each synced and seeing all the others;
    ``listeners``: a tuple, or a function of the node's index giving one; ``sections``:
    a function of the node's index giving more configuration sections (a journal's)."""
    thread = reactor_thread()
    settings = {"heartbeat": 0.2, **(cluster or {})}
    nodes: list[Node] = []
    try:
        for index in range(count):
            listen = listeners(index) if callable(listeners) else listeners
            more = sections(index) if sections is not None else None
            nodes.append(Node(thread, url, listen, dict(settings), dict(config), more))
        for node in nodes:
            node.synced()
        for node in nodes:
            others = [o for o in nodes if o is not node]
            wait_for(lambda n=node, o=others: n.sees(*o), "the nodes to see each other")
        yield nodes
    finally:
        for node in reversed(nodes):
            node.stop()
