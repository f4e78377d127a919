"""Issue 15's numbers, in one invocation: two cluster nodes against one node and against
Mosquitto, interleaved per repeat (every setup of every stage once per round), every
delivered byte checked.

    python bench/cluster.py --python $PWD/.venv/bin/python --repeat 3
    python bench/cluster.py --quick --repeat 1 --quiet-wait 0        # smoke run

Stages (``--stages``, in this order):

1. ``cross``: SSMP 1->1 over ``--topics`` (16) topics, the publisher on node A, the
   subscriber on node B (per engine of ``--engines``), against one unclustered node and
   Mosquitto (MQTT QoS 0, the same 1->1 16-topic workload).
2. ``fanout``: 1->100 over the same topics, the publisher on A, the subscribers alternately
   on A and B (50 each), against one node and Mosquitto with all 100.
3. ``idle``: 1->1 as in 1, everything on node A, joined to the engine while node B (with a
   member on another topic) has no interest in the bench's topics, against an unclustered
   node (target: within 10%).
4. ``latency``: UCAST round trips one at a time (run.py's ``latency``: after a warm-up),
   client and echo on one unclustered node, on the same node of a cluster, and on two nodes.
5. ``spread``: aggregate fan-out with the clients spread over the nodes (bench/
   cluster_spread.py): one node on one core against two nodes each on its own core, the
   clients split over them as a load balancer would (``ENGINE-two``: each topic's
   subscribers on both nodes) and placed by topic (``ENGINE-two-own``: nothing crosses).
6. ``faults``: bench/cluster_faults.py's kill -9 of a node -> the other node's presence
   event, and the engine server's restart -> cross-node delivery, per ``--fault-engines``.

Throughput figures are counted from the publisher's start to the last subscriber's last
byte (a node reads a chunk of publishes before its first delivery goes out, and a
cross-node delivery starts later still: first byte to last would leave that out); per run
the first-byte-to-last figure is printed too. Before a cluster's clock starts, probes
prove each node knows the other's subscribers (bench/cluster_setups.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import cluster_faults
import cluster_report
import cluster_setups as cs
import procs
import scenarios
from clients import BenchError
from cluster_spread import spread_fanout
from wire import MQTT, SSMP

STAGES = ["cross", "fanout", "idle", "latency", "spread", "faults"]


def setups_of(stage: str, args: argparse.Namespace) -> list[str]:
    engines = args.engine_list
    if stage in ("cross", "fanout"):
        return ["single", *(["mosquitto"] if args.mosquitto_binary else []), *engines]
    if stage == "idle":
        return ["single", *[f"{e}-idle" for e in engines]]
    if stage == "latency":
        return ["single", *[f"{e}-{w}" for e in engines for w in ("same", "cross")]]
    if stage == "spread":
        return ["one-node", *[f"{e}-two{w}" for e in engines for w in ("", "-own")]]
    return list(args.fault_engine_list)


def run_one(stage: str, setup: str, args: argparse.Namespace, params: scenarios.Params,
            directory: Path) -> dict:
    if stage == "faults":
        ns = argparse.Namespace(python=args.python, engine=setup, heartbeat=args.heartbeat)
        (directory / "kill").mkdir()
        (directory / "restart").mkdir()
        return {"kill_s": cluster_faults.kill_to_presence(ns, directory / "kill"),
                "restart_s": cluster_faults.restart_to_delivery(ns, directory / "restart"),
                "heartbeat": args.heartbeat}
    with contextlib.ExitStack() as stack:
        group = _start(setup, args, directory, stack)
        result = _measure(stage, setup, group, args, params, stack)
        # the servers are still up: what they logged that looks like an error
        result["log_problems"] = group.log_problems()
        return result


def _start(setup: str, args: argparse.Namespace, directory: Path,
           stack: contextlib.ExitStack) -> cs.Group:
    if setup in ("single", "one-node"):
        return stack.enter_context(cs.single(args.python, directory, args.pinning.node_a))
    if setup == "mosquitto":
        return stack.enter_context(cs.mosquitto(args.mosquitto_binary, directory,
                                                args.pinning.node_a))
    engine = setup.split("-", maxsplit=1)[0]
    return stack.enter_context(cs.cluster(args.python, directory, engine, args.pinning,
                                          node_timeout=args.node_timeout))


def _measure(stage: str, setup: str, group: cs.Group, args: argparse.Namespace,
             params: scenarios.Params, stack: contextlib.ExitStack) -> dict:
    clustered = len(group.nodes) == 2

    def ready() -> None:
        if clustered:
            cs.both_ways(group, "ready")

    proto = MQTT() if setup == "mosquitto" else SSMP()
    if stage == "cross":
        return scenarios.publish_fanout(group, proto, params, messages=args.messages,
                                        subscribers=1, topics=args.topics, ready=ready)
    if stage == "fanout":
        if clustered:
            group.sub_nodes = ["A", "B"]
        return scenarios.publish_fanout(group, proto, params, messages=args.fanout_messages,
                                        subscribers=args.subscribers, topics=args.topics,
                                        ready=ready)
    if stage == "idle":
        if clustered:
            group.sub_nodes = ["A"]
            stack.enter_context(cs.idle_peer(group))
        return scenarios.publish_fanout(group, proto, params, messages=args.messages,
                                        subscribers=1, topics=args.topics)
    if stage == "latency":
        if setup.endswith("-same"):
            group.echo_node = "A"

        @contextlib.contextmanager
        def around() -> Iterator[None]:
            if group.echo_node != group.pub_node:
                cs.both_ways(group, "echo")  # the echo logged in on B: A knows it
            yield

        return scenarios.latency(group, proto, params, around=around)
    return spread_fanout(group, params, publishers=args.spread_publishers,
                         subscribers=args.subscribers, topics_each=args.spread_topics,
                         messages=args.spread_messages, node_names=list(group.nodes),
                         ready=ready, own=setup.endswith("-own"))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=procs.default_python(),
                   help="the interpreter with msgbroker installed (an absolute path)")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--engines", default="redis", help="engines of stages 1-5: redis,nats")
    p.add_argument("--fault-engines", default="redis,nats")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="a tenth of every count not given, a shorter warm-up")
    p.add_argument("--topics", type=int, default=16, help="stages 1-3")
    p.add_argument("--messages", type=int, default=200_000, help="1->1 messages (1, 3)")
    p.add_argument("--fanout-messages", type=int, default=20_000, help="stage 2")
    p.add_argument("--subscribers", type=int, default=100, help="stages 2 and 5")
    p.add_argument("--round-trips", type=int, default=5_000, help="stage 4, after 200 more")
    p.add_argument("--spread-publishers", type=int, default=4, help="stage 5")
    p.add_argument("--spread-topics", type=int, default=4, help="stage 5, per publisher")
    p.add_argument("--spread-messages", type=int, default=40_000,
                   help="stage 5, per publisher")
    p.add_argument("--heartbeat", type=float, default=1.0, help="stage 6's nodes")
    p.add_argument("--node-timeout", type=float, default=0.0,
                   help="stages 1-5's nodes' --cluster-node-timeout (0: the broker's "
                        "default, 1.5 heartbeats)")
    p.add_argument("--a-cpu", type=int, default=0)
    p.add_argument("--b-cpu", type=int, default=1)
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--mosquitto", help="mosquitto's path (default: found on PATH)")
    p.add_argument("--quiet-below", type=float, default=0.3,
                   help="before each run, wait until the machine's load is below this")
    p.add_argument("--quiet-wait", type=float, default=60.0, help="... at most this long")
    p.add_argument("--json", type=Path, help="write every run's figures there")
    p.add_argument("--logs", type=Path,
                   help="keep the servers' logs in this directory (default: a temporary one)")
    p.add_argument("--nice", type=int, default=0,
                   help="the harness's (and so the servers') niceness and its scheduler "
                        "autogroup's, e.g. -10 as root on a machine shared with other work")
    args = p.parse_args(argv)
    if args.quick:  # a tenth of the counts left at their defaults
        for name in ("messages", "fanout_messages", "round_trips", "spread_messages"):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, getattr(args, name) // 10)
    args.stage_list = [s for s in args.stages.split(",") if s]
    unknown = set(args.stage_list) - set(STAGES)
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; there are {STAGES}")
    args.engine_list = [e for e in args.engines.split(",") if e]
    args.fault_engine_list = [e for e in args.fault_engines.split(",") if e]
    args.pinning = cs.Pinning(None, None) if args.no_pin else cs.Pinning({args.a_cpu},
                                                                        {args.b_cpu})
    args.mosquitto_binary = procs.find_mosquitto(args.mosquitto)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    params = scenarios.Params()
    params.latency_round_trips = args.round_trips
    params.latency_warmup = 200 if not args.quick else 50
    procs.raise_nofile(4096)
    niceness = os.nice(args.nice) if args.nice else os.nice(0)
    if args.nice:
        procs.set_autogroup_nice(args.nice)
    plan = [(stage, setup) for stage in args.stage_list for setup in setups_of(stage, args)]
    print(f"cluster bench: {args.repeat} round(s) of {len(plan)} runs; "
          f"{args.pinning.describe()}; nodes' heartbeat {cs.HEARTBEAT:g} s (stage 6: "
          f"{args.heartbeat:g} s), node timeout "
          f"{args.node_timeout or 1.5 * cs.HEARTBEAT:g} s; nice {niceness}", flush=True)
    if not args.mosquitto_binary and {"cross", "fanout"} & set(args.stage_list):
        print("  (mosquitto not found: no Mosquitto baseline; scripts/setup installs it)")
    results: dict[tuple[str, str], list[dict]] = {key: [] for key in plan}
    loads: list[float] = []
    with contextlib.ExitStack() as keep:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix="cluster-bench-", dir=args.logs)
        else:
            tmp = keep.enter_context(tempfile.TemporaryDirectory(prefix="cluster-bench-"))
        for rep in range(args.repeat):
            for stage, setup in plan:
                load, _ = procs.wait_quiet(args.quiet_below, args.quiet_wait)
                loads.append(load)
                directory = Path(tmp) / f"{stage}-{setup}-{rep}"
                directory.mkdir()
                try:
                    result = run_one(stage, setup, args, params, directory)
                except (BenchError, RuntimeError, OSError) as e:
                    result = {"error": f"{type(e).__name__}: {e}"}
                result["background_cores"] = load
                results[(stage, setup)].append(result)
                print(f"  {stage:7} {setup:13} run {rep + 1}: "
                      f"{cluster_report.run_line(stage, result)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(
            {"command": sys.argv, "runs": [{"stage": stage, "setup": setup, "runs": runs}
                                           for (stage, setup), runs in results.items()]},
            indent=1, default=str))
    failed = sum(1 for runs in results.values() for r in runs if not cluster_report.ok(r))
    print()
    cluster_report.summary(results, args, statistics.median(loads) if loads else 0.0)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    if failed:
        print(f"{failed} run(s) FAILED or INCOMPLETE (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
