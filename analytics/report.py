"""The analytics report: the journal's traffic, fan-out, drops, talkers and sessions.

:func:`run_report` checks the journal's segments (:mod:`.journal_files`), cuts them into
slices and has Spark run one task per slice (:mod:`.partials`): each reads its segments with
pyarrow and reduces them to partial aggregates, which come back to the driver, are merged,
and rolled up into the report's tables (small: one row per topic, sender, minute...). A
second, lighter job gives the top topics' per-minute series (which topics are on top is
known only then). The driver writes everything: ``REPORT_DIR/tables/<name>/part-00000.parquet``
and ``REPORT_DIR/index.html`` with PNG charts, so the report lands on the machine that asked
for it, with or without a filesystem shared with a cluster; only the journal directory has
to be readable by the executors.

Why not Spark SQL over the Parquet files, which the first version did: on this project's
2-core reference machine a 5-million-row report took 50 s, 35 s of them in Spark's
per-query planning, code generation and JIT warm-up, shuffles, and row-at-a-time reading of
the ``recipients`` map; the same work as columnar pyarrow in the tasks takes a few seconds
(docs/analytics.md has the figures).

A journal row stands for ``count`` messages (a pipelined run the broker routed at once;
``messages/1`` segments have no ``count``: 1 each): messages are ``sum(count)``, bytes
``sum(payload_size)`` (a run's total), deliveries and skips ``sum(delivered * count)``
(per message in the row), drops ``sum(dropped)`` (a run's total), and the fan-out
histogram weighs each row's ``delivered`` by its ``count``.

Which rows count as traffic: ``mcast``, ``ucast`` and ``bcast``. ``subscribe`` and
``unsubscribe`` rows (presence) appear in the ``kinds`` table and in the drop totals, not in
the traffic tables. "Topics" are mcast topics (a ucast's ``topic`` is its target identity).

Several nodes' journals (a cluster; :mod:`.nodes`) make one report: a message counts once,
on the node it was published on (rows without ``origin_node``), its deliveries on every
node; ``nodes`` and ``traffic_by_node_minute`` have each node's share.
"""

from __future__ import annotations

import datetime as dt
import functools
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import charts, html, partials
from .grains import MAIN_GRAINS, MESSAGES, SESSIONS
from .journal_files import SkippedFile, list_table
from .nodes import NODE_TABLES, journal_directories, node_tables

__all__ = ["TABLES", "Report", "SkippedFile", "parse_time", "run_report"]

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

TRAFFIC_KINDS = ("mcast", "ucast", "bcast")
#: how many topics get their own per-minute series (``topics_by_minute``)
TOP_TOPICS_SERIES = 10

