"""The analytics report: the journal's traffic, fan-out, drops, talkers and sessions.

:func:`run_report` reads the journal's two tables with Spark (explicit schemas, only the
files :mod:`.journal_files` vouched for), computes every aggregate on the cluster, brings
the results back to the driver as Arrow tables (they are small: one row per topic, sender,
minute...), and writes them there: ``REPORT_DIR/tables/<name>/part-00000.parquet`` and
``REPORT_DIR/index.html`` with PNG charts. Writing on the driver means the report lands on
the machine that asked for it, with or without a filesystem shared with a cluster; only
the journal directory has to be readable by the executors.

A journal row stands for ``count`` messages (a pipelined run the broker routed at once;
``messages/1`` segments have no ``count``: 1 each): messages are ``sum(count)``, bytes
``sum(payload_size)`` (a run's total), deliveries and skips ``sum(delivered * count)``
(per message in the row), drops ``sum(dropped)`` (a run's total), and the fan-out
histogram weighs each row's ``delivered`` by its ``count``.

Which rows count as traffic: ``mcast``, ``ucast`` and ``bcast``. ``subscribe`` and
``unsubscribe`` rows (presence) appear in the ``kinds`` table and in the drop totals, not in
the traffic tables. "Topics" are mcast topics (a ucast's ``topic`` is its target identity).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import charts, html
from .journal_files import MESSAGES, SESSIONS, SkippedFile, list_table

__all__ = ["TABLES", "Report", "SkippedFile", "parse_time", "run_report"]

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

MESSAGES_DDL = (
    "ts TIMESTAMP, protocol STRING, sender STRING, kind STRING, topic STRING, count INT, "
    "payload_size BIGINT, recipients MAP<STRING, INT>, delivered INT, skipped INT, "
    "dropped INT, payload BINARY"
)
SESSIONS_DDL = (
    "ts TIMESTAMP, event STRING, protocol STRING, session_id BIGINT, identity STRING, "
    "host STRING, scheme STRING, reason STRING"
)
TRAFFIC_KINDS = ("mcast", "ucast", "bcast")
#: how many topics get their own per-minute series (``topics_by_minute``)
TOP_TOPICS_SERIES = 10

#: every table the report writes, in the order index.html shows them
TABLES = (
    "summary",
    "kinds",
    "protocols",
    "recipient_protocols",
    "traffic_by_minute",
    "topics",
    "topics_by_minute",
    "senders_by_minute",
    "top_talkers",
    "fanout",
    "drops_by_topic",
    "auth_failures_by_identity",
    "auth_failures_by_host",
    "sessions",
)


@attrs.frozen
class Report:
    """What :func:`run_report` wrote."""

    out_dir: Path
    index: Path
    tables: dict[str, pa.Table]
    charts: tuple[Path, ...]
    skipped: tuple[SkippedFile, ...]

    def table_path(self, name: str) -> Path:
        return self.out_dir / "tables" / name


def parse_time(text: str) -> dt.datetime:
    """An ISO 8601 date or date-time for ``--since``/``--until``; without a zone it is UTC."""
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def run_report(
    spark: SparkSession,
    journal_dir: Path,
    out_dir: Path,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    on_skip: Callable[[SkippedFile], None] | None = None,
) -> Report:
    """Compute the report of ``journal_dir`` rows in ``[since, until)`` into ``out_dir``.

    Files that are not journal segments are passed to ``on_skip`` (as found), listed in the
    report, and otherwise ignored.
    """
    journal_dir, out_dir = Path(journal_dir), Path(out_dir)
    listed = {t: list_table(journal_dir, t, since, until) for t in (MESSAGES, SESSIONS)}
    skipped = listed[MESSAGES].skipped + listed[SESSIONS].skipped
    if on_skip is not None:
        for item in skipped:
            on_skip(item)

    messages = _read(spark, listed[MESSAGES].segments, MESSAGES_DDL, since, until)
    sessions = _read(spark, listed[SESSIONS].segments, SESSIONS_DDL, since, until)
    from pyspark.sql import functions as F

    messages = messages.drop("payload").withColumn("count", F.coalesce(F.col("count"), F.lit(1)))
    tables = aggregate(messages, sessions)
    tables["summary"] = summarize(tables, since, until, len(skipped))

    tables_dir = out_dir / "tables"
    for name in TABLES:
        target = tables_dir / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        pq.write_table(tables[name], target / "part-00000.parquet")
    chart_paths = charts.render_all(tables, out_dir / "charts")
    index = html.write_index(out_dir, journal_dir, tables, chart_paths, skipped)
    return Report(out_dir, index, tables, tuple(chart_paths), skipped)


def _read(
    spark: SparkSession,
    paths: tuple[Path, ...],
    ddl: str,
    since: dt.datetime | None,
    until: dt.datetime | None,
) -> DataFrame:
    from pyspark.sql import functions as F

    if paths:
        frame = spark.read.schema(ddl).parquet(*(str(p) for p in paths))
    else:
        frame = spark.createDataFrame([], ddl)
    if since is not None:
        frame = frame.where(F.col("ts") >= F.lit(since))
    if until is not None:
        frame = frame.where(F.col("ts") < F.lit(until))
    return frame


def aggregate(messages: DataFrame, sessions: DataFrame) -> dict[str, pa.Table]:
    """Every table but ``summary``, computed by Spark and collected as Arrow tables.

    A Spark job costs a scan of the journal plus fixed overhead, so each pass groups at the
    finest grain several tables need and the driver rolls that up with pyarrow (milliseconds
    for the ~10^5 rows that come back): four passes over the messages, not one per table.
    """
    from pyspark.sql import functions as F

    minute = F.date_trunc("minute", F.col("ts")).alias("minute")
    traffic = messages.where(F.col("kind").isin(*TRAFFIC_KINDS))
    tables: dict[str, pa.Table] = {}

    # pass 1: kind x minute x protocol x sender
    grain = _collect(
        messages.groupBy("kind", minute, "protocol", "sender").agg(
            *_volume(), *_outcomes(), F.min("ts").alias("first"), F.max("ts").alias("last")
        )
    )
    tables["kinds"] = _sorted(
        _rollup(grain, ["kind"], VOLUME + OUTCOMES, [("first", "min"), ("last", "max")]),
        [("messages", "descending"), ("kind", "ascending")],
    )
    grain = grain.filter(pc.is_in(grain.column("kind"), pa.array(TRAFFIC_KINDS)))
    tables["protocols"] = _sorted(
        _rollup(grain, ["protocol"], VOLUME + OUTCOMES),
        [("messages", "descending"), ("protocol", "ascending")],
    )
    tables["traffic_by_minute"] = _sorted(
        _rollup(grain, ["minute", "protocol"], VOLUME),
        [("minute", "ascending"), ("protocol", "ascending")],
    )
    tables["senders_by_minute"] = _sorted(
        _rollup(grain, ["minute", "sender"], VOLUME),
        [("minute", "ascending"), ("sender", "ascending")],
    )
    tables["top_talkers"] = _ranked(
        _rollup(grain, ["sender"], VOLUME, [("protocol", "count_distinct")]).rename_columns(
            {"protocol": "protocols"}
        )
    )

    # pass 2: kind x topic x fan-out (traffic only)
    by_topic = _collect(
        traffic.groupBy("kind", "topic", F.col("delivered").alias("fanout")).agg(
            *_volume(), *_outcomes()
        )
    )
    mcast = by_topic.filter(pc.equal(by_topic.column("kind"), "mcast"))
    topics = _sorted(
        _rollup(mcast, ["topic"], VOLUME + OUTCOMES),
        [("messages", "descending"), ("bytes", "descending"), ("topic", "ascending")],
    )
    tables["topics"] = topics
    tables["fanout"] = _sorted(
        _rollup(by_topic, ["fanout"], ["messages"]).rename_columns({"fanout": "delivered"}),
        [("delivered", "ascending")],
    )
    tables["drops_by_topic"] = _sorted(
        topics.filter(
            pc.greater(pc.add(topics.column("dropped"), topics.column("skipped")), 0)
        ).select(["topic", "dropped", "skipped", "messages"]),
        [("dropped", "descending"), ("skipped", "descending"), ("topic", "ascending")],
    )

    # pass 3: deliveries by the recipients' protocols
    tables["recipient_protocols"] = _sorted(
        _collect(
            traffic.select("count", F.explode("recipients").alias("protocol", "n"))
            .groupBy("protocol")
            .agg(F.sum(F.col("n") * F.col("count")).cast("long").alias("deliveries"))
        ),
        [("deliveries", "descending"), ("protocol", "ascending")],
    )

    # pass 4: the top topics' per-minute series (the top ones are known only now)
    top = topics.column("topic").to_pylist()[:TOP_TOPICS_SERIES]
    top_traffic = traffic.where((F.col("kind") == "mcast") & F.col("topic").isin(*top))
    tables["topics_by_minute"] = _sorted(
        _collect(top_traffic.groupBy(minute, "topic").agg(*_volume())),
        [("minute", "ascending"), ("topic", "ascending")],
    )

    failures = _collect(
        sessions.where(F.col("event") == "auth_failure")
        .groupBy("identity", "host")
        .agg(F.count(F.lit(1)).alias("failures"), F.max("ts").alias("last"))
    )
    tables["auth_failures_by_identity"] = _sorted(
        _rollup(
            failures, ["identity"], ["failures"], [("host", "count_distinct"), ("last", "max")]
        ).rename_columns({"host": "hosts"}),
        [("failures", "descending"), ("identity", "ascending")],
    )
    tables["auth_failures_by_host"] = _sorted(
        _rollup(
            failures, ["host"], ["failures"], [("identity", "count_distinct"), ("last", "max")]
        ).rename_columns({"identity": "identities"}),
        [("failures", "descending"), ("host", "ascending")],
    )
    tables["sessions"] = _sorted(
        _collect(_session_table(sessions)), [("opened", "ascending"), ("session_id", "ascending")]
    )
    return tables


VOLUME = ["messages", "bytes"]
OUTCOMES = ["delivered", "skipped", "dropped"]


def _rollup(
    table: pa.Table, keys: list[str], sums: list[str], others: Sequence[tuple[str, str]] = ()
) -> pa.Table:
    """``table`` grouped by ``keys``: ``sums`` summed, ``others`` as (column, pyarrow
    aggregate); columns keep their names, keys first. Distinct counts count nulls too (an
    anonymous identity is one)."""
    aggregations: list[tuple[str, str] | tuple[str, str, pc.FunctionOptions]] = [
        (c, "sum") for c in sums
    ]
    for column, function in others:
        if function == "count_distinct":
            aggregations.append((column, function, pc.CountOptions(mode="all")))
        else:
            aggregations.append((column, function))
    grouped = table.group_by(keys, use_threads=False).aggregate(aggregations)
    names = [*sums, *(c for c, _ in others)]
    columns = {k: grouped.column(k) for k in keys}
    for name, (column, function, *_) in zip(names, aggregations, strict=True):
        values = grouped.column(f"{column}_{function}")
        if function == "sum":
            values = values.cast(pa.int64())
        columns[name] = values
    return pa.table(columns)


def _session_table(sessions: DataFrame) -> DataFrame:
    """One row per ``session_id``: open → close, duration, and ``state``: ``closed``,
    ``open`` (no close yet: still connected, or the broker died), or ``partial`` (its open
    is before the journal or the ``--since`` window)."""
    from pyspark.sql import functions as F

    def at(event: str) -> Column:
        return F.when(F.col("event") == event, F.col("ts"))

    per_session = (
        sessions.where(F.col("session_id").isNotNull())
        .groupBy("session_id")
        .agg(
            F.min(at("open")).alias("opened"),
            F.max(at("close")).alias("closed"),
            F.first("protocol", ignorenulls=True).alias("protocol"),
            F.max(F.when(F.col("event").isin("login", "close"), F.col("identity"))).alias(
                "identity"
            ),
            F.first("host", ignorenulls=True).alias("host"),
            F.max(F.when(F.col("event") == "close", F.col("reason"))).alias("reason"),
        )
    )
    return per_session.select(
        "session_id",
        "protocol",
        "identity",
        "host",
        "opened",
        "closed",
        ((F.unix_micros("closed") - F.unix_micros("opened")).cast("double") / F.lit(1e6)).alias(
            "duration_s"
        ),
        F.when(F.col("closed").isNull(), F.lit("open"))
        .when(F.col("opened").isNull(), F.lit("partial"))
        .otherwise(F.lit("closed"))
        .alias("state"),
        "reason",
    )


def _volume() -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.sum("count").cast("long").alias("messages"),
        F.sum("payload_size").cast("long").alias("bytes"),
    ]


def _outcomes() -> list[Column]:
    from pyspark.sql import functions as F

    per_row = F.col("count").cast("long")
    return [
        F.sum(F.col("delivered") * per_row).alias("delivered"),
        F.sum(F.col("skipped") * per_row).alias("skipped"),
        F.sum("dropped").cast("long").alias("dropped"),
    ]


def _collect(frame: DataFrame) -> pa.Table:
    table: pa.Table = frame.toArrow()
    return _utc(table)


def _utc(table: pa.Table) -> pa.Table:
    """Timestamps as the journal stores them (``timestamp[us, tz=UTC]``), whatever zone
    label Spark's Arrow conversion gave them."""
    fields = [
        f.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def _sorted(table: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    return table.sort_by(keys)  # nulls last


def _ranked(talkers: pa.Table) -> pa.Table:
    """Senders by messages (then bytes, then name), with their rank by messages and by
    bytes."""
    by_messages = _sorted(
        talkers, [("messages", "descending"), ("bytes", "descending"), ("sender", "ascending")]
    )
    by_bytes = _sorted(
        talkers, [("bytes", "descending"), ("messages", "descending"), ("sender", "ascending")]
    )
    bytes_rank = {s: i + 1 for i, s in enumerate(by_bytes.column("sender").to_pylist())}
    ranks = [bytes_rank[s] for s in by_messages.column("sender").to_pylist()]
    return by_messages.append_column(
        "rank_messages", pa.array(range(1, by_messages.num_rows + 1), pa.int32())
    ).append_column("rank_bytes", pa.array(ranks, pa.int32()))


def summarize(
    tables: dict[str, pa.Table],
    since: dt.datetime | None,
    until: dt.datetime | None,
    skipped_files: int,
) -> pa.Table:
    """The one-row ``summary`` table, from the collected tables (no further Spark job)."""
    kinds = tables["kinds"].to_pylist()
    traffic = [k for k in kinds if k["kind"] in TRAFFIC_KINDS]
    sessions = tables["sessions"]
    states = sessions.column("state").to_pylist()
    firsts = [k["first"] for k in traffic if k["first"] is not None]
    lasts = [k["last"] for k in traffic if k["last"] is not None]
    row: dict[str, Any] = {
        "messages": sum(k["messages"] for k in traffic),
        "bytes": sum(k["bytes"] or 0 for k in traffic),
        "delivered": sum(k["delivered"] or 0 for k in traffic),
        "skipped": sum(k["skipped"] or 0 for k in kinds),
        "dropped": sum(k["dropped"] or 0 for k in kinds),
        "presence_events": sum(k["messages"] for k in kinds if k["kind"] not in TRAFFIC_KINDS),
        "topics": tables["topics"].num_rows,
        "senders": tables["top_talkers"].num_rows,
        "first": min(firsts) if firsts else None,
        "last": max(lasts) if lasts else None,
        "sessions": sessions.num_rows,
        "open_sessions": states.count("open"),
        "auth_failures": sum(tables["auth_failures_by_identity"].column("failures").to_pylist()),
        "since": since,
        "until": until,
        "skipped_files": skipped_files,
    }
    schema = pa.schema(
        [
            (name, pa.timestamp("us", tz="UTC"))
            if name in ("first", "last", "since", "until")
            else (name, pa.int64())
            for name in row
        ]
    )
    return pa.Table.from_pylist([row], schema=schema)
