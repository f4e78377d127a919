"""The journal writer on real files: rotation, partitions, sequence numbers, atomic segments,
bounded memory, payloads and runs. Rotations are driven by a fake clock and ``tick``/``flush``
(``start=False``), or, where the thread is the point, waited for with a timeout."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgbroker.plugins.journal import schema, writer
from msgbroker.plugins.journal.writer import RECORD_OVERHEAD, JournalWriter

WAIT = 10.0
LONG_RUN = 40
#: 2023-11-14 22:13:20 UTC, in microseconds
T0 = 1_700_000_000_000_000
MIDNIGHT = 1_700_006_400_000_000  # 2023-11-15 00:00:00 UTC
DAY = "date=2023-11-14"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def journal(path: Path, **options) -> JournalWriter:
    options.setdefault("start", False)
    return JournalWriter(path, **options)


def mcast(w: JournalWriter, payload: bytes = b"hello", ts: int = T0, **kw) -> None:
    w.message(
        ts,
        kw.get("protocol", "ssmp"),
        kw.get("sender", "alice"),
        "mcast",
        kw.get("topic", "t"),
        payload,
        kw.get("recipients", {"ssmp": 1}),
        kw.get("skipped", 0),
        kw.get("dropped", 0),
    )


def visible(path: Path) -> list[str]:
    """The journal's finalized files, relative to ``path``."""
    return sorted(
        str(p.relative_to(path))
        for p in path.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )


def same_schema(found: pa.Schema, expected: pa.Schema) -> bool:
    """Equal, but for the name Parquet gives a map's entries (it keeps the column's)."""

    def norm(t: pa.DataType) -> object:
        return ("map", t.key_type, t.item_type) if pa.types.is_map(t) else t

    return found.metadata == expected.metadata and [
        (f.name, norm(f.type), f.nullable, f.metadata) for f in found
    ] == [(f.name, norm(f.type), f.nullable, f.metadata) for f in expected]


def rows(path: Path, table: str = schema.MESSAGES) -> list[dict]:
    return pq.read_table(path / table).to_pylist()


def test_time_rotation_writes_once_rotate_seconds_have_passed(tmp_path):
    clock = FakeClock()
    w = journal(tmp_path, rotate_seconds=10.0, clock=clock)
    mcast(w)
    clock.now = 9.9
    assert w.tick() == []
    assert visible(tmp_path) == []
    clock.now = 10.0
    assert w.tick() == [tmp_path / "messages" / DAY / "seg-00000000.parquet"]
    assert w.pending == 0
    mcast(w)
    clock.now = 19.9  # the period restarts at each rotation
    assert w.tick() == []
    clock.now = 20.0
    assert [p.name for p in w.tick()] == ["seg-00000001.parquet"]


def test_writer_thread_rotates_by_time(tmp_path):
    w = journal(tmp_path, rotate_seconds=0.05, rotate_bytes=1 << 30, start=True)
    try:
        mcast(w)
        assert w.wait_segments(1, WAIT)
        assert visible(tmp_path) == [f"messages/{DAY}/seg-00000000.parquet"]
    finally:
        w.close()


def test_size_estimate_reaching_rotate_bytes_makes_a_rotation_due(tmp_path):
    clock = FakeClock()
    w = journal(tmp_path, rotate_bytes=10 * RECORD_OVERHEAD, clock=clock)
    for _ in range(9):
        mcast(w)
    assert not w.due()
    mcast(w)
    assert w.due()
    assert len(w.tick()) == 1
    assert not w.due()


def test_kept_payloads_count_toward_the_size(tmp_path):
    w = journal(tmp_path, rotate_bytes=RECORD_OVERHEAD + 1000, keep_payloads=True)
    mcast(w, b"x" * 999)
    assert not w.due()
    mcast(w, b"")
    assert w.due()


def test_writer_thread_wakes_when_the_size_is_reached(tmp_path):
    # an hour's period: only the size can make this rotation happen within the wait
    w = journal(tmp_path, rotate_seconds=3600, rotate_bytes=5 * RECORD_OVERHEAD, start=True)
    try:
        for _ in range(5):
            mcast(w)
        assert w.wait_segments(1, WAIT)
        assert len(rows(tmp_path)) == 5
    finally:
        w.close()


