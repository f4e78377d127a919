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

import pyarrow as pa

from msgbroker.analytics.journal_files import MESSAGES_COLUMNS, NODE_COLUMNS, SESSIONS_COLUMNS
from msgbroker.analytics.report import Report, run_report
from msgbroker.nodes import file_form
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
    messages, sessions = demo_rows(random.Random(14), minutes)
    write_demo_segments(root, messages, sessions)
    return root


def write_demo_cluster(root: Path, nodes: tuple[str, ...] = ("db1:4444", "db2:4444")) -> Path:
    """The demo site on two nodes of a cluster sharing one journal directory: each node has
    publishers and sessions of its own (the second a third as busy), and the messages on
    the topics the other node has subscribers for (news, alerts, chat) reach them there,
    which journals its deliveries with the message's ``origin_node``."""
    rows = {
        node: demo_rows(random.Random(14 + i), 12, FIRST_SESSION_ID + i * 600_000_000, 3**i)
        for i, node in enumerate(nodes)
    }
    rng = random.Random(16)
    remote: dict[str, list[dict[str, Any]]] = {node: [] for node in nodes}
    for node, (messages, _) in rows.items():
        for other in (n for n in nodes if n != node):
            for row in messages:
                if row["topic"].startswith("sensors/"):
                    continue  # nobody on the other node: the engine does not send it there
                recipients = {p: rng.randint(0, 2) for p in ("ssmp", "mm2")}
                remote[other].append(
                    dict(row, ts=row["ts"] + dt.timedelta(milliseconds=1),
                         recipients=list(recipients.items()),
                         delivered=sum(recipients.values()), dropped=0, origin_node=node)
                )  # fmt: skip
    for node, (messages, sessions) in rows.items():
        local = [dict(row, node=node) for row in messages] + [
            dict(row, node=node) for row in remote[node]
        ]
        local.sort(key=lambda row: row["ts"])
        write_demo_segments(root, local, [dict(row, node=node) for row in sessions], node)
    return root


def demo_rows(
    rng: random.Random, minutes: int, first_session_id: int = FIRST_SESSION_ID, quiet: int = 1
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The demo site's message and session rows (``quiet``: a site that many times less
    busy)."""
    topics = ["sensors/kitchen/temp", "sensors/hall/temp", "news", "alerts/fire", "chat/lobby"]
    senders = [("ssmp", "alice"), ("stmp", "bob"), ("mm2", "carol"), ("sbus", "dave")]
    messages, sessions = [], []
    sid = first_session_id
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
        for _ in range((rng.randint(15, 40) + (25 if 4 <= minute <= 6 else 0)) // quiet):
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
    return messages, sessions


def write_demo_segments(
    root: Path, messages: list[dict[str, Any]], sessions: list[dict[str, Any]], node: str = ""
) -> None:
    """The rows as the journal lays them out: two message segments and one of sessions, of
    ``node`` (with its columns and file names), or as before node names."""
    day = f"date={START:%Y-%m-%d}"
    half = len(messages) // 2
    prefix = f"seg-{file_form(node)}-" if node else "seg-"
    message_columns, session_columns = MESSAGES_COLUMNS, SESSIONS_COLUMNS
    if node:
        message_columns = pa.schema([*MESSAGES_COLUMNS, *NODE_COLUMNS["messages"]])
        session_columns = pa.schema([*SESSIONS_COLUMNS, *NODE_COLUMNS["sessions"]])
    write_segment(root / "messages" / day / f"{prefix}00000001.parquet", messages[:half],
                  message_columns)  # fmt: skip
    write_segment(root / "messages" / day / f"{prefix}00000002.parquet", messages[half:],
                  message_columns)  # fmt: skip
    write_segment(root / "sessions" / day / f"{prefix}00000001.parquet", sessions,
                  session_columns)  # fmt: skip
