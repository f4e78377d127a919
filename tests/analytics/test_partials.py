"""The report's map side (analytics/partials.py, and the aggregations in grains.py) without
Spark: what a task computes from segments, how partials merge, how segments are cut into
slices, damaged data, and that the code a task runs needs no msgbroker where it runs."""

from __future__ import annotations

import datetime as dt
import functools
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgbroker.analytics import grains as grains_module
from msgbroker.analytics import partials
from msgbroker.analytics.grains import GRAINS, MAIN_GRAINS, TIMESTAMP, minute_of
from tests.analytics.journal_data import (
    DAY1,
    DAY2,
    MESSAGE_SEGMENTS,
    MESSAGES_COLUMNS,
    at,
    write_segment,
)


def segments(sample_journal, table):
    found = (sample_journal.root / table).rglob("seg-*.parquet")
    return sorted(p for p in found if p not in sample_journal.bad)


def run(items, since=None, until=None, topics=None):
    """A task's output as {grain: table} (merged as the driver does) and its skips."""
    found, skipped = {}, []
    for what, value in partials.task(items, since, until, topics):
        if what == "skipped":
            skipped.append(value)
        else:
            found.setdefault(value[0], []).append(partials.from_ipc(value[1]))
    return {g: partials.merge(g, t) for g, t in found.items()}, skipped


def as_rows(table, *columns):
    return sorted(tuple(r[c] for c in columns) for r in table.to_pylist())


@pytest.fixture
def sample_items(sample_journal):
    return [("messages", str(p)) for p in segments(sample_journal, "messages")] + [
        ("sessions", str(p)) for p in segments(sample_journal, "sessions")
    ]


def test_a_task_reduces_its_segments_to_the_grains(sample_items):
    grains, skipped = run(sample_items)
    assert skipped == []
    assert set(grains) == set(MAIN_GRAINS)
    # the run of 3 at 00:01:20 counts 3 messages, 3 x 3 deliveries; v1 rows count 1 each
    assert as_rows(grains["by_sender"], "kind", "minute", "sender", "messages", "delivered") == [
        ("bcast", at(DAY2, "00:00:00"), "alice", 1, 6),
        ("mcast", at(DAY1, "23:58:00"), "alice", 2, 5),
        ("mcast", at(DAY1, "23:59:00"), "bob", 1, 1),
        ("mcast", at(DAY2, "00:00:00"), "carol", 1, 3),
        ("mcast", at(DAY2, "00:01:00"), "alice", 3, 9),
        ("mcast", at(DAY2, "00:01:00"), "bob", 1, 0),
        ("mcast", at(DAY2, "00:02:00"), "bob", 1, 1),
        ("subscribe", at(DAY1, "23:59:00"), "alice", 1, 0),
        ("ucast", at(DAY2, "00:00:00"), "dave", 1, 1),
    ]
    assert as_rows(grains["recipients"], "kind", "protocol", "deliveries") == [
        ("bcast", "mm2", 1),
        ("bcast", "sbus", 1),
        ("bcast", "ssmp", 3),
        ("bcast", "stmp", 1),
        ("mcast", "mm2", 1),
        ("mcast", "ssmp", 14),
        ("mcast", "stmp", 4),
        ("ucast", "ssmp", 1),
    ]
    assert as_rows(grains["span"], "kind", "first", "last")[1] == (
        "mcast",
        at(DAY1, "23:58:10"),
        at(DAY2, "00:02:00"),
    )
    assert as_rows(grains["failures"], "identity", "host", "failures") == [
        ("eve", "10.0.0.2", 1),
        ("mallory", "10.0.0.2", 2),
        ("mallory", "10.0.0.9", 1),
    ]
    sessions = {r["session_id"]: r for r in grains["sessions"].to_pylist()}
    assert sessions[1]["identity"] == "alice" and sessions[1]["reason"] == "quit"
    assert sessions[3]["closed"] is None and sessions[3]["identity"] == "carol"


def test_partials_of_any_split_merge_to_the_same_result(sample_items):
    whole, _ = run(sample_items)
    for cut in range(1, len(sample_items)):
        first, _ = run(sample_items[:cut])
        second, _ = run(sample_items[cut:])
        for grain in MAIN_GRAINS:
            parts = [t[grain] for t in (first, second) if grain in t]
            merged = partials.merge(grain, parts)
            keys = list(GRAINS[grain][0])
            assert merged.sort_by([(k, "ascending") for k in keys]).equals(
                whole[grain].sort_by([(k, "ascending") for k in keys])
            ), (grain, cut)


def test_rows_are_kept_in_the_half_open_window(sample_items):
    grains, _ = run(sample_items, since=DAY2, until=at(DAY2, "00:02:00"))
    assert sum(grains["by_sender"].column("messages").to_pylist()) == 7
    assert min(grains["by_sender"].column("minute").to_pylist()) == DAY2
    assert max(grains["span"].column("last").to_pylist()) == at(DAY2, "00:01:20")


def test_the_topic_series_grain_counts_only_the_named_mcast_topics(sample_items):
    grains, _ = run(sample_items, topics=["news", "alice"])  # "alice" is a ucast target
    assert set(grains) == {"topic_minute"}
    assert as_rows(grains["topic_minute"], "minute", "topic", "messages", "bytes") == [
        (at(DAY1, "23:58:00"), "news", 2, 30),
        (at(DAY2, "00:00:00"), "news", 1, 100),
        (at(DAY2, "00:01:00"), "news", 3, 90),
    ]