def test_records_are_partitioned_by_their_utc_date(tmp_path):
    w = journal(tmp_path)
    mcast(w, b"late", ts=MIDNIGHT - 1)
    mcast(w, b"early", ts=MIDNIGHT)
    mcast(w, b"later", ts=MIDNIGHT - 2)
    w.session(MIDNIGHT + 5, schema.OPEN, "ssmp", 1, None, "127.0.0.1", None, None)
    w.flush()
    assert visible(tmp_path) == [
        "messages/date=2023-11-14/seg-00000000.parquet",
        "messages/date=2023-11-15/seg-00000001.parquet",
        "sessions/date=2023-11-15/seg-00000000.parquet",
    ]
    day1 = pq.read_table(tmp_path / "messages" / DAY).to_pylist()
    assert [r["payload_size"] for r in day1] == [4, 5]
    (day2,) = pq.read_table(tmp_path / "messages" / "date=2023-11-15").to_pylist()
    assert day2["ts"] == datetime.datetime(2023, 11, 15, tzinfo=datetime.UTC)


def test_sequence_numbers_continue_across_a_restart(tmp_path):
    w = journal(tmp_path)
    mcast(w)
    w.flush()
    mcast(w, ts=MIDNIGHT)  # another date: the sequence is per table, not per partition
    w.session(T0, schema.OPEN, "ssmp", 1, None, "", None, None)
    w.flush()
    w.close()
    again = journal(tmp_path)
    mcast(again)
    again.session(T0, schema.CLOSE, "ssmp", 1, None, "", None, "CLOSE")
    assert [p.name for p in again.flush()] == ["seg-00000002.parquet", "seg-00000001.parquet"]


def test_a_segment_is_only_visible_complete(tmp_path, monkeypatch):
    real_write = pq.write_table
    seen = []

    def spying_write(table, where, **kw):
        where = Path(where)
        seen.append((where.name, visible(tmp_path)))
        real_write(table, where, **kw)

    monkeypatch.setattr(writer.pq, "write_table", spying_write)
    w = journal(tmp_path)
    mcast(w)
    w.flush()
    # written under a hidden name while no final file existed yet; renamed afterwards
    assert seen == [(".seg-00000000.parquet.tmp", [])]
    assert visible(tmp_path) == [f"messages/{DAY}/seg-00000000.parquet"]
    assert not list(tmp_path.rglob(".*"))


def test_a_failed_write_leaves_nothing_visible_and_the_writer_goes_on(tmp_path, monkeypatch):
    real_write = pq.write_table
    warnings: list[str] = []

    def disk_full(table, where, **kw):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.pq, "write_table", disk_full)
    w = journal(tmp_path, warn=warnings.append)
    mcast(w)
    mcast(w)
    assert w.flush() == []
    assert w.failed == 2
    assert "2 records lost" in warnings[0]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
    monkeypatch.setattr(writer.pq, "write_table", real_write)
    mcast(w, b"after")
    assert [p.name for p in w.flush()] == ["seg-00000001.parquet"]
    assert [r["payload_size"] for r in rows(tmp_path)] == [5]


def test_a_partition_that_cannot_be_created_loses_only_its_records(tmp_path):
    warnings: list[str] = []
    w = journal(tmp_path, warn=warnings.append)
    (tmp_path / "messages" / DAY).write_bytes(b"not a directory")
    mcast(w, ts=T0)
    mcast(w, ts=MIDNIGHT)
    written = w.flush()
    assert [p.parent.name for p in written] == ["date=2023-11-15"]
    assert (w.failed, w.written) == (1, 1)
    assert "for 2023-11-14, 1 records lost" in warnings[0]


