"""Listing a journal directory for the jobs, without Spark: which files are segments, which
are reported, which are passed over, and the schema check against the journal's own."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq

from msgbroker.analytics.journal_files import (
    COLUMNS,
    MESSAGES,
    MESSAGES_COLUMNS,
    NODE_COLUMNS,
    OPTIONAL,
    SESSIONS,
    list_table,
    schema_problem,
)
from tests.analytics.journal_data import write_sample_journal


def test_segments_are_listed_in_order_and_bad_files_reported(tmp_path):
    sample = write_sample_journal(tmp_path)
    messages = list_table(tmp_path, MESSAGES)
    sessions = list_table(tmp_path, SESSIONS)
    assert [p.relative_to(tmp_path).as_posix() for p in messages.segments] == [
        "messages/date=2026-11-21/seg-00000001.parquet",
        "messages/date=2026-11-22/seg-00000002.parquet",
        "messages/date=2026-11-22/seg-00000003.parquet",
    ]
    assert [p.relative_to(tmp_path).as_posix() for p in sessions.segments] == [
        "sessions/date=2026-11-21/seg-00000001.parquet",
        "sessions/date=2026-11-22/seg-00000002.parquet",
    ]
    reported = {s.path for s in messages.skipped + sessions.skipped}
    assert reported == sample.bad
    assert not reported & sample.ignored  # the hidden temporary and _SUCCESS: not a word


def test_a_time_window_skips_whole_days(tmp_path):
    write_sample_journal(tmp_path)
    day2 = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    only_day2 = list_table(tmp_path, MESSAGES, since=day2)
    assert [p.parent.name for p in only_day2.segments] == ["date=2026-11-22"] * 2
    only_day1 = list_table(tmp_path, MESSAGES, until=day2)  # until is exclusive
    assert [p.parent.name for p in only_day1.segments] == ["date=2026-11-21"]
    # the bad files of the 22nd were never opened; one outside any date= partition was
    assert [s.path.name for s in only_day1.skipped] == ["README.txt"]


def test_schema_check_accepts_added_columns_and_other_map_entry_names(tmp_path):
    table = pa.Table.from_pylist([], schema=MESSAGES_COLUMNS).append_column(
        "added_later", pa.array([], pa.string())
    )
    path = tmp_path / "seg.parquet"
    pq.write_table(table, path)
    assert schema_problem(path, MESSAGES_COLUMNS) is None

    naive = tmp_path / "naive.parquet"
    schema = MESSAGES_COLUMNS.set(0, pa.field("ts", pa.timestamp("us")))
    pq.write_table(pa.Table.from_pylist([], schema=schema), naive)
    assert schema_problem(naive, MESSAGES_COLUMNS) == (
        "not a journal segment (column ts is timestamp[us], not timestamp[us, tz=UTC])"
    )


def test_an_older_messages_segment_without_count_is_a_segment(tmp_path):
    from tests.analytics.journal_data import MESSAGES_V1

    path = tmp_path / "seg.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=MESSAGES_V1), path)
    assert schema_problem(path, MESSAGES_COLUMNS) is None


def test_an_empty_file_is_not_a_segment(tmp_path):
    path = tmp_path / "seg-00000001.parquet"
    path.write_bytes(b"")
    assert schema_problem(path, MESSAGES_COLUMNS).startswith("not a readable Parquet file")


def test_the_readers_schemas_agree_with_the_journal_plugin(tmp_path):
    from msgbroker.plugins.journal import schema as journal

    for table, expected in COLUMNS.items():
        written = journal.SCHEMAS[table]
        assert written.names[: len(expected)] == expected.names, table
        for field in expected:
            assert written.field(field.name).type.equals(field.type), (table, field.name)
        path = tmp_path / f"{table}.parquet"
        pq.write_table(pa.Table.from_pylist([], schema=written), path)
        assert schema_problem(path, expected) is None
        # the node columns, which older segments lack, are the plugin's too
        for field in NODE_COLUMNS[table]:
            assert written.field(field.name).type.equals(field.type), (table, field.name)
            assert field.name in OPTIONAL


def test_node_columns_may_be_missing_but_not_of_another_type(tmp_path):
    day = tmp_path / "messages" / "date=2026-11-22"
    day.mkdir(parents=True)
    older = day / "seg-00000001.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=MESSAGES_COLUMNS), older)
    wrong = day / "seg-n-00000001.parquet"
    schema = MESSAGES_COLUMNS.append(pa.field("node", pa.int64()))
    pq.write_table(pa.Table.from_pylist([], schema=schema), wrong)
    listed = list_table(tmp_path, "messages")
    assert listed.segments == (older,)
    assert [(s.path, s.reason) for s in listed.skipped] == [
        (wrong, "not a journal segment (column node is int64, not string)")
    ]
