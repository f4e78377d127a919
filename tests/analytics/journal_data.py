"""A small journal with known contents, written with pyarrow in the journal's layout.

Ten message rows (eleven messages: one row is a run of three) over two dates (23:58 on the
21st to 00:02 on the 22nd) in three segments, the first an older ``messages/1`` one (no
``count``, int32 ``payload_size``),
five sessions, and the files a real journal directory may also hold: a temporary being
written (hidden, ignored), a ``_SUCCESS`` marker (ignored), a truncated segment, a Parquet
file of another program, and a stray text file (each reported and skipped). The expected
aggregates are worked out by hand in the tests that use it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import attrs
import pyarrow as pa
import pyarrow.parquet as pq

from msgbroker.analytics.journal_files import MESSAGES_COLUMNS, SESSIONS_COLUMNS

#: the first version of the messages table: a row per message
MESSAGES_V1 = pa.schema(
    [
        pa.field("payload_size", pa.int32()) if f.name == "payload_size" else f
        for f in MESSAGES_COLUMNS
        if f.name != "count"
    ]
)

DAY1 = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
DAY2 = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)


def at(day: dt.datetime, hms: str) -> dt.datetime:
    h, m, s = (float(x) for x in hms.split(":"))
    return day + dt.timedelta(hours=h, minutes=m, seconds=s)


def message(ts, protocol, sender, kind, topic, size, recipients, skipped=0, dropped=0, count=1):
    """A row: ``count`` messages (a pipelined run) of ``size`` bytes in all; ``recipients``,
    ``skipped`` per message, ``dropped`` in all, as the journal writes them."""
    return {
        "ts": ts,
        "protocol": protocol,
        "sender": sender,
        "kind": kind,
        "topic": topic,
        "count": count,
        "payload_size": size,
        "recipients": list(recipients.items()),
        "delivered": sum(recipients.values()),
        "skipped": skipped,
        "dropped": dropped,
        "payload": None,
    }


def session(ts, event, protocol, sid, host, identity=None, scheme=None, reason=None):
    return {
        "ts": ts,
        "event": event,
        "protocol": protocol,
        "session_id": sid,
        "identity": identity,
        "host": host,
        "scheme": scheme,
        "reason": reason,
    }


# fmt: off
MESSAGE_SEGMENTS = {
    ("2026-11-21", 1): [
        message(at(DAY1, "23:58:10"), "ssmp", "alice", "mcast", "news", 10, {"ssmp": 2, "stmp": 1}),
        message(at(DAY1, "23:58:40"), "ssmp", "alice", "mcast", "news", 20, {"ssmp": 2}, skipped=1),
        message(at(DAY1, "23:59:05"), "stmp", "bob", "mcast", "weather", 5, {"ssmp": 1}, dropped=1),
        message(at(DAY1, "23:59:30"), "ssmp", "alice", "subscribe", "news", 0, {}),
    ],
    ("2026-11-22", 2): [
        message(at(DAY2, "00:00:15"), "mm2", "carol", "mcast", "news", 100, {"ssmp": 2, "mm2": 1},
                dropped=2),
        message(at(DAY2, "00:00:20"), "sbus", "dave", "ucast", "alice", 7, {"ssmp": 1}),
        message(at(DAY2, "00:00:50"), "ssmp", "alice", "bcast", None, 3,
                {"ssmp": 3, "stmp": 1, "mm2": 1, "sbus": 1}),
        message(at(DAY2, "00:01:10"), "stmp", "bob", "mcast", "weather", 5, {}, skipped=2),
    ],
    ("2026-11-22", 3): [
        message(at(DAY2, "00:01:20"), "ssmp", "alice", "mcast", "news", 90, {"ssmp": 2, "stmp": 1},
                count=3),
        message(at(DAY2, "00:02:00"), "stmp", "bob", "mcast", "sport", 50, {"ssmp": 1}),
    ],
}

SESSION_SEGMENTS = {
    ("2026-11-21", 1): [
        session(at(DAY1, "23:50:00"), "open", "ssmp", 1, "10.0.0.1"),
        session(at(DAY1, "23:50:01"), "login", "ssmp", 1, "10.0.0.1", "alice", "open"),
        session(at(DAY1, "23:55:00"), "open", "stmp", 2, "10.0.0.2"),
        session(at(DAY1, "23:55:01"), "auth_failure", "stmp", 2, "10.0.0.2", "mallory", "secret",
                "bad secret"),
        session(at(DAY1, "23:55:02"), "close", "stmp", 2, "10.0.0.2", None, None, "auth failed"),
    ],
    ("2026-11-22", 2): [
        session(at(DAY2, "00:00:30"), "close", "ssmp", 1, "10.0.0.1", "alice", None, "quit"),
        session(at(DAY2, "00:01:00"), "open", "mm2", 3, "10.0.0.2"),
        session(at(DAY2, "00:01:01"), "auth_failure", "mm2", 3, "10.0.0.2", "mallory", "secret"),
        session(at(DAY2, "00:01:02"), "auth_failure", "mm2", 3, "10.0.0.2", "eve", "secret"),
        session(at(DAY2, "00:01:03"), "login", "mm2", 3, "10.0.0.2", "carol", "secret"),
        session(at(DAY2, "00:02:00"), "open", "sbus", 4, ""),
        session(at(DAY2, "00:02:00.5"), "login", "sbus", 4, "", "dave", "open"),
        session(at(DAY2, "00:02:10"), "close", "sbus", 4, "", "dave", None, "eof"),
        session(at(DAY2, "00:02:59"), "open", "ssmp", 5, "10.0.0.9"),
        session(at(DAY2, "00:03:00"), "auth_failure", "ssmp", 5, "10.0.0.9", "mallory", "secret"),
        session(at(DAY2, "00:03:01"), "close", "ssmp", 5, "10.0.0.9", None, None, "auth failed"),
    ],
}
# fmt: on


@attrs.frozen
class SampleJournal:
    root: Path
    #: files that must be reported and skipped
    bad: frozenset[Path]
    #: files that must be passed over without a word
    ignored: frozenset[Path]


def write_segment(path: Path, rows: list[dict], schema: pa.Schema) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_sample_journal(root: Path) -> SampleJournal:
    for (day, seq), rows in MESSAGE_SEGMENTS.items():
        path = root / "messages" / f"date={day}" / f"seg-{seq:08d}.parquet"
        if seq == 1:  # written by an older broker
            assert all(r["count"] == 1 for r in rows)
            write_segment(path, [{k: v for k, v in r.items() if k != "count"} for r in rows],
                          MESSAGES_V1)  # fmt: skip
        else:
            write_segment(path, rows, MESSAGES_COLUMNS)
    for (day, seq), rows in SESSION_SEGMENTS.items():
        write_segment(
            root / "sessions" / f"date={day}" / f"seg-{seq:08d}.parquet", rows, SESSIONS_COLUMNS
        )
    day2 = root / "messages" / "date=2026-11-22"

    # a segment being written: hidden, half there
    temp = day2 / ".seg-00000004.parquet.tmp"
    temp.write_bytes(b"PAR1 not yet")
    success = root / "messages" / "_SUCCESS"
    success.write_bytes(b"")

    # a segment cut short (a full disk, a copy interrupted): valid rows, no footer
    truncated = write_segment(
        day2 / "seg-00000005.parquet", MESSAGE_SEGMENTS[("2026-11-22", 3)] * 50, MESSAGES_COLUMNS
    )
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])

    # another program's Parquet file in the sessions table
    foreign = root / "sessions" / "date=2026-11-22" / "seg-00000099.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), foreign)

    # right columns, wrong type: a session_id written as a string
    wrong_type = root / "sessions" / "date=2026-11-22" / "seg-00000100.parquet"
    rows = [dict(r, session_id=str(r["session_id"])) for r in SESSION_SEGMENTS[("2026-11-22", 2)]]
    schema = SESSIONS_COLUMNS.set(
        SESSIONS_COLUMNS.get_field_index("session_id"), pa.field("session_id", pa.string())
    )
    write_segment(wrong_type, rows, schema)

    stray = root / "messages" / "README.txt"
    stray.write_text("notes about this journal\n")
    return SampleJournal(
        root, frozenset({truncated, foreign, wrong_type, stray}), frozenset({temp, success})
    )
