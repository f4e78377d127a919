"""What bench/run.py prints of the results: each run's line, the saturation verdict, and
the summary over repeats (medians, best in brackets, ratios to Mosquitto and the issues'
targets). Split out of run.py, which runs the scenarios."""

from __future__ import annotations

import json
import statistics

import acl
import idle as idle_scenario
import journal
import mixed
import sbus
import scenarios

TARGETS = {
    ("mcast", "deliveries_per_s"): 1.5,
    ("fanout", "deliveries_per_s"): 5.0,
    # issue 3: STMP binary publish 1->1 >= 1.2x Mosquitto, fan-out 1->100 >= 4x
    ("stmp-mcast", "deliveries_per_s"): 1.2,
    ("stmp-fanout", "deliveries_per_s"): 4.0,
    # issue 4: Micromessage2 publish 1->1 >= 1.2x Mosquitto without acks, >= 0.8x with
    # batch-ack (window 100) on both sides; fan-out: no target given, the ratio is reported
    ("mm2-mcast", "deliveries_per_s"): 1.2,
    ("mm2-ack", "deliveries_per_s"): 0.8,
}
#: issue 3: SSMP -> STMP costs at most this much more server CPU per delivery than STMP -> STMP
CROSS_TARGET = 0.20
#: below this share of its core over a throughput run's measured window, the server was
#: not the limit: the clients were, or other work on its core (issue 16's bench note)
SATURATED = 0.9
#: a window shorter than this is too short to judge it by (a reactor turn, a time slice)
SHORTEST_WINDOW = 0.2

STMP_SCENARIOS = ["stmp-mcast", "stmp-fanout", "stmp-cross"]
MM2_SCENARIOS = ["mm2-mcast", "mm2-ack", "mm2-fanout"]


def fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value < 10:  # per-delivery microseconds: one decimal is 20% of the figure
        return f"{value:,.2f}"
    return f"{value:,.1f}"


def describe(name: str, r: dict) -> str:
    if "error" in r:
        return f"FAILED: {r['error']}"
    if name == "rr100":
        return mixed.describe(name, r) + saturation(r)
    if name in ("mcast", "fanout", "stalled", *STMP_SCENARIOS, *MM2_SCENARIOS, *sbus.ALL_NAMES,
                *journal.NAMES, *acl.NAMES, *mixed.THROUGHPUT):
        if "deliveries_per_s" not in r:
            return (f"INCOMPLETE: {r['completed_subscribers']}/{r['subscribers']} subscribers "
                    f"complete, {r['delivered']:,} of {r['messages'] * r['subscribers']:,} "
                    f"delivered, {r['eof_subscribers']} closed by the server "
                    f"{'(' + '; '.join(r['closed_how']) + ') ' if r['closed_how'] else ''}"
                    f"timed out={r['timed_out']}")
        one = r["subscribers"] == 1
        unit = "msgs/s" if one else "deliveries/s"
        per_sub = f", per subscriber {fmt(r['per_subscriber_per_s'])} msgs/s"
        text = (f"{fmt(r['deliveries_per_s'])} {unit} ({r['elapsed_s']:.3f} s"
                f"{per_sub if not one else ''})")
        if name in (*STMP_SCENARIOS, *MM2_SCENARIOS, *sbus.ALL_NAMES, *mixed.THROUGHPUT):
            text += (f"; from the publisher's start {fmt(r['deliveries_per_s_from_start'])} "
                     f"{unit} ({r['from_start_s']:.3f} s)")
        if name == "stmp-cross" or name in sbus.ALL_NAMES or name in acl.NAMES:
            text += (f"; server CPU {r['server_cpu_s']:.3f} s = "
                     f"{r['server_cpu_per_delivery_us']:.2f} us per delivery")
        text += (f"; CPU over {r['cpu_window_s']:.2f} s: server {100 * r['server_cpu_share']:.0f}%,"
                 f" readers {100 * r['reader_cpu_share']:.0f}%,"
                 f" publisher {100 * r['publisher_cpu_share']:.0f}%, anything else"
                 f" {100 * r['other_cpu_share']:.0f}% of a core;"
                 f" {fmt(r['bytes_per_read'])} B per read")
        if not (name == "stmp-cross" or name in sbus.ALL_NAMES or name in acl.NAMES):
            text += f"; server CPU {r['server_cpu_per_delivery_us']:.2f} us per delivery"
        text += saturation(r)
        pub = r.get("publisher", {})
        if r.get("ack_window") and pub.get("acks"):
            text += (f"; window {r['ack_window']}: {pub['acks']:,} acks to the publisher "
                     f"({r['messages'] / pub['acks']:.1f} messages each), it waited on a full "
                     f"window {pub['window_full']:,} times")
        if not r["framing_ok"]:
            text += f" [WRONG BYTES ({r['verified']} checked): {r['first_mismatch']}]"
        if name == "stalled":
            text += (f"; stalled one: {r['stalled_state']}"
                     f" (disconnected: {'yes' if r['stalled_disconnected'] else 'no'})"
                     + _queues(r)
                     + f"; server RSS {fmt(r['rss_before_kib'] / 1024)} -> "
                     f"{fmt(r['rss_after_kib'] / 1024)} MiB")
        if name in sbus.ALL_NAMES:
            text += sbus.describe_extra(name, r)
        text += journal.describe_extra(name, r)
        return text
    if name == "latency":
        return (f"p50 {r['p50_us']:.1f} us, p90 {r['p90_us']:.1f} us, p99 {r['p99_us']:.1f} us, "
                f"max {r['max_us']:.1f} us ({r['round_trips']} round trips"
                f"{', ' + str(r['wrong_answers']) + ' WRONG' if r['wrong_answers'] else ''}); "
                f"server CPU {r.get('server_cpu_per_round_trip_us', 0):.1f} us per round trip")
    if name == "idle":
        return idle_scenario.describe(r, fmt)
    return json.dumps(r)


