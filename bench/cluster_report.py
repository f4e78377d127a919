"""bench/cluster.py's output: one line per run, the per-stage tables of medians, and the
final table of issue 15's figures (markdown, to paste)."""

from __future__ import annotations

import argparse
import statistics

#: below this share of its core over the measured window, a process was not the limit
SATURATED = 0.9
#: windows shorter than this are not judged
SHORTEST_WINDOW = 0.2
THROUGHPUT = ("cross", "fanout", "idle", "spread")
TITLES = {
    "cross": "1. cross-node 1->1, {topics} topics: publisher on A, subscriber on B",
    "fanout": "2. fan-out 1->{subscribers}, {topics} topics: publisher on A, subscribers "
              "alternately on A and B",
    "idle": "3. a clustered node with no remote interest: 1->1, {topics} topics, all on A; "
            "B has a member on another topic",
    "spread": "5. aggregate fan-out, clients spread over the nodes: {spread_publishers} "
              "publishers x {spread_topics} topics -> {subscribers} subscribers",
}


def ok(r: dict) -> bool:
    if "error" in r:
        return False
    if "kill_s" in r:
        return True
    if "p50_us" in r:
        return r["wrong_answers"] == 0
    return "deliveries_per_s" in r and r["framing_ok"]


def rate(r: dict) -> float:
    return r["deliveries_per_s_from_start"]


def _busy(r: dict) -> str:
    members = r.get("members_busy", {})
    if not members:
        return ""
    parts = []
    short = r.get("server_window_s", 0.0) < SHORTEST_WINDOW
    for name, share in members.items():
        text = f"{name} {100 * share['busy']:.0f}%"
        idle = max(0.0, 1 - share["busy"] - share["runq"])
        if share["runq"] >= 0.05:
            text += f" (waiting {100 * share['runq']:.0f}%)"
        if name in ("node", "mosquitto") and share["busy"] < SATURATED and not short:
            text += (f" [NOT SATURATED: {100 * share['runq']:.0f}% waiting for its core, "
                     f"{100 * idle:.0f}% idle]")
        parts.append(text)
    nodes = [s["busy"] for n, s in members.items() if n in ("A", "B")]
    if len(nodes) == 2:
        parts.append(f"nodes {100 * sum(nodes):.0f}%")
    return (f"; busy over the window ({r['server_window_s']:.2f} s"
            f"{', too short to judge' if short else ''}): " + ", ".join(parts))


def run_line(stage: str, r: dict) -> str:
    background = f"; background {r['background_cores']:.2f} cores before the run"
    if r.get("log_problems"):
        background += f"; the servers logged: {' | '.join(r['log_problems'][:4])}"
    if "error" in r:
        return f"FAILED: {r['error']}{background}"
    if stage == "faults":
        return (f"kill -9 -> presence event {r['kill_s']:.2f} s "
                f"({r['kill_s'] / r['heartbeat']:.2f} heartbeats); engine restart -> "
                f"delivery {r['restart_s']:.2f} s{background}")
    if stage == "latency":
        wrong = f", {r['wrong_answers']} WRONG" if r["wrong_answers"] else ""
        return (f"p50 {r['p50_us']:.1f} us, p90 {r['p90_us']:.1f} us, p99 {r['p99_us']:.1f} "
                f"us, max {r['max_us']:.1f} us ({r['round_trips']} round trips after "
                f"{r['warmup']}{wrong}){background}")
    if "deliveries_per_s" not in r:
        return (f"INCOMPLETE: {r['completed_subscribers']}/{r['subscribers']} subscribers "
                f"complete, {r['delivered']:,} of {r['messages'] * r['subscribers']:,} "
                f"delivered ({'; '.join(r['closed_how'])}) timed out={r['timed_out']}"
                f"{background}")
    unit = "msgs/s" if r["subscribers"] == 1 else "deliveries/s"
    text = (f"{rate(r):,.0f} {unit} ({r['from_start_s']:.2f} s; first byte to last "
            f"{r['deliveries_per_s']:,.0f}); brokers' CPU "
            f"{r['server_cpu_per_delivery_us']:.2f} us/delivery{_busy(r)}; clients "
            f"{100 * (r['reader_cpu_share'] + r['publisher_cpu_share']):.0f}% of a core")
    if not r["framing_ok"]:
        text += f" [WRONG BYTES ({r['verified']}): {r['first_mismatch']}]"
    else:
        text += f"; checked {r['verified']}"
    return text + background


