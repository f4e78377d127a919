"""The sbus scenarios (12-16): msgbroker's sbus listener (unix SOCK_SEQPACKET) against
Mosquitto and SSMP at the same counts and payload sizes.

The clients (bench/sbus_clients.py) are raw AF_UNIX SOCK_SEQPACKET sockets in forked
processes; one packet per system call. Payloads carry their sequence number
(``wire.payload``): each subscriber checks every packet's length, compares a sample of them
and the last one byte for byte with what the publisher sent, and counts exactly N.

SUB has no answer, so a subscriber sends ``CMSG !/cred/whoami`` after it and waits for the
reply: the broker handles one client's packets in order, so the subscription is in place.

The Mosquitto and SSMP baselines are ``scenarios.publish_fanout`` with this module's counts
and payload size; 12-14 also run the relay floor (bench/sbus_floor.py) with these clients,
and 12-15, 24 and 25 the C reference sbusd (bench/sbus_ref.py) when it is given. 24 and 25
are 12 and 15 with the publisher rotating over 16 keys, each subscriber subscribed to all
16: no two consecutive packets share a key. The scenarios are registered in
``scenarios.SCENARIOS`` (see its end).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import statistics
import tempfile
from pathlib import Path

import procs
import sbus_floor
import sbus_ref
from clients import BenchError
from sbus_clients import (
    KEY,
    Child,
    clock,
    connect,
    drain,
    hung_up,
    publisher_main,
    reader_main,
    subscriber,
    wait_listening,
)
from wire import payload

#: what the stalled subscriber of ``sbus-discard`` sends: keep me, drop what is over the bound
HARD_DISCARD = b"blocking/hard/discard"
STALLED_RCVBUF = 4096  # as scenario 4's stalled subscriber

#: the broker variants: defaults; ``--max-backlog BOUND``; that and a stalled client
#: sending ``CMSG blocking/hard/discard`` (sbus-stalled only)
SBUS_KINDS = ("sbus", "sbus-bound", "sbus-discard")
NAMES = ["sbus-mcast", "sbus-mcast16", "sbus-mcast1k", "sbus-fanout", "sbus-stalled"]
#: 12 and 15 with the publisher rotating over :data:`MIXED_KEYS` keys (not in ``sbus``)
MIXED_NAMES = ["sbus-mixed", "sbus-mixed-fanout"]
MIXED_KEYS = 16
ALL_NAMES = NAMES + MIXED_NAMES
#: ``--scenarios sbus-ref``: every sbus scenario the C reference runs in
REF_NAMES = [*NAMES[:4], *MIXED_NAMES]


def add_options(p) -> None:
    sbus_ref.add_options(p)
    p.add_argument("--sbus-mcast-messages", type=int, help="scenarios 12-14 count [300000]")
    p.add_argument("--sbus-fanout-messages", type=int, help="scenarios 15, 16 count [100000]")
    p.add_argument("--sbus-subscribers", type=int, help="scenarios 15, 16 readers [10]")
    p.add_argument(
        "--sbus-batch",
        type=int,
        help="packets per system call in the sbus clients: recvmmsg/sendmmsg through ctypes "
        "above 1 [1: one recv/send per packet]",
    )
    p.add_argument(
        "--sbus-bound",
        type=int,
        help="scenario 16: the broker's --max-backlog for its bounded runs "
        "[1048576; --quick: a quarter]",
    )


def apply_options(params, args) -> None:
    for name in (
        "sbus_mcast_messages",
        "sbus_fanout_messages",
        "sbus_subscribers",
        "sbus_bound",
        "sbus_batch",
    ):
        if getattr(args, name):
            setattr(params, name, getattr(args, name))
    args.sbus_bound = params.sbus_bound  # start_broker reads it


# -- the broker ----------------------------------------------------------------------------


class SbusBroker(procs.Broker):
    """msgbroker with an sbus listener besides its SSMP one, ``--listen sbus=unix:PATH``,
    PATH in a fresh short directory under /tmp (AF_UNIX paths: 107 bytes at most)."""

    def __init__(
        self,
        python: str,
        log: Path,
        cpus,
        extra: list[str],
        kind: str,
        policy: str,
        timeout: float = 30.0,
    ) -> None:
        self.sbus_kind = kind
        self.policy = policy
        self.sbus_dir = tempfile.mkdtemp(prefix="sb", dir="/tmp")
        self.sbus_path = os.path.join(self.sbus_dir, "bus")
        try:
            listen = ["--listen", f"sbus=unix:{self.sbus_path}"]
            super().__init__(python, log, cpus, [*listen, *extra], timeout)
            line = b"sbus listening on unix:" + self.sbus_path.encode()
            wait_listening(self.proc, self.log, line, self.sbus_path, timeout, "the broker")
        except BaseException:
            if hasattr(self, "proc"):
                self.stop()
            shutil.rmtree(self.sbus_dir, ignore_errors=True)
            raise

    def stop(self) -> int:
        try:
            return super().stop()
        finally:
            shutil.rmtree(self.sbus_dir, ignore_errors=True)


def start_broker(kind: str, args, log: Path, cpus) -> SbusBroker:
    """The broker for one sbus run; ``sbus-bound``/``sbus-discard`` with ``--max-backlog``
    ``args.sbus_bound`` (the other broker options as given)."""
    backlog = args.max_backlog if kind == "sbus" else str(args.sbus_bound)
    extra = list(args.broker_arg)
    if backlog:
        extra += ["--max-backlog", backlog]
    if args.slow_consumer:
        extra += ["--slow-consumer", args.slow_consumer]
    hard = "discard" if args.slow_consumer == "drop" else "error"
    policy = (
        f"--max-backlog {backlog or '(default, 16 MiB)'}, --slow-consumer "
        f"{args.slow_consumer or '(default) disconnect'}: blocking/hard/{hard}"
    )
    if kind == "sbus-discard":
        policy += "; the stalled client sends CMSG blocking/hard/discard"
    return SbusBroker(args.python, log, cpus, extra, kind, policy)


def peak_rss_kib(pid: int) -> int:
    """VmHWM: the most resident memory ``pid`` has had (a fresh broker per run)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