def saturation(r: dict) -> str:
    """Whether the server was the limit: its time on its core over the measured window
    (first byte to last), from schedstat; below SATURATED, where the rest of the time went."""
    if "server_busy" not in r:
        return ""
    busy, runq = r["server_busy"], r["server_runq"]
    text = (f"; server busy {100 * busy:.0f}% of its core over the measured window "
            f"({r['server_window_s']:.2f} s)")
    if busy >= SATURATED:
        return text
    if r["server_window_s"] < SHORTEST_WINDOW:
        return text + " (too short to judge)"
    idle = max(0.0, 1 - busy - runq)
    why = []
    if runq >= 0.05:
        why.append(f"{100 * runq:.0f}% waiting for its core (other work on it)")
    if idle >= 0.05:
        why.append(f"{100 * idle:.0f}% idle (waiting for the clients)")
    return text + f" [NOT SATURATED: {', '.join(why) or 'below ' + str(SATURATED)}]"


def _queues(r: dict) -> str:
    if r.get("stalled_server_user_queue") is None:
        return ""
    kib = 1024
    return (f", its {r['messages'] * r['frame_bytes'] / kib:,.0f} KiB: client rcv queue "
            f"{r['stalled_client_queue'] / kib:,.0f} KiB, server kernel send queue "
            f"{r['stalled_server_kernel_queue'] / kib:,.0f} KiB, held by the server "
            f"{r['stalled_server_user_queue'] / kib:,.0f} KiB")


def median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


