"""Compare msgbroker builds in one invocation: ``run.py``'s scenarios against each build in
turn, interleaved (A, B, A, B, ...) so that the machine's noise falls on both alike.

    python bench/compare.py --build before=/path/old/.venv/bin/python \\
        --build after=.venv/bin/python --repeat 3 --only ssmp --scenarios mcast,fanout

Every ``run.py`` option after ``--`` is passed on. Prints, per scenario and figure, each
build's median and the ratio of every build to the first.

A build may add broker options of its own after the interpreter and a colon, so one
installation compares with itself under other options (each becomes a ``--broker-arg``;
write ``--option=value``)::

    python bench/compare.py --build off=$PWD/.venv/bin/python \\
        --build "on=$PWD/.venv/bin/python:--admin=tcp:0:interface=127.0.0.1" \\
        -- --only ssmp --scenarios mcast,fanout --scrape-admin
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", action="append", required=True,
                   metavar="LABEL=PYTHON[:BROKER-OPTIONS]",
                   help="a build: its label, the interpreter that has it installed, and "
                        "broker options only this build gets")
    p.add_argument("--repeat", type=int, default=3, help="runs per build [3]")
    p.add_argument("--results", type=Path, default=HERE / "results" / "compare")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- then run.py options")
    args = p.parse_args(argv)
    builds = []
    extras: dict[str, list[str]] = {}
    for text in args.build:
        label, python = text.split("=", 1)
        python, _, options = python.partition(":")
        builds.append((label, python))
        extras[label] = [f"--broker-arg={option}" for option in shlex.split(options)]
    passed = [a for a in args.rest if a != "--"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.results / stamp
    found: dict[str, list[dict]] = {label: [] for label, _ in builds}
    for rep in range(args.repeat):
        for label, python in builds:
            where = out_dir / f"{label}-{rep}"
            print(f"== {label} run {rep + 1}/{args.repeat}", flush=True)
            subprocess.run(
                [sys.executable, str(HERE / "run.py"), "--python", python,
                 "--results", str(where), *passed, *extras[label]],
                check=True,
            )
            (result,) = where.glob("results-*.json")
            found[label].append(json.loads(result.read_text())["results"])
    sys.path.insert(0, str(HERE))
    from summary import SUMMARY

    first = builds[0][0]
    print(f"\n== compare ({args.repeat} runs per build, medians; ratios to {first}) ==")
    for name in found[first][0]:
        for key, label, higher_better in SUMMARY[name]:
            for kind in found[first][0][name]:
                medians = {}
                for build, runs in found.items():
                    values = [r[key] for res in runs for r in res[name][kind] if key in r]
                    medians[build] = statistics.median(values) if values else None
                base = medians[first]
                parts = []
                for build, value in medians.items():
                    if value is None:
                        continue
                    ratio = f" ({value / base:.2f}x)" if base and build != first else ""
                    parts.append(f"{build} {value:,.1f}{ratio}")
                better = "" if higher_better else " (lower is better)"
                print(f"  {name} {kind} {label}: " + ", ".join(parts) + better)
    return 0


if __name__ == "__main__":
    sys.exit(main())