def test_a_segment_with_damaged_data_pages_is_skipped_with_a_reason(tmp_path, sample_items):
    rows = MESSAGE_SEGMENTS[("2026-11-22", 3)] * 50
    damaged = write_segment(tmp_path / "seg-00000009.parquet", rows, MESSAGES_COLUMNS)
    data = bytearray(damaged.read_bytes())
    data[4:68] = b"\xff" * 64  # the first page header; the footer stays readable
    damaged.write_bytes(bytes(data))
    grains, skipped = run([*sample_items, ("messages", str(damaged))])
    [(path, reason)] = skipped
    assert path == str(damaged)
    assert reason.startswith("damaged data (") and reason.isprintable()
    # the other segments still count
    assert sum(grains["by_sender"].column("messages").to_pylist()) == 12


def test_minutes_are_truncated_like_floor_temporal():
    stamps = pa.chunked_array(
        [
            [
                DAY2,
                at(DAY2, "00:00:59.999999"),
                at(DAY2, "13:07:01"),
                dt.datetime(1970, 1, 1, 0, 1, tzinfo=dt.UTC),
            ]
        ],
        TIMESTAMP,
    )
    assert minute_of(stamps).equals(pc.floor_temporal(stamps, unit="minute"))


def test_empty_grains_have_the_columns_of_full_ones(sample_items):
    grains, _ = run(sample_items)
    for grain in MAIN_GRAINS:
        assert partials.empty(grain).schema == grains[grain].schema, grain
        assert partials.empty(grain).num_rows == 0


@given(st.lists(st.integers(0, 10**6), max_size=30), st.integers(1, 40))
def test_slices_are_contiguous_non_empty_and_complete(sizes, n):
    items = [("messages", f"seg-{i}", size) for i, size in enumerate(sizes)]
    cut = partials.slices(items, n)
    assert [path for s in cut for _, path in s] == [p for _, p, _ in items]
    assert len(cut) == min(n, len(items))
    assert all(cut)


def test_slices_are_balanced_by_size():
    sizes = [5, 1, 1, 1, 9, 3, 3, 3, 3, 2]
    items = [("messages", f"seg-{i}", size) for i, size in enumerate(sizes)]
    weight = {p: size for _, p, size in items}
    halves = [sum(weight[p] for _, p in s) for s in partials.slices(items, 2)]
    assert halves == [17, 14]
    thirds = [sum(weight[p] for _, p in s) for s in partials.slices(items, 3)]
    assert thirds == [8, 12, 11]


def test_a_task_shipped_by_value_runs_where_msgbroker_is_not_installed(sample_items):
    """Executors need pyarrow (PySpark's Arrow support does) but not msgbroker: the task is
    pickled with its code. Unpickled and run in an interpreter that refuses msgbroker."""
    from pyspark import cloudpickle

    partials.ship_by_value()
    job = functools.partial(partials.run_slices, since=None, until=None, topics=None)
    payload = cloudpickle.dumps((job, [sample_items]))
    script = (
        "import sys, pickle\n"
        "class NoMsgbroker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'msgbroker':\n"
        "            raise ImportError('no msgbroker here')\n"
        "sys.meta_path.insert(0, NoMsgbroker())\n"
        "job, slices = pickle.loads(sys.stdin.buffer.read())\n"
        "out = list(job(slices))\n"
        "assert not any(m.split('.')[0] == 'msgbroker' for m in sys.modules), 'imported'\n"
        "print(sorted(v[0] for k, v in out if k == 'table'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=payload, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == str(sorted(MAIN_GRAINS))


@pytest.mark.parametrize("module", [partials, grains_module], ids=lambda m: m.__name__)
def test_the_modules_shipped_by_value_import_only_the_standard_library_pyarrow_and_each_other(
    module,
):
    source = Path(module.__file__).read_text()
    imports = {
        name if name.startswith(".") else name.split(".")[0]
        for name in (
            line.split()[1]
            for line in source.splitlines()
            if line.startswith(("import ", "from ")) and not line.startswith("from __future__")
        )
    }
    shipped = {"datetime", "collections", "typing", "numpy", "pyarrow", "sys", ".grains"}
    assert imports <= shipped, imports


def test_segments_whose_types_differ_after_reading_are_reduced_one_by_one(sample_items):
    """Another writer's layout may read with other types (here: the recipients' keys as
    plain strings in one segment, dictionary-encoded in the other): the task reduces such
    segments separately instead of failing on the concatenation."""
    import pyarrow.parquet as pq

    paths = [path for table, path in sample_items if table == "messages"][1:]
    as_written = partials._read(paths[0], "messages", False)
    plain = pq.read_table(paths[1], columns=list(partials.MESSAGE_COLUMNS))
    plain = pa.table(
        [
            c if n == "recipients" else c.cast(partials.MESSAGE_COLUMNS[n])
            for n, c in zip(plain.column_names, plain.columns, strict=True)
        ],
        names=plain.column_names,
    )
    assert not as_written.schema.field("recipients").type.equals(
        plain.schema.field("recipients").type
    )
    found: dict[str, list[pa.Table]] = {}
    partials._reduce("messages", [as_written, plain], None, found)
    merged = partials.merge("recipients", found["recipients"])
    expected, _ = run([("messages", p) for p in paths])
    assert as_rows(merged, "kind", "protocol", "deliveries") == as_rows(
        expected["recipients"], "kind", "protocol", "deliveries"
    )