SUMMARY = {
    "mcast": [("deliveries_per_s", "msgs/s", True)],
    "fanout": [("deliveries_per_s", "deliveries/s", True)],
    "latency": [("p50_us", "p50 us", False), ("p99_us", "p99 us", False),
                ("server_cpu_per_round_trip_us", "server CPU us per round trip", False)],
    "stalled": [("per_subscriber_per_s", "msgs/s per reader", True),
                ("rss_after_kib", "server RSS KiB at end", False)],
    "idle": [("bytes_per_connection", "RSS bytes/connection", False),
             ("rss_after_kib", "server RSS KiB", False),
             ("accepts_per_s", "accepts/s from 0 to N", True),
             ("logins_per_s", "logins+subscribes/s from 0 to N", True)],
    "stmp-mcast": [("deliveries_per_s", "msgs/s", True),
                   ("deliveries_per_s_from_start", "msgs/s from the publisher's start", True)],
    "stmp-fanout": [("deliveries_per_s", "deliveries/s", True),
                    ("deliveries_per_s_from_start", "deliveries/s from the publisher's start",
                     True)],
    "stmp-cross": [("server_cpu_per_delivery_us", "server CPU us per delivery", False),
                   ("deliveries_per_s", "deliveries/s", True)],
    "mm2-mcast": [("deliveries_per_s", "msgs/s", True),
                  ("deliveries_per_s_from_start", "msgs/s from the publisher's start", True)],
    "mm2-ack": [("deliveries_per_s", "msgs/s", True),
                ("deliveries_per_s_from_start", "msgs/s from the publisher's start", True)],
    "mm2-fanout": [("deliveries_per_s", "deliveries/s", True),
                   ("deliveries_per_s_from_start", "deliveries/s from the publisher's start",
                    True)],
    **sbus.SUMMARY,
    **journal.SUMMARY,
    **acl.SUMMARY,
    **mixed.SUMMARY,
}


def _print_saturation(by_kind: dict) -> None:
    """Each server's time on its core over the measured windows, and whether Mosquitto's
    figure is its limit (a baseline only counts when it is)."""
    busy = {kind: [r["server_busy"] for r in runs
                   if "server_busy" in r and r["server_window_s"] >= SHORTEST_WINDOW]
            for kind, runs in by_kind.items()}
    if not any(busy.values()):
        return
    parts = [f"{kind} {100 * statistics.median(v):.0f}%" for kind, v in busy.items() if v]
    print("    server busy (median share of its core over the measured window, windows of "
          f"{SHORTEST_WINDOW} s or more): " + ", ".join(parts))
    theirs = busy.get("mosquitto")
    if theirs and min(theirs) < SATURATED:
        low = sum(v < SATURATED for v in theirs)
        print(f"    WARNING: Mosquitto was below {100 * SATURATED:.0f}% of its core in {low} of "
              f"{len(theirs)} runs: there its figure is not its limit, and the ratios to it "
              "overstate ours")


def _stmp_ratios(name: str, key: str, by_kind: dict) -> str:
    """stmp/mosquitto and ssmp/mosquitto (6, 7), mm2/mosquitto and ssmp/mosquitto (9-11);
    cross-protocol vs same-protocol (8)."""
    med = {kind: median_of(runs, key) for kind, runs in by_kind.items()}
    text = ""
    if name == "stmp-cross":
        # The target compares with STMP->STMP: the same deliveries (same bytes) from the
        # subscribers' own protocol. SSMP->SSMP is shown too; its deliveries are smaller
        # (85 B against 128 B with 64 B payloads), so it also measures the wire.
        cross = med.get("ssmp->stmp")
        for same_kind, label in (("stmp", "STMP->STMP"), ("ssmp", "SSMP->SSMP")):
            same = med.get(same_kind)
            if not same or cross is None:
                continue
            diff = cross / same - 1
            if key == "server_cpu_per_delivery_us" and same_kind == "ssmp":
                text += f"; SSMP->STMP vs {label} {100 * diff:+.1f}% per delivery (no target)"
            elif key == "server_cpu_per_delivery_us":
                ok = "met" if diff <= CROSS_TARGET else "NOT met"
                text += (f"; SSMP->STMP vs {label} {100 * diff:+.1f}% per delivery "
                         f"(target <= +{100 * CROSS_TARGET:.0f}%: {ok})")
            else:
                text += f"; SSMP->STMP vs {label} {100 * diff:+.1f}%"
        return text
    theirs = med.get("mosquitto")
    if not theirs:
        return text
    target = TARGETS.get((name, "deliveries_per_s"))
    lead = "mm2" if name in MM2_SCENARIOS else "stmp"
    for kind in (lead, "ssmp"):
        if med.get(kind) is not None:
            ratio = med[kind] / theirs
            text += f"; {kind}/mosquitto {ratio:.2f}x"
            if kind == lead and target:
                text += f" (target >= {target}x: {'met' if ratio >= target else 'NOT met'})"
    return text