# -- one run -------------------------------------------------------------------------------


def mixed_keys(count: int) -> list[bytes]:
    """``count`` routing keys of one length (so every packet has the same length)."""
    width = len(str(count - 1))
    return [KEY + b"%0*d" % (width, i) for i in range(count)]


def publish_sbus(
    server: SbusBroker | sbus_floor.Relay | sbus_ref.Sbusd,
    params,
    *,
    messages: int,
    subscribers: int,
    size: int,
    stalled: bool = False,
    around=None,
    keys: int = 1,
) -> dict:
    """1 publisher -> ``subscribers`` readers on sbus (plus, with ``stalled``, one subscriber
    first in order that never reads, its receive buffer 4 KiB). With ``keys`` > 1, message
    i goes to key ``i % keys`` (:func:`mixed_keys`), and every reader subscribes to all."""
    path = server.sbus_path
    timeout = params.idle_timeout
    names = [KEY] if keys == 1 else mixed_keys(keys)
    prefixes = [b"MSG " + key + b"\0" for key in names]

    def packet(i: int) -> bytes:
        return prefixes[i % keys] + payload(i, size)

    plen = len(prefixes[0]) + size
    step = max(1, messages // 1000)
    checks = [(c, packet(c - 1)) for c in range(step, messages, step)]
    checks.append((messages, packet(messages - 1)))
    if not params.verify:
        checks = checks[-1:]
    stalled_sock = None
    socks: list[socket.socket] = []
    readers: list[Child] = []
    try:
        if stalled:
            controls = (HARD_DISCARD,) if server.sbus_kind == "sbus-discard" else ()
            stalled_sock = subscriber(path, timeout, controls, rcvbuf=STALLED_RCVBUF)
        socks = [subscriber(path, timeout, keys=tuple(names)) for _ in range(subscribers)]
        data = b"".join(packet(i) for i in range(messages))
        while socks:  # each socket stays listed (closed at the end) until its child holds it
            sock = socks[0]
            batch = params.sbus_batch
            readers.append(Child(reader_main, (sock, messages, plen, checks, timeout, batch), sock))
            socks.pop(0)
        socks.append(connect(path, timeout))  # the publisher's
        rss_before = server.rss_kib()
        server_cpu = server.cpu_seconds()
        cores = procs.core_times()
        run0, wait0 = server.sched_ns()
        start = clock()
        with around() if around else contextlib.nullcontext():
            publisher = Child(
                publisher_main, (socks[0], data, plen, timeout, params.sbus_batch), socks[0]
            )
            socks.pop()
            deadline = start + params.scenario_timeout
            got = [r.finish(max(1.0, deadline - clock())) for r in readers]
            pub = publisher.finish(max(1.0, deadline - clock()))
        wall = clock() - start
        run1, wait1 = server.sched_ns()
        server_cpu = server.cpu_seconds() - server_cpu
        cores = procs.core_busy(cores, procs.core_times())
        reader_cpu = sum(g.get("cpu_seconds", 0.0) for g in got)
        done = [g for g in got if g.get("count") == messages and g.get("t_last") is not None]
        wrong = [g["wrong"] for g in got if g.get("wrong")]
        wrong += [f"{g['bad_length']} packets not {plen} B" for g in got if g.get("bad_length")]
        wrong += ["a packet beyond the last one" for g in got if g.get("extra")]
        result: dict = {
            "messages": messages,
            "subscribers": subscribers,
            "keys": keys,
            "payload_bytes": size,
            "frame_bytes": plen,
            "completed_subscribers": len(done),
            "framing_ok": not wrong,
            "verified": (
                f"every packet's length; every {step}th and the last byte for byte"
                if params.verify
                else "every packet's length; the last byte for byte"
            ),
            "first_mismatch": wrong[0] if wrong else None,
            "bytes_per_read": plen,  # one packet per packet read, by construction
            "client_batch": params.sbus_batch,
            "eof_subscribers": sum(1 for g in got if "end of stream" in str(g.get("error"))),
            "closed_how": [f"#{i} {g['error']}" for i, g in enumerate(got) if g.get("error")][:5],
            "timed_out": any("no packet" in str(g.get("error")) for g in got),
            "delivered": sum(g.get("count", 0) for g in got),
            "publisher": pub,
            "policy": server.policy,
            "rss_before_kib": rss_before,
            "cpu_window_s": wall,
            "server_cpu_s": server_cpu,
            "server_cpu_share": server_cpu / wall,
            "reader_cpu_share": reader_cpu / wall,
            "publisher_cpu_share": pub.get("cpu_seconds", 0.0) / wall,
            "core_busy": cores,
            # from the publisher's start to the last report (schedstat, exact): on its
            # core, and ready to run while its core ran something else
            "server_busy": (run1 - run0) / 1e9 / wall,
            "server_runq": (wait1 - wait0) / 1e9 / wall,
            "server_window_s": wall,
            "other_cpu_share": sum(cores.values())
            - (server_cpu + reader_cpu + pub.get("cpu_seconds", 0.0)) / wall,
        }
        if len(done) == subscribers:
            t_first = min(g["t_first"] for g in done)
            t_last = max(g["t_last"] for g in done)
            result["elapsed_s"] = t_last - t_first
            result["deliveries_per_s"] = subscribers * messages / (t_last - t_first)
            result["per_subscriber_per_s"] = messages / (t_last - t_first)
            result["from_start_s"] = t_last - start
            result["deliveries_per_s_from_start"] = subscribers * messages / (t_last - start)
            result["server_cpu_per_delivery_us"] = 1e6 * server_cpu / (subscribers * messages)
        if stalled_sock is not None:
            result["stalled_disconnected"] = hung_up(stalled_sock, 1.0)
        result["rss_after_kib"] = server.rss_kib()
        result["rss_peak_kib"] = peak_rss_kib(server.pid)
        if stalled_sock is not None:  # after the memory figures: reading lets the broker send
            result["stalled_received"], result["stalled_end"] = drain(stalled_sock)
        if pub.get("error"):
            raise BenchError(f"publisher: {pub['error']}")
        return result
    finally:
        for sock in [*socks, *([stalled_sock] if stalled_sock else [])]:
            sock.close()
        for reader in readers:  # after an error: they time out on their own
            if reader.proc.is_alive():
                reader.proc.terminate()


def _run(
    server,
    proto,
    params,
    *,
    messages: int,
    subscribers: int,
    size: int,
    stalled: bool = False,
    around=None,
    keys: int = 1,
) -> dict:
    if isinstance(server, (SbusBroker, sbus_floor.Relay, sbus_ref.Sbusd)):
        return publish_sbus(
            server,
            params,
            messages=messages,
            subscribers=subscribers,
            size=size,
            stalled=stalled,
            around=around,
            keys=keys,
        )
    import scenarios  # a cycle otherwise: scenarios registers this module's scenarios

    # as many topics as sbus's publisher uses keys
    base = dataclasses.replace(params, payload_size=size, topics=keys)
    result = scenarios.publish_fanout(
        server,
        proto,
        base,
        messages=messages,
        subscribers=subscribers,
        stalled=stalled,
        around=around,
    )
    result["payload_bytes"] = size
    result["rss_peak_kib"] = peak_rss_kib(server.pid)
    return result


def sbus_mcast(server, proto, params, around=None, size: int = 64) -> dict:
    """12-14. 1 -> 1: msgs/s at the subscriber, broker CPU per delivery."""
    return _run(
        server,
        proto,
        params,
        messages=params.sbus_mcast_messages,
        subscribers=1,
        size=size,
        around=around,
    )


def sbus_mcast16(server, proto, params, around=None) -> dict:
    return sbus_mcast(server, proto, params, around, size=16)


def sbus_mcast1k(server, proto, params, around=None) -> dict:
    return sbus_mcast(server, proto, params, around, size=1024)


def sbus_fanout(server, proto, params, around=None) -> dict:
    """15. 1 -> 10 (``sbus_subscribers``): deliveries/s, broker CPU per delivery."""
    return _run(
        server,
        proto,
        params,
        messages=params.sbus_fanout_messages,
        subscribers=params.sbus_subscribers,
        size=64,
        around=around,
    )


def sbus_mixed(server, proto, params, around=None) -> dict:
    """24. as 12, the publisher rotating over 16 keys."""
    return _run(
        server,
        proto,
        params,
        messages=params.sbus_mcast_messages,
        subscribers=1,
        size=64,
        around=around,
        keys=MIXED_KEYS,
    )


def sbus_mixed_fanout(server, proto, params, around=None) -> dict:
    """25. as 15, the publisher rotating over 16 keys."""
    return _run(
        server,
        proto,
        params,
        messages=params.sbus_fanout_messages,
        subscribers=params.sbus_subscribers,
        size=64,
        around=around,
        keys=MIXED_KEYS,
    )


def sbus_stalled(server, proto, params, around=None) -> dict:
    """16. as 15, plus one subscriber that never reads."""
    result = _run(
        server,
        proto,
        params,
        messages=params.sbus_fanout_messages,
        subscribers=params.sbus_subscribers,
        size=64,
        stalled=True,
        around=around,
    )
    if isinstance(server, SbusBroker) and server.sbus_kind != "sbus":
        result["bound_bytes"] = params.sbus_bound
    return result


SCENARIOS = {
    "sbus-mcast": (12, "sbus publish 1->1, 64 B payloads", sbus_mcast),
    "sbus-mcast16": (13, "sbus publish 1->1, 16 B payloads", sbus_mcast16),
    "sbus-mcast1k": (14, "sbus publish 1->1, 1 KiB payloads", sbus_mcast1k),
    "sbus-fanout": (15, "sbus fan-out 1->10", sbus_fanout),
    "sbus-stalled": (16, "sbus fan-out 1->10 plus a stalled subscriber", sbus_stalled),
    "sbus-mixed": (24, "sbus publish 1->1, 64 B, rotating over 16 keys", sbus_mixed),
    "sbus-mixed-fanout": (
        25,
        "sbus fan-out 1->10, 64 B, rotating over 16 keys",
        sbus_mixed_fanout,
    ),
}
#: the C reference (bench/sbus_ref.py; left out unless --sbusd/--sbusd-src) right after the
#: broker, and for 1->1 the relay floor (bench/sbus_floor.py)
KINDS = {name: ["sbus", sbus_ref.KIND, "ssmp", "mosquitto"] for name in NAMES + MIXED_NAMES}
for _name in NAMES[:3]:
    KINDS[_name] = ["sbus", sbus_ref.KIND, sbus_floor.KIND, "ssmp", "mosquitto"]
KINDS["sbus-mixed"] = ["sbus", sbus_ref.KIND, sbus_floor.KIND, "ssmp", "mosquitto"]
KINDS["sbus-stalled"] = ["sbus", "sbus-bound", "sbus-discard", "mosquitto"]
#: run.py aliases: numbers, and ``sbus`` for the five of 12-16 (``sbus-ref``: 12-15, 24, 25)
ALIASES = {str(number): name for name, (number, _, _) in SCENARIOS.items()}


# -- reporting -----------------------------------------------------------------------------


def _mib(kib: float) -> str:
    return f"{kib / 1024:,.1f}"


def describe_extra(name: str, r: dict) -> str:
    """What run.describe's throughput line leaves out: payload size, memory, the stalled
    subscriber's fate."""
    text = f"; payload {r.get('payload_bytes', '?')} B"
    if "rss_peak_kib" in r and name in ("sbus-fanout", "sbus-stalled", "sbus-mixed-fanout"):
        text += (
            f"; server RSS {_mib(r['rss_before_kib'])} -> peak {_mib(r['rss_peak_kib'])}"
            f" -> {_mib(r['rss_after_kib'])} MiB"
        )
    if name == "sbus-stalled" and "stalled_disconnected" in r:
        text += f"; stalled one disconnected: {'yes' if r['stalled_disconnected'] else 'no'}"
        if "stalled_received" in r:
            text += (
                f", it read {r['stalled_received']:,} of {r['messages']:,} afterwards "
                f"({r['stalled_end']})"
            )
        if r.get("policy"):
            text += f" [{r['policy']}]"
    return text


SUMMARY = {
    name: [
        ("deliveries_per_s", "msgs/s", True),
        ("deliveries_per_s_from_start", "msgs/s from the publisher's start", True),
        ("server_cpu_per_delivery_us", "server CPU us per delivery", False),
    ]
    for name in [*NAMES[:3], "sbus-mixed"]
}
SUMMARY["sbus-fanout"] = SUMMARY["sbus-mixed-fanout"] = [
    ("deliveries_per_s", "deliveries/s", True),
    ("deliveries_per_s_from_start", "deliveries/s from the publisher's start", True),
    ("server_cpu_per_delivery_us", "server CPU us per delivery", False),
    ("rss_peak_kib", "server peak RSS KiB (VmHWM)", False),
]
SUMMARY["sbus-stalled"] = [
    ("per_subscriber_per_s", "msgs/s per reader", True),
    ("server_cpu_per_delivery_us", "server CPU us per delivery", False),
    ("rss_peak_kib", "server peak RSS KiB (VmHWM)", False),
]


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def ratios(name: str, key: str, by_kind: dict) -> str:
    """sbus/sbusd (the broker against the C reference; issue 16's goal: >= 1x), sbus/relay
    (12-14: against the relay floor), sbus/mosquitto and sbus/ssmp (medians)."""
    ours = _median(by_kind.get("sbus", []), key)
    if ours is None or name == "sbus-stalled":
        return ""
    text = ""
    for kind in (sbus_ref.KIND, sbus_floor.KIND, "mosquitto", "ssmp"):
        theirs = _median(by_kind.get(kind, []), key)
        if theirs:
            text += f"; sbus/{kind} {ours / theirs:.2f}x"
            if kind == sbus_ref.KIND and key == "deliveries_per_s":
                text += f" (target >= 1x: {'met' if ours >= theirs else 'NOT met'})"
    return text


def print_extra(name: str, results: dict, params) -> None:
    """sbus-stalled: the readers' slow-down against sbus-fanout's in the same repetition,
    the stalled client's fate, and the broker's memory against the bound."""
    if name != "sbus-stalled":
        return
    base = results.get("sbus-fanout", {})
    for kind, runs in results[name].items():
        base_runs = base.get("mosquitto" if kind == "mosquitto" else "sbus", [])
        impacts = [
            1 - r["per_subscriber_per_s"] / b["per_subscriber_per_s"]
            for r, b in zip(runs, base_runs, strict=False)
            if "per_subscriber_per_s" in r and "per_subscriber_per_s" in b
        ]
        if impacts:
            each = ", ".join(f"{100 * i:+.1f}%" for i in impacts)
            target = "" if kind == "mosquitto" else " (target < 10%)"
            print(
                f"    {kind}: readers' slow-down vs [15]'s per-subscriber rate (negative: "
                f"faster), per run: {each}; median {100 * statistics.median(impacts):+.1f}%"
                f"{target}"
            )
        for r in runs:
            if "error" in r:
                continue
            grown = r["rss_peak_kib"] - r["rss_before_kib"]
            bound = r.get("bound_bytes")
            text = (
                f"    {kind}: stalled one disconnected: "
                f"{'yes' if r.get('stalled_disconnected') else 'no'}; peak RSS "
                f"{_mib(r['rss_peak_kib'])} MiB, {_mib(grown)} MiB over the start"
            )
            if bound:
                text += f" (bound {bound / 1048576:,.2f} MiB)"
            if "stalled_received" in r:
                text += f"; it read {r['stalled_received']:,} of {r['messages']:,} afterwards"
            print(text)