def _median(runs: list[dict], key) -> float | None:
    values = [key(r) for r in runs if ok(r)]
    return statistics.median(values) if values else None


def _member_median(runs: list[dict], name: str) -> float | None:
    return _median([r for r in runs if name in r.get("members_busy", {})],
                   lambda r: r["members_busy"][name]["busy"])


def _busy_median(runs: list[dict]) -> str:
    names = next((list(r["members_busy"]) for r in runs if r.get("members_busy")), [])
    parts = []
    for name in names:
        m = _member_median(runs, name)
        if m is not None:
            parts.append(f"{name} {100 * m:.0f}%")
    nodes = [_member_median(runs, n) for n in ("A", "B") if n in names]
    if len(nodes) == 2 and None not in nodes:
        parts.append(f"nodes {100 * sum(nodes):.0f}%")  # type: ignore[arg-type]
    return ", ".join(parts)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def _fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def summary(results: dict, args: argparse.Namespace, load: float) -> None:
    by_stage: dict[str, dict[str, list[dict]]] = {}
    for (stage, setup), runs in results.items():
        by_stage.setdefault(stage, {})[setup] = runs
    n = args.repeat
    print(f"Medians of {n} run(s) per setup; rates from the publisher's start; busy: each "
          "process's share of a core over the measured window (median); "
          f"{args.pinning.describe()}; background load before the runs: median {load:.2f} "
          "cores")
    final: list[tuple[str, str]] = []
    for stage, setups in by_stage.items():
        if stage in THROUGHPUT:
            _throughput(stage, setups, args, final)
        elif stage == "latency":
            _latency(setups, final)
        else:
            _faults(setups, final)
    print("\n| figure | value |\n|---|---|")
    for name, value in final:
        print(f"| {name} | {value} |")


def _throughput(stage: str, setups: dict, args: argparse.Namespace, final: list) -> None:
    unit = "msgs/s" if stage in ("cross", "idle") else "deliveries/s"
    print(f"\n{TITLES[stage].format(**vars(args))} ({unit})")
    single = _median(setups.get("single", setups.get("one-node", [])), rate)
    mosq = _median(setups.get("mosquitto", []), rate)
    print(f"  {'setup':13} {unit:>14} {'vs one node':>12} {'vs mosquitto':>13} "
          f"{'us/delivery':>12}  busy")

    def cpu(r: dict) -> float:
        return r["server_cpu_per_delivery_us"]

    single_cpu = _median(setups.get("single", setups.get("one-node", [])), cpu)
    for setup, runs in setups.items():
        m = _median(runs, rate)
        print(f"  {setup:13} {_fmt(m):>14} {_ratio(m, single):>12} {_ratio(m, mosq):>13} "
              f"{_fmt(_median(runs, cpu), 2):>12}  {_busy_median(runs)}")
        if setup in ("single", "one-node", "mosquitto"):
            continue
        engine = setup.split("-", maxsplit=1)[0]
        if m is None:
            final.append((f"{stage} {setup}", f"n/a: none of its {len(runs)} run(s) "
                          "completed (see the runs' lines)"))
            continue
        if stage == "cross":
            final.append((f"cross-node 1->1, {args.topics} topics, {engine} (msgs/s)",
                          f"{_fmt(m)}: {_ratio(m, single)} one node ({_fmt(single)}), "
                          f"{_ratio(m, mosq)} Mosquitto ({_fmt(mosq)}); busy "
                          f"{_busy_median(runs)}; "
                          f"{_busy_median(setups.get('mosquitto', []))}"))
        elif stage == "fanout":
            final.append((f"fan-out 1->{args.subscribers} split over A and B, {engine} "
                          "(deliveries/s)",
                          f"{_fmt(m)}: {_ratio(m, single)} one node ({_fmt(single)}), "
                          f"{_ratio(m, mosq)} Mosquitto ({_fmt(mosq)}); busy "
                          f"{_busy_median(runs)}; "
                          f"{_busy_median(setups.get('mosquitto', []))}"))
        elif stage == "idle":
            ratio = m / single if m and single else None
            verdict = "" if ratio is None else (
                " (target >= 0.90x: met)" if ratio >= 0.9 else " (target >= 0.90x: NOT met)")
            per = _median(runs, cpu)
            final.append((f"clustered node, no remote interest, {engine} (msgs/s)",
                          f"{_fmt(m)} vs unclustered {_fmt(single)}: "
                          f"{_ratio(m, single)}{verdict}; CPU per message {_fmt(per, 2)} vs "
                          f"{_fmt(single_cpu, 2)} us ({_ratio(per, single_cpu)})"))
        else:
            how = ("clients placed by topic, nothing crosses" if setup.endswith("-own")
                   else "clients split, each topic's subscribers on both")
            final.append((f"two nodes ({engine}; {how}) vs one node on one core, aggregate "
                          "fan-out (deliveries/s)",
                          f"{_fmt(m)} vs {_fmt(single)}: {_ratio(m, single)}; busy "
                          f"{_busy_median(runs)} (one node: "
                          f"{_busy_median(setups.get('one-node', []))})"))


