"""The servers bench/cluster.py measures, each as one bench "server" (``procs.Server``'s
shape, so bench/scenarios.py drives them unchanged): one unclustered node, Mosquitto, or
two nodes joined through a fresh engine server (``redis-server`` or ``nats-server``), with
the publisher on one node and the subscribers on one or both; and the probes that make
sure a node knows the other's interest and identities before a clock starts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import procs
from clients import BenchError, open_client
from cluster_cross import engine_server

#: the heartbeat of the throughput and latency stages' nodes (the faults stage has its own)
HEARTBEAT = 1.0


@dataclass
class Pinning:
    """Which core each role runs on (None: not pinned)."""

    node_a: set[int] | None
    node_b: set[int] | None

    def describe(self) -> str:
        def cores(c: set[int] | None) -> str:
            return "not pinned" if c is None else f"core {','.join(map(str, sorted(c)))}"

        return (f"node A, the single node and Mosquitto: {cores(self.node_a)}; node B: "
                f"{cores(self.node_b)}; the engine server and every client: not pinned")


@dataclass
class Group:
    """Brokers (``nodes``, by name) and other processes (``others``: name -> pid, e.g. the
    engine server) measured as one server. The publisher connects to ``pub_node``;
    subscriber ``i`` to ``sub_nodes[i % len(sub_nodes)]``; the latency scenario's echo to
    ``echo_node``. The server's CPU and busy share are the nodes' (summed: two nodes can be
    busy two cores' worth); ``member_sched_ns`` gives each process's, the others' too."""

    nodes: dict[str, procs.Server]
    others: dict[str, int] = field(default_factory=dict)
    pub_node: str = ""
    sub_nodes: list[str] = field(default_factory=list)
    echo_node: str = ""

    def __post_init__(self) -> None:
        first = next(iter(self.nodes))
        self.pub_node = self.pub_node or first
        self.sub_nodes = self.sub_nodes or [self.pub_node]
        self.echo_node = self.echo_node or self.pub_node

    @property
    def port(self) -> int:
        return self.nodes[self.pub_node].port

    @property
    def echo_port(self) -> int:
        return self.nodes[self.echo_node].port

    def port_for(self, protocol: str) -> int:
        return self.port

    def subscriber_ports(self, protocol: str, count: int) -> list[int]:
        return [self.nodes[self.sub_nodes[i % len(self.sub_nodes)]].port for i in range(count)]

    def cpu_seconds(self) -> float:
        return sum(node.cpu_seconds() for node in self.nodes.values())

    def rss_kib(self) -> int:
        return sum(node.rss_kib() for node in self.nodes.values())

    def sched_ns(self) -> tuple[int, int]:
        run = wait = 0
        for node in self.nodes.values():
            r, w = node.sched_ns()
            run, wait = run + r, wait + w
        return run, wait

    def member_sched_ns(self) -> dict[str, tuple[int, int]]:
        out = {name: node.sched_ns() for name, node in self.nodes.items()}
        out.update({name: procs.sched_ns(pid) for name, pid in self.others.items()})
        return out

    def log_problems(self) -> list[str]:
        """What the servers logged that looks like an error, and each time a node took
        another for gone (in a throughput run, its subscribers' messages stop crossing
        until the other node is heard again)."""
        out = [f"{name}: {line}" for name, node in self.nodes.items()
               for line in node.log_problems()]
        for name, node in self.nodes.items():
            with contextlib.suppress(OSError):
                for line in node.log.read_text(errors="replace").splitlines():
                    at = line.find("cluster: node ")
                    if at >= 0 and " is gone (" in line and "(left)" not in line:
                        out.append(f"{name}: {line[at + len('cluster: '):]}")
        return out


@contextlib.contextmanager
def single(python: str, directory: Path, cpus: set[int] | None) -> Iterator[Group]:
    """One unclustered node."""
    with procs.Broker(python, directory / "single.log", cpus, []) as node:
        yield Group({"node": node})


@contextlib.contextmanager
def mosquitto(binary: str, directory: Path, cpus: set[int] | None) -> Iterator[Group]:
    """Mosquitto (its queue limit off, as run.py's default: QoS 0 messages to a reader that
    is behind are queued, not silently dropped)."""
    work = directory / "mosquitto"
    work.mkdir()
    with procs.Mosquitto(binary, work, cpus, 0) as server:
        yield Group({"mosquitto": server})


@contextlib.contextmanager
def cluster(python: str, directory: Path, engine: str, pinning: Pinning,
            heartbeat: float = HEARTBEAT, node_timeout: float = 0.0) -> Iterator[Group]:
    """Two nodes, A and B, joined through a fresh engine server; the Group publishes on A
    and subscribes on B (change ``pub_node``/``sub_nodes``/``echo_node`` as needed).
    ``node_timeout``: the nodes' ``--cluster-node-timeout`` (0: theirs, 1.5 heartbeats)."""
    with contextlib.ExitStack() as stack:
        server, url = engine_server(engine, directory)
        stack.callback(procs.stop_process, server)
        options = [f"--cluster={url}", f"--cluster-heartbeat={heartbeat:g}",
                   f"--cluster-node-timeout={node_timeout:g}"]
        a = stack.enter_context(procs.Broker(python, directory / "a.log", pinning.node_a,
                                             options))
        b = stack.enter_context(procs.Broker(python, directory / "b.log", pinning.node_b,
                                             options))
        yield Group({"A": a, "B": b}, {engine: server.pid}, pub_node="A", sub_nodes=["B"],
                    echo_node="B")


def wait_crossing(publish_on: procs.Server, subscribe_on: procs.Server, tag: str,
                  timeout: float = 30.0) -> float:
    """Until a probe published on ``publish_on`` reaches a probe subscriber on
    ``subscribe_on`` (subscribed now): the publishing node then has every announcement
    the other node made before the probe's subscription (announcements keep their
    sender's order), its members' interest and identities. Returns the seconds it took.
    ``tag`` makes the probes' identities and topic unique."""
    t0 = time.monotonic()
    topic = f"probe-{tag}".encode()
    with contextlib.ExitStack() as stack:
        sub = stack.enter_context(open_client(
            subscribe_on.port, b"LOGIN psub-%s open\nSUBSCRIBE %s\n" % (tag.encode(), topic),
            b"200\n200\n"))
        pub = stack.enter_context(open_client(
            publish_on.port, b"LOGIN ppub-%s open\n" % tag.encode(), b"200\n"))
        sub.settimeout(0.05)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            pub.sendall(b"MCAST %s x\n" % topic)
            reply = b""
            while len(reply) < 4:  # the probe's 200
                pub.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = pub.recv(4 - len(reply))
                if not chunk:
                    raise BenchError("a probe's node closed its connection")
                reply += chunk
            try:
                if sub.recv(4096):
                    return time.monotonic() - t0
            except TimeoutError:
                continue
    raise BenchError(f"a node never learned the other's interest ({tag})")


def both_ways(group: Group, tag: str) -> None:
    """:func:`wait_crossing` from A to B and from B to A."""
    a, b = group.nodes["A"], group.nodes["B"]
    wait_crossing(a, b, f"{tag}-ab")
    wait_crossing(b, a, f"{tag}-ba")


@contextlib.contextmanager
def idle_peer(group: Group) -> Iterator[None]:
    """Node B with a member of its own, on a topic no bench client uses (so the cluster has
    state to replicate, and no interest in the bench's topics), once A has heard of it."""
    b = group.nodes["B"]
    with open_client(b.port, b"LOGIN elsewhere open\nSUBSCRIBE elsewhere\n",
                     b"200\n200\n"):
        wait_crossing(group.nodes["A"], b, "idle")
        yield
