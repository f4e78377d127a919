"""The ``msgbroker`` streaming sink and the journal stats query, against a real broker.

A raw SSMP subscriber socket watches the ``_stats/topic/...`` topics. "Nothing more arrived"
is checked without waiting for a timeout: after the step under test, a sentinel is published
on the same topic by another client, and everything before the sentinel is what the step
delivered (the broker routes in arrival order, and the step's publishes were all answered
``200`` before the sentinel was sent).
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from msgbroker.analytics.datasource import (  # noqa: E402 - after the importorskips
    MsgbrokerStreamWriter,
    PublishRows,
    read_state,
    register,
)
from msgbroker.analytics.stream import run_stream  # noqa: E402
from msgbroker.plugins.ssmp.client import BlockingSSMPClient  # noqa: E402
from tests.ssmp.e2e_support import WAIT, RunningBroker, running_broker  # noqa: E402

pytestmark = pytest.mark.spark

SENTINEL = "sentinel"
#: a micro-batch starts Python workers and JVM jobs: seconds, more on a loaded 2-core machine
SPARK_WAIT = 90.0

#: the journal's messages table (plugins/journal/schema.py, ``messages/2``); ``messages/1``
#: segments have no ``count`` and an int32 ``payload_size``
MESSAGES_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("protocol", pa.string(), nullable=False),
        pa.field("sender", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("count", pa.int32(), nullable=False),
        pa.field("payload_size", pa.int64(), nullable=False),
        pa.field("recipients", pa.map_(pa.string(), pa.int32()), nullable=False),
        pa.field("delivered", pa.int32(), nullable=False),
        pa.field("skipped", pa.int32(), nullable=False),
        pa.field("dropped", pa.int32(), nullable=False),
        pa.field("payload", pa.binary()),
    ]
)
MESSAGES_V1_SCHEMA = pa.schema(
    [
        pa.field("payload_size", pa.int32(), nullable=False) if f.name == "payload_size" else f
        for f in MESSAGES_SCHEMA
        if f.name != "count"
    ]
)


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    with running_broker(("ssmp=tcp:0:interface=127.0.0.1",), auth=("open",)) as b:
        yield b


class Subscriber:
    """A raw SSMP socket subscribed to ``topics``; :meth:`until_sentinel` reads deliveries."""

    def __init__(self, broker: RunningBroker, *topics: str) -> None:
        self.broker = broker
        self.topics = topics
        self.sock = socket.create_connection((broker.host, broker.port), timeout=WAIT)
        self.buffer = b""
        request = b"LOGIN s open\n" + b"".join(b"SUBSCRIBE %s\n" % t.encode() for t in topics)
        self.sock.sendall(request)
        for _ in range(1 + len(topics)):
            assert self.line() == "200"

    def line(self) -> str:
        while b"\n" not in self.buffer:
            data = self.sock.recv(65536)  # the socket's timeout (WAIT) fails a stuck test
            if not data:
                raise AssertionError(f"the broker closed the subscriber: {self.buffer!r}")
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def until_sentinel(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Publish a sentinel on the first topic and return (sender, topic, JSON payload)
        of every delivery before it."""
        with BlockingSSMPClient(self.broker.host, self.broker.port, "sentinel") as client:
            client.mcast(self.topics[0], SENTINEL.encode())
        received = []
        while True:
            line = self.line()
            if line.endswith(" PING"):  # the broker's keepalive ("000 . PING"), while Spark works
                self.sock.sendall(b"PONG\n")
                continue
            fields = line.split(" ", 4)
            assert len(fields) == 5 and (fields[0], fields[2]) == ("000", "MCAST"), line
            _, sender, _, topic, payload = fields
            if payload == SENTINEL:
                return received
            received.append((sender, topic, json.loads(payload)))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def subscriber(broker: RunningBroker) -> Iterator[Any]:
    subscribers: list[Subscriber] = []

    def make(*topics: str) -> Subscriber:
        subscribers.append(Subscriber(broker, *topics))
        return subscribers[-1]

    yield make
    for s in subscribers:
        s.close()


def stats_rows(spark: Any, directory: Path, rows: list[tuple[str, dict[str, Any]]]) -> Any:
    """A parquet file of (topic, payload JSON) rows, read back as a file stream."""
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"topic": [t for t, _ in rows], "payload": [json.dumps(p) for _, p in rows]})
    pq.write_table(table, directory / f"part-{len(list(directory.iterdir()))}.parquet")
    return spark.readStream.schema("topic string, payload string").parquet(str(directory))