def test_leftover_temporaries_are_removed_at_start(tmp_path):
    w = journal(tmp_path)
    mcast(w)
    w.flush()
    partition = tmp_path / "messages" / DAY
    leftover = partition / ".seg-00000001.parquet.tmp"
    leftover.write_bytes(b"PAR1 interrupted")
    foreign = partition / "notes.txt"
    foreign.write_text("not ours")
    again = journal(tmp_path)
    assert again.removed == [leftover]
    assert not leftover.exists()
    assert foreign.exists()  # only our own temporaries go
    mcast(again)
    assert [p.name for p in again.flush()] == ["seg-00000001.parquet"]


def test_past_max_records_new_records_are_dropped_and_counted(tmp_path):
    warnings: list[str] = []
    w = journal(tmp_path, max_records=3, warn=warnings.append)
    for size in range(5):
        mcast(w, b"x" * (size + 1))
    w.session(T0, schema.OPEN, "ssmp", 1, None, "", None, None)
    assert (w.pending, w.dropped) == (3, 3)
    w.flush()
    assert warnings == [
        "journal: dropped 3 records: 3 were pending (the disk does not keep up); 3 dropped in all"
    ]
    assert [r["payload_size"] for r in rows(tmp_path)] == [1, 2, 3]  # the first ones stay
    # room again after the rotation. Without payloads a run is one row whatever its count
    for _ in range(3):
        w.run(T0, "ssmp", "alice", "mcast", "t", 1000, lambda: [b"a"] * 1000, {"ssmp": 1}, 0)
    assert (w.pending, w.dropped) == (3, 3)
    w.run(T0, "ssmp", "alice", "mcast", "t", 2, lambda: [b"c", b"d"], {"ssmp": 1}, 0)
    assert (w.pending, w.dropped) == (3, 5)  # dropped whole: its messages are counted
    w.flush()
    assert "dropped 2 records" in warnings[1]
    w.flush()
    assert len(warnings) == 2  # logged once per rotation, only when something was dropped


def test_with_payloads_a_run_counts_as_its_rows_against_max_records(tmp_path):
    w = journal(tmp_path, max_records=3, keep_payloads=True)
    w.run(T0, "ssmp", "alice", "mcast", "t", 2, lambda: [b"a", b"b"], {"ssmp": 1}, 0)
    w.run(T0, "ssmp", "alice", "mcast", "t", 2, lambda: [b"c", b"d"], {"ssmp": 1}, 0)
    assert (w.pending, w.dropped) == (2, 2)  # the second does not fit: dropped whole
    w.flush()
    assert [r["payload"] for r in rows(tmp_path)] == [b"a", b"b"]


def test_a_run_without_payloads_keeps_nothing_of_the_run_alive(tmp_path):
    """Only numbers and strings wait for the rotation: holding the payloads would keep a
    run's request bytes alive with them (hundreds of MB a second under load)."""
    import gc
    import weakref

    class Payloads(list):  # a list type that can be weakly referenced
        pass

    def building(payloads: list[bytes]) -> Callable[[], list[bytes]]:
        return lambda: payloads

    w = journal(tmp_path)
    payloads = Payloads([b"x" * 100] * 10)
    alive = weakref.ref(payloads)
    build = building(payloads)
    del payloads
    w.run(T0, "ssmp", "a", "mcast", "t", 10, build, {"ssmp": 1}, 0)
    del build
    gc.collect()
    assert alive() is None
    w.flush()
    assert [(r["count"], r["payload_size"]) for r in rows(tmp_path)] == [(10, 1000)]


@pytest.mark.parametrize("keep", [False, True])
def test_payloads_are_kept_only_when_configured(tmp_path, keep):
    w = journal(tmp_path, keep_payloads=keep)
    mcast(w, b"secret stuff")
    w.run(T0, "ssmp", "a", "mcast", "t", 2, lambda: [b"r1", b"run2"], {"ssmp": 1}, 0)
    big = [b"p%d" % i for i in range(LONG_RUN)]
    w.run(T0, "ssmp", "a", "mcast", "t", LONG_RUN, lambda: big, {"ssmp": 1}, 0)
    w.flush()
    found = rows(tmp_path)
    if keep:  # a row per message, so each payload has its own
        assert [r["payload_size"] for r in found] == [12, 2, 4, *map(len, big)]
        assert [r["payload"] for r in found] == [b"secret stuff", b"r1", b"run2", *big]
        assert {r["count"] for r in found} == {1}
    else:  # a row per run
        total = sum(map(len, big))
        assert [(r["count"], r["payload_size"]) for r in found] == [
            (1, 12),
            (2, 6),
            (LONG_RUN, total),
        ]
        assert [r["payload"] for r in found] == [None] * 3