def _latency(setups: dict, final: list) -> None:
    print("\n4. UCAST round trip, one at a time (us)")
    print(f"  {'setup':13} {'p50':>9} {'p99':>9}")
    med = {}
    for setup, runs in setups.items():
        med[setup] = (_median(runs, lambda r: r["p50_us"]), _median(runs, lambda r: r["p99_us"]))
        print(f"  {setup:13} {_fmt(med[setup][0], 1):>9} {_fmt(med[setup][1], 1):>9}")
    for setup in setups:
        if not setup.endswith("-cross"):
            continue
        engine = setup[: -len("-cross")]
        same, cross = med.get(f"{engine}-same", (None, None)), med[setup]
        single = med.get("single", (None, None))
        print(f"  {engine} cross-node / same-node: p50 {_ratio(cross[0], same[0])}, p99 "
              f"{_ratio(cross[1], same[1])}")
        final.append((f"UCAST round trip, {engine}: cross-node p50/p99 (us)",
                      f"{_fmt(cross[0], 1)} / {_fmt(cross[1], 1)}; same node (clustered) "
                      f"{_fmt(same[0], 1)} / {_fmt(same[1], 1)}: {_ratio(cross[0], same[0])} / "
                      f"{_ratio(cross[1], same[1])}; unclustered node {_fmt(single[0], 1)} / "
                      f"{_fmt(single[1], 1)}"))


def _faults(setups: dict, final: list) -> None:
    print("\n6. faults (s)")
    for engine, runs in setups.items():
        kill = _median(runs, lambda r: r["kill_s"])
        restart = _median(runs, lambda r: r["restart_s"])
        heartbeat = runs[0].get("heartbeat", 1.0) if runs else 1.0
        beats = kill / heartbeat if kill is not None else None
        verdict = "" if beats is None else (": met" if beats <= 2 else ": NOT met")
        print(f"  {engine}: kill -9 -> presence event {_fmt(kill, 2)} s "
              f"({_fmt(beats, 2)} heartbeats of {heartbeat:g} s; target <= 2{verdict}); "
              f"engine restart -> delivery {_fmt(restart, 2)} s")
        final.append((f"{engine}: kill -9 -> presence event; restart -> delivery",
                      f"{_fmt(kill, 2)} s ({_fmt(beats, 2)} heartbeats, target <= 2"
                      f"{verdict}); {_fmt(restart, 2)} s"))
