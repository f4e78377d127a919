"""A journal holding names that were not valid UTF-8 (stored escaped by the journal writer,
with an ``escaped`` column the readers do not know) reads like any other: its segments pass
the footer check, and the escaped topic and identity are grouped and reported as stored."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from msgbroker.analytics import partials
from msgbroker.analytics.journal_files import list_table
from msgbroker.plugins.journal import schema
from msgbroker.plugins.journal.writer import JournalWriter

#: 2026-11-22 10:00:00 UTC, in microseconds
T0 = 1_795_428_000_000_000
SECOND = 1_000_000


def write_journal(root: Path) -> Path:
    """Two rotations: an sbus key ``k\\xff`` (topic ``'k\\udcff'``) and a good topic; an
    STMP login refused for the id ``"x\\udcff"`` and one granted to alice."""
    w = JournalWriter(root, start=False)
    for i in range(3):
        w.message(T0 + i, "sbus", "sbus:0:1", "mcast", "k\udcff", b"abc", {"ssmp": 1}, 0, 0)
    w.message(T0, "ssmp", "alice", "mcast", "news", b"hello", {"sbus": 2}, 0, 0)
    w.session(T0, schema.OPEN, "stmp", 1, None, "10.0.0.9", None, None)
    w.session(T0, schema.AUTH_FAILURE, "stmp", 1, "x\udcff", "10.0.0.9", "secret", "no")
    w.session(T0 + SECOND, schema.CLOSE, "stmp", 1, None, "10.0.0.9", None, "login refused")
    w.flush()
    w.run(T0 + SECOND, "sbus", "sbus:0:1", "mcast", "k\udcff", 4, lambda: [b"xy"] * 4, {}, 0)
    w.session(T0 + SECOND, schema.OPEN, "stmp", 2, None, "10.0.0.1", None, None)
    w.session(T0 + SECOND, schema.LOGIN, "stmp", 2, "alice", "10.0.0.1", "open", None)
    w.flush()
    assert w.failed == 0
    return root


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_journal(tmp_path_factory.mktemp("journal"))


def test_segments_with_escaped_names_pass_the_footer_check(journal):
    for table in (schema.MESSAGES, schema.SESSIONS):
        listed = list_table(journal, table)
        assert (len(listed.segments), listed.skipped) == (2, ())


def test_a_task_groups_the_escaped_topic_and_identity_as_stored(journal):
    items = [
        (table, str(path))
        for table in (schema.MESSAGES, schema.SESSIONS)
        for path in list_table(journal, table).segments
    ]
    found: dict[str, list] = {}
    for what, value in partials.task(items, None, None):
        assert what == "table", value
        found.setdefault(value[0], []).append(partials.from_ipc(value[1]))
    grains = {grain: partials.merge(grain, tables) for grain, tables in found.items()}
    topics: dict[str, list[int]] = {}
    for r in grains["by_topic"].to_pylist():  # one row per topic and fan-out
        total = topics.setdefault(r["topic"], [0, 0])
        total[0] += r["messages"]
        total[1] += r["bytes"]
    assert topics == {"k\\xff": [3 + 4, 3 * 3 + 8], "news": [1, 5]}
    failures = [(r["identity"], r["host"], r["failures"]) for r in grains["failures"].to_pylist()]
    assert failures == [("x\\xff", "10.0.0.9", 1)]


@pytest.mark.spark
def test_the_report_lists_the_escaped_names(spark, journal, tmp_path):
    from msgbroker.analytics.report import run_report

    report = run_report(spark, journal, tmp_path / "report")
    topics = pq.read_table(report.table_path("topics")).to_pylist()
    assert [(r["topic"], r["messages"]) for r in topics] == [("k\\xff", 7), ("news", 1)]
    failures = pq.read_table(report.table_path("auth_failures_by_identity")).to_pylist()
    assert [(r["identity"], r["failures"]) for r in failures] == [("x\\xff", 1)]
    assert "k\\xff" in report.index.read_text()