@pytest.mark.parametrize("count", [3, LONG_RUN, 500])
def test_a_run_is_one_row_standing_for_its_messages(tmp_path, count):
    w = journal(tmp_path)
    payloads = [b"x" * (i % 7 + 1) for i in range(count)]
    mcast(w, b"before")
    w.run(T0 + 1, "mm2", "bob", "mcast", "t", count, lambda: payloads, {"ssmp": 2, "mm2": 1}, 10)
    mcast(w, b"after", ts=T0 + 2)
    w.flush()
    found = rows(tmp_path)
    assert [r["count"] for r in found] == [1, count, 1]
    assert [r["payload_size"] for r in found] == [6, sum(map(len, payloads)), 5]
    (run,) = found[1:-1]
    assert (run["protocol"], run["sender"], run["kind"], run["topic"]) == (
        "mm2",
        "bob",
        "mcast",
        "t",
    )
    assert dict(run["recipients"]) == {"ssmp": 2, "mm2": 1}  # each message's
    assert (run["delivered"], run["skipped"], run["dropped"]) == (3, 0, 10)
    assert run["ts"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 1, tzinfo=datetime.UTC)


def test_a_runs_size_comes_from_the_sender_when_it_knows_it(tmp_path):
    w = journal(tmp_path)

    def never() -> list[bytes]:
        raise AssertionError("the payloads were built")

    w.run(T0, "ssmp", "a", "mcast", "t", 1000, never, {"ssmp": 1}, 0, lambda: 64_000)
    w.flush()
    assert [(r["count"], r["payload_size"]) for r in rows(tmp_path)] == [(1000, 64_000)]


@pytest.mark.parametrize("count", [3, LONG_RUN, 500])
def test_with_payloads_a_run_expands_to_one_row_per_message(tmp_path, count):
    w = journal(tmp_path, keep_payloads=True)
    payloads = [b"x" * (i % 7 + 1) for i in range(count)]
    mcast(w, b"before")
    w.run(T0 + 1, "mm2", "bob", "mcast", "t", count, lambda: payloads, {"ssmp": 2, "mm2": 1}, 10)
    mcast(w, b"after", ts=T0 + 2)
    w.flush()
    found = rows(tmp_path)
    assert len(found) == count + 2 and {r["count"] for r in found} == {1}
    assert found[0]["payload_size"] == 6 and found[-1]["payload_size"] == 5  # order kept
    run = found[1:-1]
    assert [r["payload_size"] for r in run] == [len(p) for p in payloads]
    assert {(r["protocol"], r["sender"], r["kind"], r["topic"]) for r in run} == {
        ("mm2", "bob", "mcast", "t")
    }
    assert all(dict(r["recipients"]) == {"ssmp": 2, "mm2": 1} for r in run)
    assert {(r["delivered"], r["skipped"]) for r in run} == {(3, 0)}
    assert sum(r["dropped"] for r in run) == 10  # the run's drops, spread over its rows
    assert max(r["dropped"] for r in run) - min(r["dropped"] for r in run) <= 1
    assert {r["ts"] for r in run} == {
        datetime.datetime(2023, 11, 14, 22, 13, 20, 1, tzinfo=datetime.UTC)
    }


