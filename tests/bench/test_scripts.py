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
    assert found, out
    assert float(found[1]) < 4 * 0.3  # the target is 2 heartbeats; a loaded machine's margin
    assert "restart -> delivery median" in out
