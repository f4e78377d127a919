"""The issue-14 and issue-15 bench scripts run end to end, small, against a real broker
each starts: their figures are what a closing note quotes, so a change that breaks one (a
broker option, a log line they read) fails here, not on the day they are run."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).parents[2] / "bench"


def run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=BENCH.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def load(script: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the scripts import their neighbours (procs)
    try:
        spec = importlib.util.spec_from_file_location(script, BENCH / f"{script}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_checked_guesses_count_the_rate_limited_lines_and_what_they_stand_for():
    bruteforce = load("bruteforce")
    refused = "ssmp login refused for 'alice' from 127.0.0.1 (password): wrong password"
    log = "\n".join(
        [
            f"[msgbroker#info] {refused}",
            "[msgbroker#info] refused a login from 127.0.0.1",
            f"[msgbroker#info] {refused} (and 8 more like it since the last line)",
            "[msgbroker#info] ssmp login refused for 'bob' from 127.0.0.1 (password): x",
        ]
    )
    assert bruteforce.checked_guesses(log) == 1 + 1 + 8


def test_bruteforce_reports_answers_and_checked_guesses():
    out = run("bruteforce.py", "--connections", "4", "--seconds", "1")
    answered = re.search(r"answered: (\d+) LOGINs", out)
    checked = re.search(r"checked:  (\d+) guesses", out)
    assert answered and checked, out
    # the default throttle lets one address have a burst of 5 checked, then 5 a second
    assert 1 <= int(checked[1]) <= int(answered[1])
    assert "accepted after" in out


def test_reload_under_load_loses_nothing():
    out = run("reload.py", "--publishers", "20", "--rate", "400", "--seconds", "2")
    assert "SIGHUP: reloaded the configuration" in out, out
    figures = re.search(r"lost: (\d+)  duplicated: (\d+)  unexpected: (\d+)", out)
    assert figures and figures.groups() == ("0", "0", "0"), out
    assert "broker alive: True" in out


def test_mosquitto_and_msgbroker_on_the_mixed_workloads(tmp_path):
    """One quick invocation of the workloads real clients make (issue 16), against both
    servers: every run completes with its bytes checked, and every throughput run says how
    busy the server's core was (Mosquitto's baseline counts only when it is the limit)."""
    out = run(
        "run.py", "--quick", "--scenarios", "mcast16,many,rr100", "--only", "ssmp,mosquitto",
        "--quiet-wait", "0", "--results", str(tmp_path),
    )
    for word in ("FAILED", "INCOMPLETE", "WRONG"):
        assert word not in out, out
    runs = re.findall(r"^  (ssmp|mosquitto) +([\d,]+) (msgs|deliveries|round trips)/s", out, re.M)
    assert sorted(kind for kind, _, _ in runs) == ["mosquitto"] * 3 + ["ssmp"] * 3, out
    assert all(int(rate.replace(",", "")) > 0 for _, rate, _ in runs), out
    busy = re.findall(r"^  (ssmp|mosquitto) .*server busy (\d+)% of its core", out, re.M)
    assert len(busy) == 6, out
    assert "ssmp/mosquitto" in out, out


def test_the_many_publishers_check_finds_what_is_missing_doubled_or_out_of_order():
    mixed = load("mixed")
    wire = sys.modules["wire"]  # the one mixed imported (isinstance checks compare classes)
    proto, n, per, stride, size = wire.SSMP(), 3, 6, 0xFFFF, 16
    names = [f"bench{j:03d}" for j in range(n)]
    senders = [f"pub{p:03d}" for p in range(n)]
    frame_len = len(proto.delivered(senders[0], names[0], wire.payload(0, size)))
    check = mixed._stream_checker(proto, n, per, stride, size, names, senders, frame_len, 1)

    def frames(p):  # publisher p's messages to topic 0, in its order
        return [proto.delivered(senders[p], names[0], wire.payload(p * stride + j, size))
                for j in range((0 - p) % n, per, n)]

    interleaved = [f for pair in zip(*(frames(p) for p in range(n)), strict=True) for f in pair]
    assert check(0, bytearray(b"".join(interleaved))) is None
    assert check(0, bytearray(b"".join(frames(2) + frames(0) + frames(1)))) is None
    swapped = frames(0)[::-1] + frames(1) + frames(2)
    assert "after its message" in check(0, bytearray(b"".join(swapped)))
    doubled = interleaved[:-1] + interleaved[:1]
    assert "twice" in check(0, bytearray(b"".join(doubled)))
    stranger = [proto.delivered(senders[0], names[1], wire.payload(1, size)), *interleaved[1:]]
    assert "not expected" in check(0, bytearray(b"".join(stranger)))
    assert "frames, expected" in check(0, bytearray(b"".join(interleaved[:-1])))
    # Micromessage2: a delivery's sequence number is the subscriber's own count
    mm2 = wire.MM2()
    check = mixed._stream_checker(mm2, n, per, stride, size, names, senders,
                                  len(mm2.delivered("", names[0], wire.payload(0, size))), 1)
    renumbered = [wire.MM2.message(k + 1, names[0], wire.payload(p * stride + j, size))
                  for k, (p, j) in enumerate((p, j) for p in range(n)
                                             for j in range((0 - p) % n, per, n))]
    assert check(0, bytearray(b"".join(renumbered))) is None
def test_cluster_cross_node_runs_both_setups_and_checks_every_byte():
    out = run(
        "cluster_cross.py", "--engines", "nats", "--messages", "3000", "--repeat", "1",
        "--topics", "4", "--quiet-wait", "0", "--no-pin",
    )
    rows = dict(re.findall(r"^(single|nats)\s+([\d,]+)\s", out, re.MULTILINE))
    assert set(rows) == {"single", "nats"}, out


def test_cluster_faults_times_a_kill_and_a_restart():
    out = run("cluster_faults.py", "--engine", "nats", "--heartbeat", "0.3", "--repeat", "1")
    found = re.search(r"kill -9 -> UNSUBSCRIBE median ([\d.]+) s", out)
    assert found, out  # the figure itself is the bench's to report, not a test's to time
    assert "restart -> delivery median" in out


def test_cluster_bench_runs_every_stage_and_checks_every_byte():
    """bench/cluster.py, small: every stage's setups run once and complete with their bytes
    checked, and the final table has a figure for each of issue 15's numbers (the figures
    themselves are the bench's to report, not a test's to time)."""
    out = run(
        "cluster.py", "--quick", "--repeat", "1", "--quiet-wait", "0", "--no-pin",
        "--messages", "3000", "--fanout-messages", "300", "--subscribers", "20",
        "--round-trips", "200", "--spread-messages", "300", "--fault-engines", "redis",
        "--heartbeat", "0.3",
    )
    for word in ("FAILED", "INCOMPLETE", "WRONG"):
        assert word not in out, out
    runs = re.findall(r"^  (\w+) +([\w-]+) +run 1: ", out, re.MULTILINE)
    assert runs == [
        ("cross", "single"), ("cross", "mosquitto"), ("cross", "redis"),
        ("fanout", "single"), ("fanout", "mosquitto"), ("fanout", "redis"),
        ("idle", "single"), ("idle", "redis-idle"),
        ("latency", "single"), ("latency", "redis-same"), ("latency", "redis-cross"),
        ("spread", "one-node"), ("spread", "redis-two"), ("spread", "redis-two-own"),
        ("faults", "redis"),
    ], out
    assert len(re.findall(r"checked every byte of \d+ streams", out)) == 11, out
    table = out[out.index("| figure | value |"):]
    for figure in ("cross-node 1->1", "fan-out 1->20 split", "no remote interest",
                   "UCAST round trip", "aggregate fan-out", "kill -9 -> presence event"):
        assert figure in table, out
    assert "command: " in out, out
