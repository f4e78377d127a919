"""Broker nodes of one cluster, in the shared reactor thread (tests/ssmp/e2e_support).

A test waits for a node to reach a state on the event that brings it there, never by
polling: :meth:`Node.until` checks its condition in the reactor thread now and after each
change of the node's cluster state (``cluster.changes``, msgbroker.clusterwatch)::

    a.until_interested("news")                                # b's subscription reached a
    a.until(lambda: not a.cluster.connected, "a to lose Redis")

and :func:`log_lines` collects the log, waking a waiter at the line it waits for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import formatEvent, globalLogPublisher

from msgbroker import BrokerConfig, Listener
from msgbroker.service import BrokerService
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

    def _sees(self, names: set[str]) -> bool:
        return names <= {n.name for n in self.cluster.view.nodes.values() if not n.syncing}

    def sees(self, *others: Node) -> bool:
        return bool(self.call(self._sees, {o.name for o in others}))

    def interested(self, topic: str) -> bool:
        return bool(self.call(lambda: self.cluster.interested(topic)))

    def engine_no_delay(self) -> bool:
        """Whether the TCP socket under the engine's connection (through TLS) has
        TCP_NODELAY set."""

        def read() -> bool:
            transport = self.cluster.engine.conn.transport
            while not hasattr(transport, "socket"):
                transport = transport.transport  # the TLS layer's TCP transport
            sock = transport.socket
            return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        return bool(self.call(read))

    def holds_remotely(self, identity: str) -> bool:
        return identity in self.call(lambda: dict(self.cluster.view.identities))

    # -- waiting on the node's changes (the reactor thread runs each check)

    def until(self, check: Callable[[], object], what: str, timeout: float = WAIT) -> None:
        """Return once ``check()`` (run in the reactor thread) is true: now, or after the
        change of the node's cluster state that makes it so; TimeoutError naming ``what``
        after ``timeout``."""
        waiting: list[Deferred[None]] = []

        def start() -> Deferred[None]:
            waiting.append(self.cluster.changes.when(lambda: bool(check())))
            return waiting[0]

        try:
            self.call(start, timeout=timeout)
        except TimeoutError:
            self.call(lambda: waiting and waiting[0].cancel())
            raise TimeoutError(f"{self.name}: still waiting for {what} after {timeout} s"
                               ) from None

    def until_interested(self, *topics: str, what: str = "") -> None:
        """Until another node's interest in every one of ``topics`` reached this node."""
        self.until(lambda: all(self.cluster.interested(t) for t in topics),
                   what or f"{self.name} to know of interest in {topics!r}")

    def until_holds(self, identity: str, where: Node | None = None) -> None:
        """Until this node knows ``identity`` is held on another node (on ``where``)."""
        self.until(lambda: self.cluster.view.identities.get(identity) == where.name
                   if where is not None else identity in self.cluster.view.identities,
                   f"{self.name} to know where {identity!r} is")

    def until_free(self, identity: str) -> None:
        """Until this node knows no other node holds ``identity``."""
        self.until(lambda: identity not in self.cluster.view.identities,
                   f"{self.name} to know {identity!r} is free")

    def until_sees(self, *others: Node) -> None:
        """Until this node knows every one of ``others`` (their state read)."""
        names = {o.name for o in others}
        self.until(lambda: self._sees(names), f"{self.name} to see {sorted(names)}")

    def until_forgets(self, other: Node) -> None:
        """Until this node no longer counts ``other`` among the nodes."""
        self.until(lambda: other.name not in self.cluster.view.nodes,
                   f"{self.name} to forget {other.name}")

    def until_connected(self, connected: bool = True) -> None:
        """Until the node is connected to its engine (or, ``False``, has lost it)."""
        self.until(lambda: self.cluster.connected == connected,
                   f"{self.name} to {'connect to' if connected else 'lose'} the engine")

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
            node.until_sees(*(o for o in nodes if o is not node))
        yield nodes
    finally:
        for node in reversed(nodes):
            node.stop()


class LogLines(list[str]):
    """The log lines said meanwhile (:func:`log_lines`); :meth:`wait_for` wakes at a line."""

    def __init__(self) -> None:
        super().__init__()
        self._added = threading.Condition()

    def add(self, line: str) -> None:
        with self._added:
            self.append(line)
            self._added.notify_all()

    def wait_for(self, text: str, what: str, timeout: float = WAIT) -> str:
        """The first line (said before or after the call) containing ``text``."""
        deadline = time.monotonic() + timeout
        with self._added:
            while True:
                for line in self:
                    if text in line:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._added.wait(remaining):
                    raise TimeoutError(f"still waiting for {what} (a line with {text!r})")


@contextlib.contextmanager
def log_lines() -> Iterator[LogLines]:
    """Every log line said (formatted) while the block runs, in every thread."""
    lines = LogLines()

    def observe(event: dict[str, Any]) -> None:
        lines.add(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        yield lines
    finally:
        globalLogPublisher.removeObserver(observe)
