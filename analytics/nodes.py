"""The report over several nodes' journals: which directories hold journals, and the
per-node tables.

A cluster's nodes journal each on their own (docs/journal.md, "Nodes"): into one shared
directory (every file and row names its node) or each into its own. The report reads any of
these: ``msgbroker analytics report DIR [DIR ...]``, where each ``DIR`` is a journal (it has
``messages/`` or ``sessions/``), or a directory of journals, one per subdirectory
(``/srv/journals/db1``, ``/srv/journals/db2``: :func:`journal_directories`).

Every table of the report is cluster-wide, a message counted once, where it was published
(grains.py). What is per node is :data:`NODE_TABLES`: ``nodes`` (one row per node: what
was published on it, what it received from others, its deliveries, sessions and refused
logins) and ``traffic_by_node_minute``; the page shows them only when there is more than
one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

#: the per-node tables, in the order index.html lists them
NODE_TABLES = ("nodes", "traffic_by_node_minute")
TRAFFIC_KINDS = ("mcast", "ucast", "bcast")
JOURNAL_TABLES = ("messages", "sessions")


def journal_directories(paths: Path | Iterable[Path]) -> list[Path]:
    """The journals ``paths`` name, in order, each once: a path with ``messages/`` or
    ``sessions/`` is one; a path without, whose subdirectories are journals, stands for
    those (sorted by name); anything else is kept as it is (a journal with nothing in it
    yet)."""
    given = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    found: list[Path] = []
    seen: set[Path] = set()
    for path in given:
        inner = [] if _is_journal(path) else sorted(filter(_is_journal, _subdirectories(path)))
        for journal in inner or [path]:
            key = journal.resolve()
            if key not in seen:
                seen.add(key)
                found.append(journal)
    return found


def _is_journal(path: Path) -> bool:
    return any((path / table).is_dir() for table in JOURNAL_TABLES)


def _subdirectories(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]


def node_tables(
    by_sender: pa.Table, span: pa.Table, sessions: pa.Table, failures: pa.Table
) -> dict[str, pa.Table]:
    """``nodes`` and ``traffic_by_node_minute`` from the ``by_sender``, ``span`` and
    ``failures`` grains and the report's ``sessions`` table. Traffic is the mcast, ucast and
    bcast rows, as everywhere in the report; skips and drops count every row, as in
    ``summary``."""
    traffic = _traffic(by_sender)
    by_minute = _sum(traffic, ["minute", "node"], ["messages", "received", "bytes"])
    by_minute = by_minute.filter(
        pc.greater(pc.add(by_minute.column("messages"), by_minute.column("received")), 0)
    ).sort_by([("minute", "ascending"), ("node", "ascending")])
    volume = _sum(traffic, ["node"], ["messages", "received", "bytes", "delivered"])
    outcomes = _sum(by_sender, ["node"], ["skipped", "dropped"])
    span = (
        _traffic(span)
        .group_by(["node"], use_threads=False)
        .aggregate([("first", "min"), ("last", "max")])
    )
    names = _all_nodes(by_sender.column("node"), sessions.column("node"), failures.column("node"))
    rows = []
    volumes = _by_node(volume)
    drops = _by_node(outcomes)
    spans = _by_node(span)
    session_counts = _count_by_node(sessions.column("node").to_pylist())
    open_counts = _count_by_node(
        sessions.filter(pc.equal(sessions.column("state"), "open")).column("node").to_pylist()
    )
    refused = _by_node(_sum(failures, ["node"], ["failures"]))
    for node in names:
        moved = volumes.get(node, {})
        dropped = drops.get(node, {})
        when = spans.get(node, {})
        rows.append(
            {
                "node": node,
                "messages": moved.get("messages", 0),
                "received": moved.get("received", 0),
                "bytes": moved.get("bytes", 0),
                "delivered": moved.get("delivered", 0),
                "skipped": dropped.get("skipped", 0),
                "dropped": dropped.get("dropped", 0),
                "sessions": session_counts.get(node, 0),
                "open_sessions": open_counts.get(node, 0),
                "auth_failures": refused.get(node, {}).get("failures", 0),
                "first": when.get("first_min"),
                "last": when.get("last_max"),
            }
        )
    nodes = pa.Table.from_pylist(rows, schema=NODES_SCHEMA)
    return {"nodes": nodes, "traffic_by_node_minute": by_minute}


_TIMESTAMP = pa.timestamp("us", tz="UTC")
NODES_SCHEMA = pa.schema(
    [("node", pa.string())]
    + [(name, pa.int64()) for name in ("messages", "received", "bytes", "delivered", "skipped",
                                       "dropped", "sessions", "open_sessions", "auth_failures")]
    + [("first", _TIMESTAMP), ("last", _TIMESTAMP)]
)  # fmt: skip


def _traffic(table: pa.Table) -> pa.Table:
    return table.filter(pc.is_in(table.column("kind"), pa.array(TRAFFIC_KINDS)))


def _sum(table: pa.Table, keys: list[str], values: list[str]) -> pa.Table:
    grouped = table.group_by(keys, use_threads=False).aggregate([(v, "sum") for v in values])
    columns = {k: grouped.column(k) for k in keys}
    for value in values:
        columns[value] = grouped.column(f"{value}_sum").cast(pa.int64())
    return pa.table(columns)


def _by_node(table: pa.Table) -> dict[str, dict[str, object]]:
    return {row.pop("node"): row for row in table.to_pylist()}


def _count_by_node(nodes: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    return counts


def _all_nodes(*columns: pa.ChunkedArray) -> list[str]:
    """Every node named anywhere, sorted."""
    found: set[str] = set()
    for column in columns:
        found.update(pc.unique(column).to_pylist())
    return sorted(found)