def finished(query: Any) -> None:
    """Wait for an ``availableNow`` query to end; it must have succeeded."""
    try:
        assert query.awaitTermination(SPARK_WAIT), f"still running after {SPARK_WAIT} s"
    finally:
        query.stop()
    assert query.exception() is None


# -- the data source alone ------------------------------------------------------------------


def test_sink_publishes_each_row_as_mcast(
    spark: Any, broker: RunningBroker, subscriber: Any, tmp_path: Path
) -> None:
    register(spark)
    sub = subscriber("_stats/topic/x", "_stats/topic/y")
    rows = stats_rows(
        spark,
        tmp_path / "in",
        [("_stats/topic/x", {"n": 1}), ("_stats/topic/y", {"n": 2}), ("bad topic", {"n": 3})],
    )
    query = (
        rows.writeStream.format("msgbroker")
        .option("broker", f"{broker.host}:{broker.port}")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    finished(query)

    received = sub.until_sentinel()

    assert sorted(received, key=lambda r: r[1]) == [
        ("spark-stats", "_stats/topic/x", {"n": 1}),
        ("spark-stats", "_stats/topic/y", {"n": 2}),
    ]
    # the state file went beside Spark's checkpoint, recording batch 0
    assert read_state(tmp_path / "checkpoint" / "msgbroker-sink.state") == 0


def test_commit_of_the_same_batch_id_twice_publishes_once(
    broker: RunningBroker, subscriber: Any, tmp_path: Path
) -> None:
    sub = subscriber("_stats/topic/x")
    writer = MsgbrokerStreamWriter(
        {"broker": f"{broker.host}:{broker.port}", "state": str(tmp_path / "state")}
    )
    batch = [PublishRows([("_stats/topic/x", b'{"n":7}')]), None]

    writer.commit(batch, 7)
    writer.commit(batch, 7)  # Spark replaying batch 7 after a restart
    writer.commit([PublishRows([("_stats/topic/x", b'{"n":6}')])], 6)  # an older one

    assert sub.until_sentinel() == [("spark-stats", "_stats/topic/x", {"n": 7})]
    assert read_state(tmp_path / "state") == 7


def test_abort_publishes_nothing(broker: RunningBroker, subscriber: Any, tmp_path: Path) -> None:
    sub = subscriber("_stats/topic/x")
    writer = MsgbrokerStreamWriter(
        {"broker": f"{broker.host}:{broker.port}", "state": str(tmp_path / "state")}
    )

    writer.abort([PublishRows([("_stats/topic/x", b'{"n":1}')])], 0)

    assert sub.until_sentinel() == []
    assert read_state(tmp_path / "state") is None


def test_restart_replaying_a_published_batch_does_not_publish_it_again(
    spark: Any, broker: RunningBroker, subscriber: Any, tmp_path: Path
) -> None:
    register(spark)
    sub = subscriber("_stats/topic/x")
    checkpoint = tmp_path / "checkpoint"

    def run_once(rows: Any) -> None:
        query = (
            rows.writeStream.format("msgbroker")
            .option("broker", f"{broker.host}:{broker.port}")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        finished(query)

    run_once(stats_rows(spark, tmp_path / "in", [("_stats/topic/x", {"n": 1})]))
    assert sub.until_sentinel() == [("spark-stats", "_stats/topic/x", {"n": 1})]
    # a crash after the sink published batch 0 but before Spark logged its commit: Spark
    # runs batch 0 again on restart, under the same id
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)  # Hadoop's checksum of it
    run_once(stats_rows(spark, tmp_path / "in", [("_stats/topic/x", {"n": 2})]))

    # batch 0 (n=1) is not published again; the new file's batch 1 (n=2) is
    assert sub.until_sentinel() == [("spark-stats", "_stats/topic/x", {"n": 2})]
    assert read_state(checkpoint / "msgbroker-sink.state") == 1


# -- the journal stats query end to end -----------------------------------------------------

T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def journal_rows(*rows: tuple[float, str, str | None] | tuple[float, str, str, int]) -> Any:
    """A ``messages/2`` table of (seconds after T0, kind, topic[, count]) rows."""
    n = len(rows)
    return pa.table(
        {
            "ts": [T0 + dt.timedelta(seconds=row[0]) for row in rows],
            "protocol": ["ssmp"] * n,
            "sender": ["alice"] * n,
            "kind": [row[1] for row in rows],
            "topic": [row[2] for row in rows],
            "count": [row[3] if len(row) > 3 else 1 for row in rows],  # type: ignore[misc]
            "payload_size": [5] * n,
            "recipients": [[("ssmp", 1)]] * n,
            "delivered": [1] * n,
            "skipped": [0] * n,
            "dropped": [0] * n,
            "payload": [None] * n,
        },
        schema=MESSAGES_SCHEMA,
    )


def v1(table: Any) -> Any:
    """The same rows as a ``messages/1`` segment (one message per row, no ``count``)."""
    return table.drop_columns(["count"]).cast(MESSAGES_V1_SCHEMA)


def append_segment(journal: Path, seq: int, table: Any) -> None:
    """As the journal plugin does: a hidden temporary, then a rename."""
    directory = journal / "messages" / f"date={T0:%Y-%m-%d}"
    directory.mkdir(parents=True, exist_ok=True)
    temp = directory / f".seg-{seq:08d}.parquet.tmp"
    pq.write_table(table, temp)
    temp.rename(directory / f"seg-{seq:08d}.parquet")


def stats(received: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, str, int, float]]:
    return sorted((topic, p["window_start"], p["messages"], p["rate"]) for _, topic, p in received)


