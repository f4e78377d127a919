"""Scenario 17: what the journal (``--journal DIR``) costs SSMP publishing 1 -> 1.

The same run as scenario 1 (``mcast``: pipelined MCASTs of 64 B to one subscriber), against
a broker without a journal (``ssmp``) and one writing it (``ssmp-journal``: ``--journal``
into a fresh directory, removed when the broker stops), in the same invocation. The figure
is the journaled rate against the plain one (issue 6: it drops at most 10%), beside the
server CPU per delivery; each journaled run also reports what the journal wrote (segments
and bytes), so a journal that silently recorded nothing cannot pass for a cheap one.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

import procs
from wire import PROTOCOLS

KIND = "ssmp-journal"
NAMES = ["journal"]
PROTOCOLS[KIND] = PROTOCOLS["ssmp"]  # the same wire; only the broker differs
#: the journal's own rotation for the run: several segments within a run of a few seconds
ROTATE_SECONDS = "1"


class JournaledBroker(procs.Broker):
    """``procs.Broker`` with ``--journal`` into a directory of its own."""

    def __init__(self, python: str, log: Path, cpus, extra: list[str]) -> None:
        self.journal_dir = tempfile.mkdtemp(prefix="journal-")
        journal = ["--journal", self.journal_dir, "--journal-rotate-seconds", ROTATE_SECONDS]
        super().__init__(python, log, cpus, [*extra, *journal])

    def stop(self) -> int:
        if hasattr(self, "journal_written"):  # stopped already (the scenario does it)
            return self.proc.returncode
        status = super().stop()
        segments = list(Path(self.journal_dir).rglob("*.parquet"))
        self.journal_written = {
            "journal_segments": len(segments),
            "journal_bytes": sum(p.stat().st_size for p in segments),
        }
        shutil.rmtree(self.journal_dir, ignore_errors=True)
        return status


def start_broker(args, log: Path, cpus, extra: list[str]) -> JournaledBroker:
    return JournaledBroker(args.python, log, cpus, extra)


def journal(server, proto, params, around=None) -> dict:
    """17. scenario 1's run, with or without the journal."""
    import scenarios  # not at the top: scenarios imports this module to register it

    result = scenarios.mcast(server, proto, params, around=around)
    if isinstance(server, JournaledBroker):
        server.stop()
        result.update(server.journal_written)
    return result


SCENARIOS = {"journal": (17, "SSMP publish 1->1 with and without --journal", journal)}
KINDS = {"journal": ["ssmp", KIND]}
ALIASES = {"17": "journal"}
SUMMARY = {
    "journal": [
        ("deliveries_per_s", "msgs/s", True),
        ("server_cpu_per_delivery_us", "server CPU us per delivery", False),
    ]
}


def ratios(name: str, key: str, by_kind: dict) -> str:
    plain = _median(by_kind.get("ssmp", []), key)
    journaled = _median(by_kind.get(KIND, []), key)
    if not plain or journaled is None:
        return ""
    change = journaled / plain - 1
    target = " (target: a drop of at most 10%)" if key == "deliveries_per_s" else ""
    return f"; with the journal {100 * change:+.1f}%{target}"


def describe_extra(name: str, r: dict) -> str:
    if "journal_segments" not in r:
        return ""
    return f"; journal: {r['journal_segments']} segments, {r['journal_bytes']:,} B"


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None
