"""The journal → report path on the sample journal (tests/analytics/journal_data.py): every
table's values as worked out by hand, the files written, and the bad files skipped."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from msgbroker.analytics.charts import CHARTS
from msgbroker.analytics.report import TABLES, run_report
from tests.analytics.journal_data import (
    DAY1,
    DAY2,
    MESSAGE_SEGMENTS,
    MESSAGES_COLUMNS,
    at,
    write_sample_journal,
    write_segment,
)

pytestmark = pytest.mark.spark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def reported(spark, sample_journal, tmp_path_factory):
    skipped = []
    out = tmp_path_factory.mktemp("report")
    report = run_report(spark, sample_journal.root, out, on_skip=skipped.append)
    return report, skipped


@pytest.fixture(scope="module")
def report(reported):
    return reported[0]


def rows(report, name, *columns):
    """A table as read back from its Parquet file, as tuples of ``columns``."""
    table = pq.read_table(report.table_path(name))
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


def test_topics_messages_bytes_and_outcomes(report):
    assert rows(
        report, "topics", "topic", "messages", "bytes", "delivered", "skipped", "dropped"
    ) == [
        ("news", 6, 220, 17, 1, 2),  # the run of 3 at 00:01:20 counts 3 messages
        ("weather", 2, 10, 1, 2, 1),
        ("sport", 1, 50, 1, 0, 0),
    ]


def test_protocols_count_the_senders_protocol(report):
    assert rows(report, "protocols", "protocol", "messages", "bytes") == [
        ("ssmp", 6, 123),
        ("stmp", 3, 60),
        ("mm2", 1, 100),
        ("sbus", 1, 7),
    ]


def test_recipient_protocols_sum_the_recipients_maps(report):
    assert rows(report, "recipient_protocols", "protocol", "deliveries") == [
        ("ssmp", 18),
        ("stmp", 5),
        ("mm2", 2),
        ("sbus", 1),
    ]


def test_traffic_by_minute_is_a_per_minute_series_per_protocol(report):
    assert rows(report, "traffic_by_minute", "minute", "protocol", "messages", "bytes") == [
        (at(DAY1, "23:58:00"), "ssmp", 2, 30),
        (at(DAY1, "23:59:00"), "stmp", 1, 5),  # the subscribe at 23:59:30 is not traffic
        (at(DAY2, "00:00:00"), "mm2", 1, 100),
        (at(DAY2, "00:00:00"), "sbus", 1, 7),
        (at(DAY2, "00:00:00"), "ssmp", 1, 3),
        (at(DAY2, "00:01:00"), "ssmp", 3, 90),
        (at(DAY2, "00:01:00"), "stmp", 1, 5),
        (at(DAY2, "00:02:00"), "stmp", 1, 50),
    ]


def test_senders_and_topics_by_minute(report):
    assert rows(report, "senders_by_minute", "minute", "sender", "messages") == [
        (at(DAY1, "23:58:00"), "alice", 2),
        (at(DAY1, "23:59:00"), "bob", 1),
        (at(DAY2, "00:00:00"), "alice", 1),
        (at(DAY2, "00:00:00"), "carol", 1),
        (at(DAY2, "00:00:00"), "dave", 1),
        (at(DAY2, "00:01:00"), "alice", 3),
        (at(DAY2, "00:01:00"), "bob", 1),
        (at(DAY2, "00:02:00"), "bob", 1),
    ]
    assert rows(report, "topics_by_minute", "minute", "topic", "messages", "bytes") == [
        (at(DAY1, "23:58:00"), "news", 2, 30),
        (at(DAY1, "23:59:00"), "weather", 1, 5),
        (at(DAY2, "00:00:00"), "news", 1, 100),
        (at(DAY2, "00:01:00"), "news", 3, 90),
        (at(DAY2, "00:01:00"), "weather", 1, 5),
        (at(DAY2, "00:02:00"), "sport", 1, 50),
    ]


def test_fanout_histogram_counts_messages_per_delivery_count(report):
    assert rows(report, "fanout", "delivered", "messages") == [
        (0, 1),
        (1, 3),
        (2, 1),
        (3, 5),
        (6, 1),
    ]


def test_drops_and_skips_totals_and_per_topic(report):
    assert rows(report, "drops_by_topic", "topic", "dropped", "skipped", "messages") == [
        ("news", 2, 1, 6),
        ("weather", 1, 2, 2),
    ]
    assert rows(report, "kinds", "kind", "messages", "skipped", "dropped") == [
        ("mcast", 9, 3, 3),
        ("bcast", 1, 0, 0),
        ("subscribe", 1, 0, 0),
        ("ucast", 1, 0, 0),
    ]


def test_top_talkers_by_messages_then_bytes_with_byte_rank(report):
    assert rows(
        report, "top_talkers", "sender", "messages", "bytes", "rank_messages", "rank_bytes"
    ) == [
        ("alice", 6, 123, 1, 1),
        ("bob", 3, 60, 2, 3),
        ("carol", 1, 100, 3, 2),  # ties on messages: more bytes first
        ("dave", 1, 7, 4, 4),
    ]


def test_auth_failures_by_identity_and_by_host(report):
    assert rows(report, "auth_failures_by_identity", "identity", "failures", "hosts") == [
        ("mallory", 3, 2),
        ("eve", 1, 1),
    ]
    assert rows(report, "auth_failures_by_host", "host", "failures", "identities") == [
        ("10.0.0.2", 3, 2),
        ("10.0.0.9", 1, 1),
    ]


def test_session_durations_and_a_session_never_closed(report):
    assert rows(
        report, "sessions", "session_id", "protocol", "identity", "duration_s", "state", "reason"
    ) == [
        (1, "ssmp", "alice", 630.0, "closed", "quit"),  # across midnight, two segments
        (2, "stmp", None, 2.0, "closed", "auth failed"),
        (3, "mm2", "carol", None, "open", None),
        (4, "sbus", "dave", 10.0, "closed", "eof"),
        (5, "ssmp", None, 2.0, "closed", "auth failed"),
    ]


def test_summary_numbers(report):
    [summary] = pq.read_table(report.table_path("summary")).to_pylist()
    assert summary == {
        "messages": 11,
        "bytes": 290,
        "delivered": 26,
        "skipped": 3,
        "dropped": 3,
        "presence_events": 1,
        "topics": 3,
        "senders": 4,
        "first": at(DAY1, "23:58:10"),
        "last": at(DAY2, "00:02:00"),
        "sessions": 5,
        "open_sessions": 1,
        "auth_failures": 4,
        "since": None,
        "until": None,
        "skipped_files": 4,
        # a journal from before node names: one node, "", that received nothing
        "nodes": 1,
        "received": 0,
    }


def test_every_table_is_written_as_parquet_and_matches_the_result(report):
    assert sorted(p.name for p in (report.out_dir / "tables").iterdir()) == sorted(TABLES)
    for name in TABLES:
        assert pq.read_table(report.table_path(name)).equals(report.tables[name]), name


def test_index_html_references_every_chart_and_the_charts_are_pngs(report):
    html = report.index.read_text()
    assert report.index == report.out_dir / "index.html"
    referenced = re.findall(r'<img src="([^"]+)"', html)
    assert sorted(referenced) == sorted(f"charts/{name}" for name in CHARTS)
    for name in referenced:
        data = (report.out_dir / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 2000, name  # a drawn chart, not an empty canvas
    # the summary comes first, then the sections
    assert html.index("messages</span>") < html.index("<h2>Traffic over time</h2>")


def test_corrupt_and_foreign_files_are_reported_and_skipped(reported, sample_journal):
    report, skipped = reported
    assert {s.path for s in skipped} == sample_journal.bad
    assert report.skipped == tuple(skipped)
    reasons = {s.path.name: s.reason for s in skipped}
    assert reasons["seg-00000005.parquet"].startswith("not a readable Parquet file")
    assert reasons["seg-00000099.parquet"].startswith("not a journal segment (no column ts,")
    assert reasons["seg-00000100.parquet"] == (
        "not a journal segment (column session_id is string, not int64)"
    )
    assert reasons["README.txt"].startswith("not a readable Parquet file")
    html = report.index.read_text()
    for path in sample_journal.bad:
        assert str(path) in html
    for path in sample_journal.ignored:
        assert str(path) not in html


def test_since_until_keep_rows_in_the_half_open_window(spark, sample_journal, tmp_path):
    since, until = DAY2, at(DAY2, "00:02:00")
    report = run_report(spark, sample_journal.root, tmp_path, since=since, until=until)
    assert rows(report, "topics", "topic", "messages", "bytes") == [
        ("news", 4, 190),
        ("weather", 1, 5),
    ]
    assert rows(report, "traffic_by_minute", "minute", "protocol", "messages") == [
        (at(DAY2, "00:00:00"), "mm2", 1),
        (at(DAY2, "00:00:00"), "sbus", 1),
        (at(DAY2, "00:00:00"), "ssmp", 1),
        (at(DAY2, "00:01:00"), "ssmp", 3),
        (at(DAY2, "00:01:00"), "stmp", 1),
    ]
    # session 1 opened before the window: partial; 3 never closed; 4 and 5 are after it
    assert rows(report, "sessions", "session_id", "duration_s", "state") == [
        (3, None, "open"),
        (1, None, "partial"),
    ]
    assert rows(report, "auth_failures_by_identity", "identity", "failures") == [
        ("eve", 1),
        ("mallory", 1),
    ]
    [summary] = pq.read_table(report.table_path("summary")).to_pylist()
    assert (summary["since"], summary["until"]) == (since, until)
    # the 21st's partitions are not even opened: no file there is reported
    assert all("date=2026-11-21" not in str(s.path) for s in report.skipped)


def test_an_empty_journal_gives_an_empty_report(spark, tmp_path):
    (tmp_path / "journal").mkdir()
    report = run_report(spark, tmp_path / "journal", tmp_path / "out")
    [summary] = report.tables["summary"].to_pylist()
    assert (summary["messages"], summary["sessions"], summary["first"]) == (0, 0, None)
    assert all(report.tables[name].num_rows == 0 for name in TABLES if name != "summary")
    # nothing to draw: no chart, and one line per section instead (test_report_page.py)
    assert report.charts == ()
    page = report.index.read_text()
    assert "no messages" in page
    assert '<p class="none">No messages in this period.</p>' in page


def test_a_segment_whose_data_pages_are_damaged_is_reported_and_skipped(spark, tmp_path):
    """Its footer is intact (the driver's check passes it); the task that reads it finds
    the damage, reports it, and the report counts every other segment."""
    journal = write_sample_journal(tmp_path / "journal")
    rows_ = MESSAGE_SEGMENTS[("2026-11-22", 3)] * 50
    damaged = write_segment(
        journal.root / "messages" / "date=2026-11-22" / "seg-00000006.parquet",
        rows_,
        MESSAGES_COLUMNS,
    )
    data = bytearray(damaged.read_bytes())
    data[4:68] = b"\xff" * 64  # the first page header
    damaged.write_bytes(bytes(data))
    skipped = []
    report = run_report(spark, journal.root, tmp_path / "out", on_skip=skipped.append)
    assert {s.path for s in skipped} == journal.bad | {damaged}
    [reason] = [s.reason for s in skipped if s.path == damaged]
    assert reason.startswith("damaged data (")
    assert str(damaged) in report.index.read_text()
    [summary] = report.tables["summary"].to_pylist()
    assert (summary["messages"], summary["skipped_files"]) == (11, len(journal.bad) + 1)