def _figure(runs: list[dict], key: str, higher_better: bool, repeat: int) -> str:
    values = [r[key] for r in runs if key in r]
    if not values:
        return "n/a"
    text = fmt(statistics.median(values))
    if repeat > 1:
        best = max(values) if higher_better else min(values)
        text += f" [{fmt(best)}]"
    if len(values) < len(runs):
        text += f" ({len(runs) - len(values)} failed)"
    return text


def print_comparison(name: str, results: dict, params, repeat: int) -> None:
    number, title, _ = scenarios.SCENARIOS[name]
    by_kind = results[name]
    print(f"[{number}] {title}")
    for key, label, higher_better in SUMMARY[name]:
        parts = [f"{kind} {_figure(runs, key, higher_better, repeat)}"
                 for kind, runs in by_kind.items()]
        line = f"    {label}: " + ", ".join(parts)
        if name in STMP_SCENARIOS or name in MM2_SCENARIOS:
            line += _stmp_ratios(name, key, by_kind)
        elif name in sbus.ALL_NAMES:
            line += sbus.ratios(name, key, by_kind)
        elif name in journal.NAMES:
            line += journal.ratios(name, key, by_kind)
        elif name in acl.NAMES:
            line += acl.ratios(name, key, by_kind)
        elif name in mixed.NAMES:
            line += mixed.ratios(name, key, by_kind)
        elif set(by_kind) == {"ssmp", "mosquitto"}:
            ours = median_of(by_kind["ssmp"], key)
            theirs = median_of(by_kind["mosquitto"], key)
            if ours is not None and theirs:
                target = TARGETS.get((name, key))
                line += f"; ours/mosquitto {ours / theirs:.2f}x"
                line += f" (target >= {target}x)" if target else ""
                line += "" if higher_better else " (lower is better)"
        print(line)
    _print_saturation(by_kind)
    if name == "stalled":
        if params.stalled_messages != params.fanout_messages:
            print(f"    note: {params.stalled_messages} messages here vs "
                  f"{params.fanout_messages} in [2]")
        for kind, runs in by_kind.items():
            base_runs = results.get("fanout", {}).get(kind, [])
            impacts = [
                1 - r["per_subscriber_per_s"] / b["per_subscriber_per_s"]
                for r, b in zip(runs, base_runs, strict=False)
                if "per_subscriber_per_s" in r and "per_subscriber_per_s" in b
            ]
            if impacts:
                each = ", ".join(f"{100 * i:+.1f}%" for i in impacts)
                target = " (target < 10%)" if kind == "ssmp" else ""
                print(f"    {kind}: the 99 readers' slow-down vs [2]'s per-subscriber rate "
                      f"(negative: faster), per run: {each}; median "
                      f"{100 * statistics.median(impacts):+.1f}%{target}")
            states = []
            for r in runs:
                if "error" in r:
                    continue
                state = "yes" if r.get("stalled_disconnected") else "no"
                if r.get("stalled_server_user_queue") == 0:
                    state += " (all its unread bytes fit in kernel buffers: no backlog)"
                states.append(state)
            print(f"    {kind}: stalled subscriber disconnected: {', '.join(states)}")
    sbus.print_extra(name, results, params)
    if name == "idle":
        for kind, runs in by_kind.items():
            oks = ["ok" if r.get("ping_ok") else "FAILED" for r in runs]
            print(f"    {kind}: PING on a new connection: {', '.join(oks)}")