def test_journal_stats_stream_publishes_counts_per_topic_and_window(
    spark: Any, broker: RunningBroker, subscriber: Any, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    (journal / "messages").mkdir(parents=True)
    query = run_stream(
        spark,
        journal,
        f"{broker.host}:{broker.port}",
        window="10 seconds",
        watermark="2 seconds",
        checkpoint=tmp_path / "checkpoint",
        trigger={"processingTime": "100 milliseconds"},
    )
    try:
        # started on an empty journal: the first date directory appears later
        query.processAllAvailable()
        # watched: a, b and the sink's own feedback topic, which must never be counted
        sub = subscriber("_stats/topic/a", "_stats/topic/b", "_stats/topic/_stats/x")
        append_segment(
            journal,
            1,
            v1(
                journal_rows(
                    (1, "mcast", "a"),
                    (2, "mcast", "a"),
                    (3, "mcast", "a"),
                    (4, "mcast", "b"),
                    (5, "mcast", "b"),
                    (5, "ucast", "a"),  # a target, not a topic
                    (6, "bcast", None),
                    (6, "mcast", "_stats/x"),  # stats of stats would feed back
                    (7, "mcast", "x" * 52),  # _stats/topic/ + 52 > 64: not an SSMP id
                )
            ),
        )
        # a journal's other files: a foreign one and a temporary still being written
        (journal / "messages" / f"date={T0:%Y-%m-%d}" / "notes.txt").write_text("hello")
        (journal / "messages" / f"date={T0:%Y-%m-%d}" / ".seg-00000003.parquet.tmp").write_bytes(
            b"PAR1 half a segment"
        )
        query.processAllAvailable()
        # the watermark (7 s - 2 s) has not passed the first window's end (10 s)
        first = sub.until_sentinel()

        # a node of a cluster also journals its deliveries of messages another node
        # published (origin_node): that node counts them, not this one
        rows = journal_rows(
            (8, "mcast", "a", 3), (9, "mcast", "a"), (9, "mcast", "a", 5), (12, "mcast", "a")
        )
        rows = rows.append_column("node", pa.array(["west:4444"] * 4)).append_column(
            "origin_node", pa.array([None, None, "east:4444", None], pa.string())
        )
        append_segment(journal, 2, rows)
        query.processAllAvailable()
        # 12 s - 2 s: the first window is final (8 s, a run of 3, and 9 s were in time)
        second = sub.until_sentinel()

        append_segment(journal, 3, journal_rows((25, "subscribe", "z")))
        query.processAllAvailable()
        # any journal row moves the watermark on: 25 s - 2 s closes the second window
        third = sub.until_sentinel()
    finally:
        query.stop()
    assert query.exception() is None

    w1, w2, w3 = "2026-11-22T12:00:00Z", "2026-11-22T12:00:10Z", "2026-11-22T12:00:20Z"
    assert first == []
    assert stats(second) == [("_stats/topic/a", w1, 7, 0.7), ("_stats/topic/b", w1, 2, 0.2)]
    assert stats(third) == [("_stats/topic/a", w2, 1, 0.1)]
    assert {sender for sender, _, _ in second + third} == {"spark-stats"}
    payload = third[0][2]
    assert list(payload) == ["window_start", "window_end", "messages", "rate"]
    assert payload["window_end"] == w3
