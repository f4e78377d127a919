"""Cross-node 1->1 through a cluster engine: an SSMP publisher on node A, its subscriber on
node B, against the same 1->1 on one unclustered node, in one invocation (issue 15).

    python bench/cluster_cross.py --python .venv/bin/python                  # nats and redis
    python bench/cluster_cross.py --engines nats --repeat 5 --topics 16 --quick

Per repeat, every setup runs once (interleaved): ``single`` (publisher and subscriber on one
node, no cluster), and per engine ``ENGINE`` (two nodes joined through a fresh local
``nats-server`` or ``redis-server``). Node A runs on ``--a-cpu`` (0), node B on ``--b-cpu``
(1), the single node on ``--a-cpu``; the engine server and the clients are not pinned (two
nodes and a server share this 2-core machine: it is the cluster's own cost that shows, not
a spare core's). The scenario is run.py's ``mcast`` (bench/scenarios.py): the publisher
pipelines ``--messages`` MCASTs of 64 B over ``--topics`` topics, the subscriber checks
every byte; msgs/s at the subscriber. Before the clock starts, a probe subscribed on B
after the bench's subscriber must receive a probe published on A: A then knows B's
interest (announcements keep their sender's order).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import procs
import scenarios
from clients import BenchError, open_client, recv_exactly
from wire import SSMP, Mixed

HERE = Path(__file__).resolve().parent


class _Node(SSMP):
    """SSMP, on the listener of one named node (``port_for`` tells them apart)."""

    def __init__(self, node: str) -> None:
        self.name = node


class Pair:
    """Two brokers as one bench "server": subscribers on B, the publisher on A."""

    def __init__(self, a: procs.Broker, b: procs.Broker) -> None:
        self.a, self.b = a, b

    def port_for(self, protocol: str) -> int:
        return (self.a if protocol == "a" else self.b).port

    def cpu_seconds(self) -> float:
        return self.a.cpu_seconds() + self.b.cpu_seconds()

    def rss_kib(self) -> int:
        return self.b.rss_kib()

    def sched_ns(self) -> tuple[int, int]:
        """Both nodes' time on a core and waiting for one (their busy shares add up: the
        pair's "server busy" can reach 2 cores)."""
        (run_a, wait_a), (run_b, wait_b) = self.a.sched_ns(), self.b.sched_ns()
        return run_a + run_b, wait_a + wait_b


def engine_server(
    kind: str, directory: Path, port: int | None = None
) -> tuple[subprocess.Popen, str]:
    """A fresh ``nats-server`` or ``redis-server`` on loopback (on ``port``, or a free one)
    and its URL."""
    port = port or procs.free_port()
    if kind == "nats":
        binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")
        argv = [binary, "--addr", procs.HOST, "--port", str(port)]
        url = f"nats://{procs.HOST}:{port}"
    else:
        binary = shutil.which("redis-server")
        argv = [binary, "--bind", procs.HOST, "--port", str(port), "--save", "",
                "--appendonly", "no", "--client-output-buffer-limit", "pubsub 0 0 0"]
        url = f"redis://{procs.HOST}:{port}"
    if binary is None:
        raise BenchError(f"no {kind} server binary")
    proc = procs.spawn(argv, log=directory / f"{kind}-{time.monotonic_ns()}.log", cpus=None)
    procs.wait_connectable(port, proc, 30.0)
    return proc, url


def wait_interest(a: procs.Broker, b: procs.Broker, timeout: float = 30.0) -> None:
    """Until a probe published on A reaches a probe subscriber on B (subscribed after the
    bench's subscriber: A knows both)."""
    with contextlib.ExitStack() as stack:
        sub = stack.enter_context(open_client(b.port, b"LOGIN probe-sub open\nSUBSCRIBE probe\n",
                                              b"200\n200\n"))
        pub = stack.enter_context(open_client(a.port, b"LOGIN probe-pub open\n", b"200\n"))
        sub.settimeout(0.05)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pub.sendall(b"MCAST probe x\n")
            recv_exactly(pub, 4, 5.0)
            try:
                if sub.recv(4096):
                    return
            except TimeoutError:
                continue
    raise BenchError("node A never learned node B's interest")


def run_once(setup: str, args: argparse.Namespace, params: scenarios.Params,
             directory: Path) -> dict:
    a_cpu, b_cpu = ({args.a_cpu}, {args.b_cpu}) if not args.no_pin else (None, None)
    with contextlib.ExitStack() as stack:
        if setup == "single":
            node = stack.enter_context(procs.Broker(args.python, directory / "single.log",
                                                    a_cpu, []))
            return scenarios.mcast(node, SSMP(), params)
        server, url = engine_server(setup, directory)
        stack.callback(procs.stop_process, server)
        options = [f"--cluster={url}", "--cluster-heartbeat=1"]
        a = stack.enter_context(procs.Broker(args.python, directory / "a.log", a_cpu, options))
        b = stack.enter_context(procs.Broker(args.python, directory / "b.log", b_cpu, options))
        pair = Pair(a, b)

        @contextlib.contextmanager
        def interest_known() -> Iterator[None]:
            wait_interest(a, b)
            yield

        return scenarios.mcast(pair, Mixed(_Node("a"), _Node("b")), params,
                               around=interest_known)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=procs.default_python())
    p.add_argument("--engines", default="nats,redis")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--topics", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a tenth of the messages")
    p.add_argument("--a-cpu", type=int, default=0)
    p.add_argument("--b-cpu", type=int, default=1)
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--quiet-below", type=float, default=0.3)
    p.add_argument("--quiet-wait", type=float, default=60.0)
    args = p.parse_args(argv)
    params = scenarios.Params()
    params.mcast_messages = args.messages // (10 if args.quick else 1)
    params.topics = max(1, args.topics)
    setups = ["single", *[e for e in args.engines.split(",") if e]]
    found: dict[str, list[float]] = {s: [] for s in setups}
    cpu: dict[str, list[float]] = {s: [] for s in setups}
    print(f"SSMP 1->1, {params.mcast_messages:,} messages of {params.payload_size} B over "
          f"{params.topics} topic(s); {args.repeat} run(s) per setup", flush=True)
    with tempfile.TemporaryDirectory(prefix="cluster-cross-") as tmp:
        for rep in range(args.repeat):
            for setup in setups:
                load, _ = procs.wait_quiet(args.quiet_below, args.quiet_wait)
                directory = Path(tmp) / f"{setup}-{rep}"
                directory.mkdir()
                result = run_once(setup, args, params, directory)
                rate = result.get("deliveries_per_s")
                if rate is None:
                    raise BenchError(f"{setup}: incomplete run {result}")
                found[setup].append(rate)
                cpu[setup].append(result["server_cpu_per_delivery_us"])
                print(f"  {setup:8} run {rep + 1}: {rate:12,.0f} msgs/s, brokers' CPU "
                      f"{result['server_cpu_per_delivery_us']:.2f} µs/msg, busy "
                      f"{result.get('server_busy', 0.0):.2f} cores "
                      f"(background {load:.2f} cores)", flush=True)
    base = statistics.median(found["single"])
    print(f"{'setup':8} {'msgs/s':>12} {'vs single':>10} {'brokers µs/msg':>15}")
    for setup in setups:
        median = statistics.median(found[setup])
        print(f"{setup:8} {median:12,.0f} {median / base:9.2f}x "
              f"{statistics.median(cpu[setup]):15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