#: every table the report writes, in the order index.html shows them
TABLES = (
    "summary",
    *NODE_TABLES,
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
    spark: SparkSession | SparkContext,
    journal_dir: Path | Sequence[Path],
    out_dir: Path,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    on_skip: Callable[[SkippedFile], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Report:
    """Compute the report of ``journal_dir`` rows in ``[since, until)`` into ``out_dir``.

    ``journal_dir`` is a journal directory, or several (the nodes of a cluster), each a
    journal or a directory of journals (:func:`.nodes.journal_directories`).

    ``spark`` is a SparkSession or just a SparkContext (all the report uses: the command
    starts only that, two seconds quicker than a session).

    Files that are not journal segments, or whose data turn out damaged, are passed to
    ``on_skip`` (as found), listed in the report, and otherwise ignored. ``on_stage`` is
    told what the report starts doing, in a few words ("reading the journal in ...",
    "computing ...", "writing ..."), for a person waiting for it.
    """
    stage = on_stage or (lambda text: None)
    journals, out_dir = journal_directories(journal_dir), Path(out_dir)
    where = ", ".join(map(str, journals))
    stage(f"reading the journal{'s' if len(journals) > 1 else ''} in {where}")
    segments: dict[str, list[Path]] = {MESSAGES: [], SESSIONS: []}
    skipped: list[SkippedFile] = []
    for table in (MESSAGES, SESSIONS):
        for journal in journals:
            listed = list_table(journal, table, since, until)
            segments[table] += listed.segments
            skipped += listed.skipped
    if on_skip is not None:
        for item in skipped:
            on_skip(item)
    from pyspark.sql import SparkSession

    context = spark.sparkContext if isinstance(spark, SparkSession) else spark
    jobs = _Jobs(context, since, until, on_skip, skipped)
    messages, sessions = segments[MESSAGES], segments[SESSIONS]
    stage(
        f"computing traffic, topics, talkers and sessions from {len(messages)} message and "
        f"{len(sessions)} session segments"
    )
    tables = aggregate(jobs, messages, sessions)
    # the charts need nothing from the second job: draw them meanwhile (the driver only
    # waits on Spark there), and write the tables once that job is back
    with ThreadPoolExecutor(1, thread_name_prefix="charts") as drawing:
        stage("computing the busiest topics minute by minute, drawing the charts")
        charts_done = drawing.submit(charts.render_all, dict(tables), out_dir / "charts")
        tables["topics_by_minute"] = top_topics_by_minute(jobs, messages, tables["topics"])
        tables["summary"] = summarize(tables, since, until, len(skipped))
        tables_dir = out_dir / "tables"
        stage(f"writing the tables in {tables_dir}")
        for name in TABLES:
            target = tables_dir / name
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            pq.write_table(tables[name], target / "part-00000.parquet")
        chart_paths = charts_done.result()
    stage(f"writing {out_dir / 'index.html'}")
    index = html.write_index(out_dir, journals, tables, chart_paths, tuple(skipped))
    return Report(out_dir, index, tables, tuple(chart_paths), tuple(skipped))


@attrs.define
class _Jobs:
    """Runs :mod:`.partials` tasks on Spark and merges what they return."""

    context: SparkContext
    since: dt.datetime | None
    until: dt.datetime | None
    on_skip: Callable[[SkippedFile], None] | None
    skipped: list[SkippedFile]

    def run(
        self, items: Sequence[tuple[str, Path]], topics: Sequence[str] | None = None
    ) -> dict[str, pa.Table]:
        """The merged partials of ``items`` (table, path); every grain present, maybe empty."""
        partials.ship_by_value()
        context = self.context
        # a segment found damaged by an earlier job is not read (nor reported) again
        known = {s.path for s in self.skipped}
        sized = [(t, str(p), p.stat().st_size) for t, p in items if p not in known]
        cut = partials.slices(sized, context.defaultParallelism)
        results = []
        if cut:
            job = functools.partial(
                partials.run_slices, since=self.since, until=self.until, topics=topics
            )
            results = context.parallelize(cut, len(cut)).mapPartitions(job).collect()
        found: dict[str, list[pa.Table]] = {}
        for what, value in results:
            if what == "skipped":
                item = SkippedFile(Path(value[0]), value[1])
                self.skipped.append(item)
                if self.on_skip is not None:
                    self.on_skip(item)
            else:
                found.setdefault(value[0], []).append(partials.from_ipc(value[1]))
        grains = ("topic_minute",) if topics is not None else MAIN_GRAINS
        return {g: partials.merge(g, found[g]) if g in found else partials.empty(g) for g in grains}


def aggregate(
    jobs: _Jobs, messages: Sequence[Path], sessions: Sequence[Path]
) -> dict[str, pa.Table]:
    """Every table but ``summary`` and ``topics_by_minute``: the partials of one job over
    all segments, rolled up."""
    grains = jobs.run([(MESSAGES, p) for p in messages] + [(SESSIONS, p) for p in sessions])
    tables: dict[str, pa.Table] = {}

    by_sender = grains["by_sender"]
    span = (
        grains["span"]
        .group_by(["kind"], use_threads=False)
        .aggregate([("first", "min"), ("last", "max")])
    )
    span = span.rename_columns({"first_min": "first", "last_max": "last"})
    kinds = _rollup(by_sender, ["kind"], VOLUME + OUTCOMES).join(span, "kind")
    tables["kinds"] = _sorted(kinds, [("messages", "descending"), ("kind", "ascending")])
    traffic = _traffic(by_sender)
    tables["protocols"] = _sorted(
        _rollup(traffic, ["protocol"], VOLUME + OUTCOMES),
        [("messages", "descending"), ("protocol", "ascending")],
    )
    # a sender's messages count where published: in a report without that node's journal,
    # its messages delivered here add no messages (only deliveries, in the tables that
    # have them), and a minute or a sender with none is no row of these
    published = traffic.filter(pc.greater(traffic.column("messages"), 0))
    tables["traffic_by_minute"] = _sorted(
        _rollup(published, ["minute", "protocol"], VOLUME),
        [("minute", "ascending"), ("protocol", "ascending")],
    )
    tables["senders_by_minute"] = _sorted(
        _rollup(published, ["minute", "sender"], VOLUME),
        [("minute", "ascending"), ("sender", "ascending")],
    )
    tables["top_talkers"] = _ranked(
        _rollup(published, ["sender"], VOLUME, [("protocol", "count_distinct")]).rename_columns(
            {"protocol": "protocols"}
        )
    )

    by_topic = _traffic(grains["by_topic"])
    mcast = by_topic.filter(pc.equal(by_topic.column("kind"), "mcast"))
    topics = _sorted(
        _rollup(mcast, ["topic"], VOLUME + OUTCOMES),
        [("messages", "descending"), ("bytes", "descending"), ("topic", "ascending")],
    )
    tables["topics"] = topics
    # per node that routed a message: one node cannot see another's deliveries of it
    tables["fanout"] = _sorted(
        _rollup(by_topic, ["fanout"], ["routed"]).rename_columns(
            {"fanout": "delivered", "routed": "messages"}
        ),
        [("delivered", "ascending")],
    )
    tables["drops_by_topic"] = _sorted(
        topics.filter(
            pc.greater(pc.add(topics.column("dropped"), topics.column("skipped")), 0)
        ).select(["topic", "dropped", "skipped", "messages"]),
        [("dropped", "descending"), ("skipped", "descending"), ("topic", "ascending")],
    )
    tables["recipient_protocols"] = _sorted(
        _rollup(_traffic(grains["recipients"]), ["protocol"], ["deliveries"]),
        [("deliveries", "descending"), ("protocol", "ascending")],
    )

    failures = grains["failures"]
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
        _session_table(grains["sessions"]),
        [("opened", "ascending"), ("session_id", "ascending"), ("node", "ascending")],
    )
    tables.update(node_tables(by_sender, grains["span"], tables["sessions"], failures))
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


def top_topics_by_minute(jobs: _Jobs, messages: Sequence[Path], topics: pa.Table) -> pa.Table:
    """The per-minute series of the :data:`TOP_TOPICS_SERIES` first ``topics``: a second
    job, over the messages only, reading five columns."""
    top = topics.column("topic").to_pylist()[:TOP_TOPICS_SERIES]
    if not top:
        return partials.empty("topic_minute")
    series = jobs.run([(MESSAGES, p) for p in messages], topics=top)["topic_minute"]
    return _sorted(series, [("minute", "ascending"), ("topic", "ascending")])


def _traffic(table: pa.Table) -> pa.Table:
    return table.filter(pc.is_in(table.column("kind"), pa.array(TRAFFIC_KINDS)))


def _session_table(sessions: pa.Table) -> pa.Table:
    """One row per session (``node`` and ``session_id``): open → close, duration, and
    ``state``: ``closed``, ``open`` (no close yet: still connected, or the broker died), or
    ``partial`` (its open is before the journal or the ``--since`` window)."""
    opened, closed = sessions.column("opened"), sessions.column("closed")
    micros = pc.subtract(closed.cast(pa.int64()), opened.cast(pa.int64()))
    state = pc.if_else(
        pc.is_null(closed),
        "open",
        pc.if_else(pc.is_null(opened), "partial", "closed"),
    )
    return pa.table(
        {
            "session_id": sessions.column("session_id"),
            "node": sessions.column("node"),
            "protocol": sessions.column("protocol"),
            "identity": sessions.column("identity"),
            "host": sessions.column("host"),
            "opened": opened,
            "closed": closed,
            "duration_s": pc.divide(micros.cast(pa.float64()), 1e6),
            "state": state.cast(pa.string()),
            "reason": sessions.column("reason"),
        }
    )


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
        "received": sum(tables["nodes"].column("received").to_pylist()),
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
        "nodes": tables["nodes"].num_rows,
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