def test_message_rows_carry_every_column(tmp_path):
    w = journal(tmp_path, node="db1:4444")
    w.message(T0, "stmp", "carol", "ucast", "dave", b"hey", {"mm2": 1}, 0, 0, "db2:4444")
    w.message(T0, "ssmp", "alice", "bcast", None, b"all", {"ssmp": 3, "stmp": 1}, 2, 1)
    w.message(T0, "ssmp", "alice", "mcast", "nobody", b"x", {}, 0, 0)
    (path,) = w.flush()
    assert same_schema(pq.read_schema(path), schema.MESSAGES_SCHEMA)
    found = pq.read_table(path).to_pylist()
    assert [{k: v for k, v in r.items() if k != "ts"} for r in found] == [
        {
            "protocol": "stmp",
            "sender": "carol",
            "kind": "ucast",
            "topic": "dave",
            "count": 1,
            "payload_size": 3,
            "recipients": [("mm2", 1)],
            "delivered": 1,
            "skipped": 0,
            "dropped": 0,
            "payload": None,
            "escaped": None,
            "node": "db1:4444",
            "origin_node": "db2:4444",
        },
        {
            "protocol": "ssmp",
            "sender": "alice",
            "kind": "bcast",
            "topic": None,
            "count": 1,
            "payload_size": 3,
            "recipients": [("ssmp", 3), ("stmp", 1)],
            "delivered": 4,
            "skipped": 2,
            "dropped": 1,
            "payload": None,
            "escaped": None,
            "node": "db1:4444",
            "origin_node": None,
        },
        {
            "protocol": "ssmp",
            "sender": "alice",
            "kind": "mcast",
            "topic": "nobody",
            "count": 1,
            "payload_size": 1,
            "recipients": [],
            "delivered": 0,
            "skipped": 0,
            "dropped": 0,
            "payload": None,
            "escaped": None,
            "node": "db1:4444",
            "origin_node": None,
        },
    ]


def test_session_rows_carry_every_column(tmp_path):
    w = journal(tmp_path, node="db1:4444")
    w.session(T0, schema.OPEN, "ssmp", 7, None, "127.0.0.1", None, None)
    w.session(T0, schema.AUTH_FAILURE, "ssmp", 7, "eve", "127.0.0.1", "secret", "wrong secret")
    (path,) = w.flush()
    assert same_schema(pq.read_schema(path), schema.SESSIONS_SCHEMA)
    found = [{k: v for k, v in r.items() if k != "ts"} for r in pq.read_table(path).to_pylist()]
    assert found == [
        {
            "event": "open",
            "protocol": "ssmp",
            "session_id": 7,
            "identity": None,
            "host": "127.0.0.1",
            "scheme": None,
            "reason": None,
            "escaped": None,
            "node": "db1:4444",
        },
        {
            "event": "auth_failure",
            "protocol": "ssmp",
            "session_id": 7,
            "identity": "eve",
            "host": "127.0.0.1",
            "scheme": "secret",
            "reason": "wrong secret",
            "escaped": None,
            "node": "db1:4444",
        },
    ]


def test_close_writes_what_is_pending_stops_the_thread_and_refuses_more(tmp_path):
    w = journal(tmp_path, rotate_seconds=3600, start=True)
    mcast(w)
    w.close()
    assert not w._thread.is_alive()
    assert len(rows(tmp_path)) == 1
    mcast(w)
    assert (w.pending, w.dropped) == (0, 1)
    w.close()  # idempotent


def test_the_first_rotation_imports_nothing(tmp_path):
    """pyarrow initializes lazily on its first conversion (with pandas installed, it imports
    pandas: half a second holding the GIL). The writer does that when it is made, at broker
    start: a rotation in the middle of traffic must not stall the reactor with imports. In a
    fresh interpreter, so nothing else imported it first."""
    import subprocess
    import sys

    script = (
        "import sys, pathlib\n"
        "from msgbroker.plugins.journal.writer import JournalWriter\n"
        f"w = JournalWriter(pathlib.Path({str(tmp_path)!r}), start=False)\n"
        "before = set(sys.modules)\n"
        "w.run(1, 'ssmp', 'a', 'mcast', 't', 2, lambda: [b'x', b'y'], {'ssmp': 1}, 0)\n"
        "w.session(1, 'open', 'ssmp', 1, None, '', None, None)\n"
        "assert len(w.flush()) == 2\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
