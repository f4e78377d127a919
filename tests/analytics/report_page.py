"""The report without a JVM, for the tests of the page a person reads: a stand-in for the
SparkContext that runs the report's tasks (:mod:`msgbroker.analytics.partials`, plain
pyarrow) in this process, and a journal that looks like a real broker's (session ids are
microsecond timestamps, as the journal plugin numbers them)."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from msgbroker.analytics.journal_files import MESSAGES_COLUMNS, SESSIONS_COLUMNS
from msgbroker.analytics.report import Report, run_report
from tests.analytics.journal_data import message, session, write_segment


class _LocalRDD:
    def __init__(self, partitions: list[list[Any]]) -> None:
        self.partitions = partitions

    def mapPartitions(self, function: Callable[[Iterator[Any]], Iterable[Any]]) -> _LocalRDD:
        return _LocalRDD([list(function(iter(p))) for p in self.partitions])

    def collect(self) -> list[Any]:
        return [item for partition in self.partitions for item in partition]


class LocalContext:
    """As much of a SparkContext as :func:`run_report` uses, running each partition here."""

    defaultParallelism = 2

    def parallelize(self, items: list[Any], slices: int) -> _LocalRDD:
        return _LocalRDD([items[i::slices] for i in range(slices)])


def local_report(journal: Path, out: Path, **options: Any) -> Report:
    return run_report(LocalContext(), journal, out, **options)  # type: ignore[arg-type]


#: the first session id: the journal's start time in microseconds, as the plugin numbers them
FIRST_SESSION_ID = 1_795_539_450_786_550
START = dt.datetime(2026, 11, 24, 9, 0, tzinfo=dt.UTC)


def write_demo_journal(root: Path, minutes: int = 12) -> Path:
    """Twelve minutes of a small site: a dozen sessions on the four protocols publishing to a
    handful of topics (a few messages dropped for a slow consumer), a pipelined run, one
    sbus client that never closes, and a burst of refused logins from one address."""
    rng = random.Random(14)
    topics = ["sensors/kitchen/temp", "sensors/hall/temp", "news", "alerts/fire", "chat/lobby"]
    senders = [("ssmp", "alice"), ("stmp", "bob"), ("mm2", "carol"), ("sbus", "dave")]
    messages, sessions = [], []
    sid = FIRST_SESSION_ID
    for index, (protocol, identity) in enumerate(senders * 3):
        opened = START + dt.timedelta(seconds=5 + 40 * index)
        host = "" if protocol == "sbus" else f"10.0.0.{index + 10}"
        sessions.append(session(opened, "open", protocol, sid, host))
        sessions.append(session(opened, "login", protocol, sid, host, identity, "open"))
        if index != 3:  # one sbus client still connected at the end
            closed = opened + dt.timedelta(seconds=rng.uniform(20, 500))
            sessions.append(session(closed, "close", protocol, sid, host, identity, None, "quit"))
        sid += rng.randint(200_000, 90_000_000)
    for attempt in range(6):
        ts = START + dt.timedelta(minutes=7, seconds=attempt)
        sessions.append(session(ts, "open", "ssmp", sid, "203.0.113.7"))
        who = rng.choice(["admin", "root", "alice"])
        sessions.append(
            session(ts, "auth_failure", "ssmp", sid, "203.0.113.7", who, "secret", "bad secret")
        )
        sessions.append(session(ts, "close", "ssmp", sid, "203.0.113.7", None, None, "auth"))
        sid += 1
    for minute in range(minutes):
        for _ in range(rng.randint(15, 40) + (25 if 4 <= minute <= 6 else 0)):
            ts = START + dt.timedelta(minutes=minute, seconds=rng.uniform(0, 59.9))
            protocol, sender = rng.choice(senders)
            topic = rng.choices(topics, weights=[8, 6, 4, 1, 3])[0]
            recipients = {p: rng.randint(0, 3) for p in ("ssmp", "stmp", "mm2", "sbus")}
            dropped = 1 if topic == "sensors/kitchen/temp" and rng.random() < 0.05 else 0
            size = rng.randint(8, 400)
            row = message(ts, protocol, sender, "mcast", topic, size, recipients, dropped=dropped)
            messages.append(row)
    run = {"ssmp": 2, "stmp": 1}
    at_five = START + dt.timedelta(minutes=5)
    messages.append(message(at_five, "ssmp", "alice", "mcast", "news", 900, run, count=30))
    messages.sort(key=lambda row: row["ts"])
    sessions.sort(key=lambda row: row["ts"])
    day = f"date={START:%Y-%m-%d}"
    half = len(messages) // 2
    write_segment(root / "messages" / day / "seg-00000001.parquet", messages[:half],
                  MESSAGES_COLUMNS)  # fmt: skip
    write_segment(root / "messages" / day / "seg-00000002.parquet", messages[half:],
                  MESSAGES_COLUMNS)  # fmt: skip
    write_segment(root / "sessions" / day / "seg-00000001.parquet", sessions, SESSIONS_COLUMNS)
    return root
