"""Aggregate py-spy's collapsed stacks (``--format raw --threads``) into hot-function tables,
and convert them to a speedscope file (https://www.speedscope.app, "sampled" profile).

Usage on its own: ``python bench/profile_summary.py bench/results/profile-*.txt``
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")
#: a leaf here is the reactor in epoll_wait (idle, or polling between reads)
IDLE_LEAVES = {"doPoll", "select", "poll", "wait", "_wait_for_tstate_lock"}
#: frames that wrap everything (the reactor loop and the log context), left out of the
#: inclusive table
WRAPPERS = {
    "run", "runApp", "startReactor", "runReactorWithLogging", "postApplication", "mainLoop",
    "<module>", "doPoll", "callWithLogger", "callWithContext", "_doReadOrWrite",
}


def _bare(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def parse(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def _short(frame: str, with_line: bool = False) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m["file"]
    for marker in ("/site-packages/", "/work/main/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
    line = f":{m['line']}" if with_line and m["line"] else ""
    return f"{m['name']} ({file}{line})"


def summarize(path: Path, top: int = 15) -> dict:
    """Samples of the busiest thread: share in epoll, and the top functions by self and
    inclusive samples (functions merged across lines)."""
    stacks = parse(path)
    per_thread: Counter[str] = Counter()
    for frames, count in stacks:
        thread = frames[0] if frames[0].startswith("thread (") else "-"
        per_thread[thread] += count
    main = per_thread.most_common(1)[0][0] if per_thread else "-"
    total = idle = 0
    self_fn: Counter[str] = Counter()
    self_line: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for stack, count in stacks:
        frames = stack
        if stack[0].startswith("thread ("):
            if stack[0] != main:
                continue
            frames = stack[1:]
        if not frames:
            continue
        total += count
        leaf = _FRAME.match(frames[-1])
        if leaf and _bare(leaf["name"]) in IDLE_LEAVES:
            idle += count
            continue
        self_fn[_short(frames[-1])] += count
        self_line[_short(frames[-1], with_line=True)] += count
        names = {_short(f) for f in frames if _bare(_FRAME.sub(r"\g<name>", f)) not in WRAPPERS}
        for name in names:
            incl[name] += count
    busy = total - idle
    return {
        "file": str(path),
        "samples": total,
        "idle_samples": idle,
        "busy_samples": busy,
        "self": self_fn.most_common(top),
        "self_lines": self_line.most_common(top),
        "inclusive": incl.most_common(top),
    }


def format_summary(summary: dict, top: int = 15) -> str:
    total = summary["samples"] or 1
    busy = summary["busy_samples"] or 1
    out = [
        f"    profile {summary['file']}: {summary['samples']} samples of the reactor thread, "
        f"{100 * summary['idle_samples'] / total:.1f}% in epoll_wait (idle or polling)",
        "    top self (% of busy samples):",
    ]
    out += [f"      {100 * n / busy:5.1f}%  {name}" for name, n in summary["self"][:top]]
    out.append("    top self, by line:")
    out += [f"      {100 * n / busy:5.1f}%  {name}" for name, n in summary["self_lines"][:top]]
    out.append("    top inclusive, reactor loop left out (% of busy samples):")
    out += [f"      {100 * n / busy:5.1f}%  {name}" for name, n in summary["inclusive"][:top]]
    return "\n".join(out)


def to_speedscope(path: Path, out: Path, name: str) -> Path:
    frames: list[dict] = []
    index: dict[str, int] = {}
    samples, weights = [], []
    for stack, count in parse(path):
        ids = []
        for frame in stack:
            if frame not in index:
                m = _FRAME.match(frame)
                entry = {"name": m["name"] if m else frame}
                if m:
                    entry["file"] = m["file"]
                    if m["line"]:
                        entry["line"] = int(m["line"])
                index[frame] = len(frames)
                frames.append(entry)
            ids.append(index[frame])
        samples.append(ids)
        weights.append(count)
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": [
            {
                "type": "sampled", "name": name, "unit": "none", "startValue": 0,
                "endValue": sum(weights), "samples": samples, "weights": weights,
            }
        ],
        "name": name,
        "exporter": "msgbroker bench/profile_summary.py",
    }
    out.write_text(json.dumps(doc))
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(format_summary(summarize(Path(arg))))
