"""msgbroker benchmark harness: SSMP (and STMP, Micromessage2) on msgbroker against MQTT 3.1.1
QoS 0 on Mosquitto.

    python bench/run.py [--only ssmp|mosquitto|stmp|mm2|sbus]
                        [--scenarios mcast,fanout,latency,stalled,idle,
                                     stmp-mcast,stmp-fanout,stmp-cross,
                                     mm2-mcast,mm2-ack,mm2-fanout,
                                     sbus-mcast,sbus-mcast16,sbus-mcast1k,sbus-fanout,
                                     sbus-stalled]
                        [--quick] [--repeat N] [--profile] [--python PATH]

Starts each server as a separate process (a fresh one per scenario), pinned to one core,
with the clients pinned to another, drives it with raw-socket clients sending pre-encoded
frames, and prints every figure with the ours/Mosquitto ratio. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import acl
import journal
import mixed
import procs
import sbus
import sbus_floor
import sbus_ref
import scenarios
from clients import BenchError
from profile_summary import format_summary, summarize, to_speedscope
from summary import (
    MM2_SCENARIOS,
    SATURATED,
    STMP_SCENARIOS,
    describe,
    print_comparison,
)
from wire import PROTOCOLS, check_mm2_against_codec, check_stmp_against_codec

HERE = Path(__file__).resolve().parent
ALIASES = {"1": "mcast", "2": "fanout", "3": "latency", "4": "stalled", "5": "idle",
           "6": "stmp-mcast", "7": "stmp-fanout", "8": "stmp-cross", "stmp": "stmp-all",
           "9": "mm2-mcast", "10": "mm2-ack", "11": "mm2-fanout", "mm2": "mm2-all",
           **sbus.ALIASES, "sbus": "sbus-all",
           "sbus-ref": "sbus-ref-all", **journal.ALIASES, **acl.ALIASES,
           **mixed.ALIASES}
DEFAULT_SCENARIOS = "mcast,fanout,latency,stalled,idle"
#: aliases that stand for several scenarios
GROUPS = {"stmp-all": STMP_SCENARIOS, "mm2-all": MM2_SCENARIOS, "sbus-all": sbus.NAMES,
          "sbus-ref-all": sbus.REF_NAMES,
          "acl-all": acl.NAMES, "mixed": ["mcast16", "fanout16", "many", "latency", "rr100"]}
#: what --only accepts
ONLY = ["ssmp", "mosquitto", "stmp", "mm2", "sbus", sbus_ref.KIND, sbus_floor.KIND]


def _only(text: str) -> list[str]:
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in ONLY]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"not among {','.join(ONLY)}: {text!r}")
    return wanted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", type=_only,
                   help="drive these servers/protocols only, comma-separated, of "
                        f"{','.join(ONLY)} (stmp: the STMP runs of 6-8 and 20-22; mm2: the "
                        "Micromessage2 runs of 9-11 and 20-22; sbus: msgbroker's sbus runs of "
                        "12-16, 24, 25; sbusd: the C reference's; relay: the relay floor's), "
                        "e.g. ssmp,mosquitto")
    p.add_argument(
        "--scenarios", default=DEFAULT_SCENARIOS,
        help="comma-separated names or numbers (1 mcast, 2 fanout, 3 latency, 4 stalled, "
             "5 idle, 6 stmp-mcast, 7 stmp-fanout, 8 stmp-cross, 9 mm2-mcast, 10 mm2-ack, "
             "11 mm2-fanout, 12 sbus-mcast, 13 sbus-mcast16, 14 sbus-mcast1k, "
             "15 sbus-fanout, 16 sbus-stalled, 17 journal, 18 acl-mcast, 19 acl-fanout, "
             "20 mcast16, 21 fanout16, 22 many, 23 rr100, 24 sbus-mixed, 25 sbus-mixed-fanout; "
             "'stmp' = 6,7,8, 'mm2' = 9,10,11, 'sbus' = 12-16, 'sbus-ref' = 12-15, 24, 25, "
             "'mixed' = 20-23 and 3, 'rr1' = 3) "
             f"[{DEFAULT_SCENARIOS}]",
    )
    p.add_argument("--quick", action="store_true", help="a tenth of every count (smoke test)")
    p.add_argument("--no-verify", action="store_true",
                   help="check only each stream's last frame, not every delivered byte")
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario and server; medians")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that has msgbroker installed [this one]")
    p.add_argument("--mosquitto", help="mosquitto binary [from PATH or /usr/sbin]")
    p.add_argument("--mosquitto-queue-limit", type=int, default=0,
                   help="mosquitto max_queued_messages; 0 = unlimited, so QoS 0 is never "
                        "dropped [0]")
    p.add_argument("--max-backlog", help="passed to the broker (bytes)")
    p.add_argument("--slow-consumer", choices=["drop", "disconnect"],
                   help="passed to the broker")
    p.add_argument("--broker-arg", action="append", default=[],
                   help="extra twistd msgbroker argument, repeatable")
    p.add_argument("--scrape-admin", action="store_true",
                   help="scrape /metrics once a second while each scenario runs (a separate "
                        "process), for a broker given --broker-arg=--admin=ENDPOINT")
    p.add_argument("--server-cpu", type=int, default=0, help="core for the server [0]")
    p.add_argument("--client-cpu", type=int, default=1, help="core for the clients [1]")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    p.add_argument("--mcast-messages", type=int, help="scenario 1 count [200000]")
    p.add_argument("--fanout-messages", type=int, help="scenario 2 count [20000]")
    p.add_argument("--stalled-messages", type=int, help="scenario 4 count [20000]")
    p.add_argument("--round-trips", type=int, help="scenario 3 count [5000]")
    p.add_argument("--idle-connections", type=int,
                   help="scenario 5 count [10000]; 50000 for issue 16's target")
    p.add_argument("--idle-window", type=int, help="scenario 5: logins in progress at once [100]")
    p.add_argument("--stmp-mcast-messages", type=int, help="scenario 6 count [300000]")
    p.add_argument("--stmp-fanout-messages", type=int, help="scenario 7 count [10000]")
    p.add_argument("--cross-messages", type=int, help="scenario 8 count [200000]")
    p.add_argument("--cross-subscribers", type=int, help="scenario 8 STMP subscribers [10]")
    p.add_argument("--mm2-mcast-messages", type=int, help="scenario 9 count [300000]")
    p.add_argument("--mm2-ack-messages", type=int, help="scenario 10 count [300000]")
    p.add_argument("--mm2-fanout-messages", type=int, help="scenario 11 count [10000]")
    sbus.add_options(p)
    p.add_argument("--many-messages", type=int, help="scenario 22 count, in all [200000]")
    p.add_argument("--many-clients", type=int,
                   help="scenario 22 publishers = topics = subscribers [100]")
    p.add_argument("--rr-pairs", type=int, help="scenario 23 request/reply pairs [100]")
    p.add_argument("--rr-round-trips", type=int,
                   help="scenario 23 round trips in all, after 5% as many warm-up ones [100000]")
    p.add_argument("--topics", type=int, default=1,
                   help="scenarios 1, 2, 4: the publisher cycles through this many topics, "
                        "all subscribed by every subscriber, so no two consecutive messages "
                        "share a topic [1]")
    p.add_argument("--nice", type=int, default=0,
                   help="change the harness's (and so the servers') niceness, and its "
                        "scheduler autogroup's, e.g. -10 as root on a machine shared with "
                        "other work [0]")
    p.add_argument("--quiet-below", type=float, default=0.3,
                   help="before each run, wait until the machine's load is below this many "
                        "cores [0.3]")
    p.add_argument("--quiet-wait", type=float, default=60.0,
                   help="wait at most this long for that, then run anyway [60 s]; 0 = never")
    p.add_argument("--profile", action="store_true",
                   help="py-spy record the broker during scenarios 1, 2, 6, 7, 9-15, 20-25")
    p.add_argument("--profile-rate", type=int, default=250, help="py-spy samples/s [250]")
    p.add_argument("--results", type=Path, default=HERE / "results",
                   help="where logs, JSON results and profiles go [bench/results]")
    args = p.parse_args(argv)
    names = []
    for raw in args.scenarios.split(","):
        item = ALIASES.get(raw.strip(), raw.strip())
        if item in GROUPS:
            names += GROUPS[item]
            continue
        if item not in scenarios.SCENARIOS:
            p.error(f"unknown scenario {item!r}")
        names.append(item)
    if "stalled" in names and "fanout" not in names:
        names.insert(names.index("stalled"), "fanout")  # its baseline, in the same run
    if "sbus-stalled" in names and "sbus-fanout" not in names:
        names.insert(names.index("sbus-stalled"), "sbus-fanout")
    args.names = list(dict.fromkeys(names))  # in the order given
    return args


def cpu_sets(args: argparse.Namespace) -> tuple[set[int] | None, set[int] | None]:
    if args.no_pin or not hasattr(os, "sched_getaffinity"):
        return None, None
    available = os.sched_getaffinity(0)
    if {args.server_cpu, args.client_cpu} <= available and args.server_cpu != args.client_cpu:
        return {args.server_cpu}, {args.client_cpu}
    print(f"note: cores {args.server_cpu}/{args.client_cpu} not both available "
          f"({sorted(available)}); not pinning")
    return None, None


def start_server(kind: str, args, server_cpus, stamp: str, tag: str) -> procs.Server:
    log_dir = args.results / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    if kind == sbus_floor.KIND:
        return sbus_floor.start_relay(log_dir / f"relay-{tag}.log", server_cpus)
    if kind == sbus_ref.KIND:
        return sbus_ref.start_sbusd(log_dir / f"sbusd-{tag}.log", server_cpus)
    if kind in sbus.SBUS_KINDS:
        return sbus.start_broker(kind, args, log_dir / f"broker-{tag}-{kind}.log", server_cpus)
    if kind in ("ssmp", "stmp", "ssmp->stmp", "mm2", journal.KIND, acl.KIND):
        extra = list(args.broker_arg)
        if tag.startswith("idle-"):
            # the harness answers no ping: no keepalive within the run (MQTT's is off too);
            # and the connections wait for their login until every one was accepted
            extra += ["--keepalive", "600", "--login-timeout", "600"]
        if args.max_backlog:
            extra += ["--max-backlog", args.max_backlog]
        if args.slow_consumer:
            extra += ["--slow-consumer", args.slow_consumer]
        if kind == journal.KIND:
            return journal.start_broker(args, log_dir / f"broker-{tag}-{kind}.log", server_cpus,
                                        extra)
        if kind == acl.KIND:
            return acl.start_broker(args, log_dir / f"broker-{tag}-{kind}.log", server_cpus,
                                    extra)
        return procs.Broker(args.python, log_dir / f"broker-{tag}.log", server_cpus, extra,
                            stmp=kind in ("stmp", "ssmp->stmp"), mm2=kind == "mm2",
                            scrape_admin=args.scrape_admin and any(
                                a == "--admin" or a.startswith("--admin=") for a in extra))
    binary = procs.find_mosquitto(args.mosquitto)
    if binary is None:
        raise BenchError("mosquitto not found (apt-get install -y mosquitto, or --mosquitto)")
    work = log_dir / f"mosquitto-{tag}"
    work.mkdir(exist_ok=True)
    return procs.Mosquitto(binary, work, server_cpus, args.mosquitto_queue_limit)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = scenarios.Params()
    if args.quick:
        params = params.quick()
    params.verify = not args.no_verify
    params.topics = max(1, args.topics)
    for option, attr in [
        ("mcast_messages", "mcast_messages"), ("fanout_messages", "fanout_messages"),
        ("stalled_messages", "stalled_messages"), ("round_trips", "latency_round_trips"),
        ("idle_connections", "idle_connections"), ("idle_window", "idle_window"),
        ("stmp_mcast_messages", "stmp_mcast_messages"),
        ("stmp_fanout_messages", "stmp_fanout_messages"),
        ("cross_messages", "cross_messages"), ("cross_subscribers", "cross_subscribers"),
        ("mm2_mcast_messages", "mm2_mcast_messages"), ("mm2_ack_messages", "mm2_ack_messages"),
        ("mm2_fanout_messages", "mm2_fanout_messages"),
    ]:
        if getattr(args, option):
            setattr(params, attr, getattr(args, option))
    sbus.apply_options(params, args)
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    server_cpus, client_cpus = cpu_sets(args)
    procs.pin_self(client_cpus)
    niceness = os.nice(args.nice) if args.nice else os.nice(0)
    if args.nice:
        procs.set_autogroup_nice(args.nice)
    nofile = procs.raise_nofile(params.idle_connections + 1000)
    if "idle" in args.names and nofile < params.idle_connections + 200:
        params.idle_connections = max(100, nofile - 200)
        print(f"note: RLIMIT_NOFILE is {nofile}: idle connections lowered to "
              f"{params.idle_connections}")
    kinds_of = {name: _kinds(name, args.only) for name in args.names}
    sbus_floor.prepare(kinds_of, args.results / stamp)  # builds the relay, or drops it
    sbus_ref.prepare(kinds_of, args, args.results / stamp)  # finds/builds sbusd, or drops it
    kinds = list(dict.fromkeys(k for ks in kinds_of.values() for k in ks))
    if any(k in ("stmp", "ssmp->stmp") for k in kinds):
        mismatch = check_stmp_against_codec()
        if mismatch:
            print(f"WARNING: the harness's STMP frames differ from msgbroker's codec: {mismatch}")
    if "mm2" in kinds:
        mismatch = check_mm2_against_codec()
        if mismatch:
            print(f"WARNING: the harness's Micromessage2 frames differ from msgbroker's codec: "
                  f"{mismatch}")

    profiling = "; PROFILING msgbroker in 1, 2, 6, 7, 9-15, 20-25 (perturbed figures)"
    profiling = profiling if args.profile else ""
    print(f"msgbroker bench {stamp}: {' '.join(sys.argv)}")
    print(f"  host {platform.node()} {platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}; broker python {args.python}")
    print(f"  server cores {sorted(server_cpus) if server_cpus else 'any'}, client cores "
          f"{sorted(client_cpus) if client_cpus else 'any'}; nice {niceness}; "
          f"RLIMIT_NOFILE {nofile}; "
          f"payload {params.payload_size} B; {params.topics} topic(s)"
          f"{'; QUICK' if args.quick else ''}"
          f"{profiling}")
    if "mosquitto" in kinds:
        print(f"  mosquitto {procs.find_mosquitto(args.mosquitto)}, max_queued_messages "
              f"{args.mosquitto_queue_limit}")
    print(f"  a throughput run whose server is busy less than {100 * SATURATED:.0f}% of its "
          "core over the measured window says NOT SATURATED: its figure is not the server's "
          "limit")

    results: dict[str, dict[str, list[dict]]] = {
        name: {kind: [] for kind in kinds_of[name]} for name in args.names
    }
    profiles: list[dict] = []
    # repetitions outermost, so that a scenario's runs are spread over time and scenario 4
    # runs right after its baseline (scenario 2) in every repetition
    for rep in range(args.repeat):
        for name in args.names:
            number, title, func = scenarios.SCENARIOS[name]
            run_note = f" (run {rep + 1}/{args.repeat})" if args.repeat > 1 else ""
            print(f"\n[{number}] {title}{run_note}", flush=True)
            for kind in kinds_of[name]:
                r = _run_one(args, params, name, func, kind, f"{name}-{rep}", server_cpus,
                             stamp, profiles)
                results[name][kind].append(r)
                print(f"  {kind:<10} {describe(name, r)}", flush=True)
                for line in r.get("log_problems", []):
                    print(f"      server log: {line[:160]}")

    how = f"median of {args.repeat} runs, best in brackets" if args.repeat > 1 else "one run"
    print(f"\n== summary ({how}) ==")
    for name in args.names:
        print_comparison(name, results, params, args.repeat)

    out = args.results / f"results-{stamp}.json"
    out.write_text(json.dumps(
        {"argv": sys.argv, "params": vars(params), "results": results, "profiles": profiles},
        indent=1, default=str,
    ))
    print(f"\nresults: {out}")
    return 0


def _kinds(name: str, only: list[str] | None) -> list[str]:
    """The servers/protocols scenario ``name`` drives, in order (``--only`` filters)."""
    kinds = scenarios.KINDS.get(name, ["ssmp", "mosquitto"])
    if only:
        kinds = [k for k in kinds
                 if any(o in k.split("->") or k.startswith(f"{o}-") for o in only)]
    return kinds


def _run_one(args, params, name, func, kind, tag, server_cpus, stamp, profiles) -> dict:
    quiet = None
    if args.quiet_wait > 0:
        load, waited = procs.wait_quiet(args.quiet_below, args.quiet_wait)
        quiet = {"background_cores": load, "waited_s": waited}
        if load > args.quiet_below:
            print(f"  ({kind}: machine still busy after {waited:.0f} s: {load:.2f} cores; "
                  "running anyway)")
    around = None
    # the msgbroker runs of the throughput scenarios (not Mosquitto's, not stmp-cross's,
    # which measures server CPU itself)
    if args.profile and kind in ("ssmp", "stmp", "mm2", "sbus") and name in PROFILED:
        # the kind in the name: one scenario profiles each of its servers (stmp, then mm2)
        around = _profiling(args, stamp, f"{tag}-{kind}", profiles)
    try:
        with start_server(kind, args, server_cpus, stamp, tag) as server:
            if around is not None:
                around = around(server)
            r = func(server, PROTOCOLS.get(kind), params, around=around)  # sbus: none
            problems = server.log_problems()
            if problems:
                r["log_problems"] = problems[:5]
            r["server_alive"] = server.alive()
            if around is not None:
                r["profiled"] = True
            if quiet is not None:
                r["before_run"] = quiet
    except (BenchError, OSError, RuntimeError, TimeoutError) as e:
        r = {"error": f"{type(e).__name__}: {e}"}
        traceback.print_exc(limit=3)
    return r


PROFILED = ("mcast", "fanout", "stmp-mcast", "stmp-fanout", *MM2_SCENARIOS, *mixed.NAMES,
            *sbus.REF_NAMES)


def _profiling(args, stamp: str, tag: str, profiles: list[dict]):
    """A factory: given the server, a context manager that profiles the publishing phase."""

    def bind(server: procs.Server):
        @contextlib.contextmanager
        def around():
            raw = args.results / stamp / f"profile-{tag}.txt"
            profiler = procs.Profiler(server.pid, raw, args.profile_rate)
            try:
                yield
            finally:
                path = profiler.stop()
                speedscope = to_speedscope(path, path.with_suffix(".speedscope.json"), tag)
                summary = summarize(path)
                summary["speedscope"] = str(speedscope)
                profiles.append({"scenario": tag, **summary})
                print(format_summary(summary, top=12))
                print(f"    speedscope: {speedscope}")

        return around

    return bind


if __name__ == "__main__":
    sys.exit(main())
