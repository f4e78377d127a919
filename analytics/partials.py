"""The report's map side: what each Spark task computes from its slice of the journal.

Spark SQL reads the journal fine, but on a small machine most of a report's time went into
Spark itself: every aggregation is a query to plan, generate code for and JIT-compile in a
cold JVM, plus a shuffle, and the ``recipients`` map goes through a row-at-a-time reader.
Here each task instead reads its segments with pyarrow (columnar, C++) and reduces them to
*partial aggregates* at the few grains the report's tables roll up from; the driver merges
the tasks' partials (:func:`merge`) and derives the tables. Spark distributes the slices
and runs the tasks, on one machine's cores or a cluster's executors alike; a task needs only
pyarrow, which PySpark's Arrow support needs anyway. This module and :mod:`.grains` (the
aggregations) are shipped to the executors *by value* (see :func:`ship_by_value`), so they
need no msgbroker either: they import nothing but the standard library, pyarrow and each
other, on purpose.

A task's result is a list of ``(name, payload)`` pairs: ``("table", (grain, ipc_bytes))``
for a partial table, ``("skipped", (path, reason))`` for a segment whose data pages could not
be read (its footer was checked on the driver already: this is the rarer damage past it).

The grains a task reduces its rows to, and how partials of a grain merge, are
:mod:`.grains`'.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .grains import (
    DICTIONARY,
    MESSAGES,
    NODE_COLUMNS,
    SESSIONS,
    TIMESTAMP,
    group_at,
    message_grains,
    session_grains,
    topic_minute_grain,
    with_nodes,
    without_dictionaries,
)

#: rows a task gathers before reducing them: bounds a task's memory whatever its slice's size
ROWS_PER_STEP = 2_000_000

#: the columns each table's grains read, as the journal's types (a narrower integer or a
#: millisecond timestamp is cast; a missing optional ``count`` reads as null)
MESSAGE_COLUMNS = {
    "ts": TIMESTAMP,
    "protocol": pa.string(),
    "sender": pa.string(),
    "kind": pa.string(),
    "topic": pa.string(),
    "count": pa.int64(),
    "payload_size": pa.int64(),
    "recipients": pa.map_(pa.string(), pa.int64()),
    "delivered": pa.int64(),
    "skipped": pa.int64(),
    "dropped": pa.int64(),
}
TOPIC_MINUTE_COLUMNS = ("ts", "kind", "topic", "count", "payload_size")
#: read as dictionaries: few distinct values, repeated on every row
DICTIONARY_COLUMNS = ("protocol", "sender", "kind", "topic", "node", "origin_node")
SESSION_COLUMNS = {
    "ts": TIMESTAMP,
    "event": pa.string(),
    "protocol": pa.string(),
    "session_id": pa.int64(),
    "identity": pa.string(),
    "host": pa.string(),
    "reason": pa.string(),
}


def ship_by_value() -> None:
    """Have PySpark pickle this module's functions and :mod:`.grains`' with their code, not
    as an import the executors would have to resolve (they may have PySpark and pyarrow but
    no msgbroker)."""
    import sys

    from pyspark import cloudpickle

    for name in (__name__, message_grains.__module__):
        cloudpickle.register_pickle_by_value(sys.modules[name])


def slices(items: Sequence[tuple[str, str, int]], n: int) -> list[list[tuple[str, str]]]:
    """``items`` (table, path, size in bytes), in journal order, cut into ``n`` contiguous
    slices of about equal size (fewer if there are fewer items). Contiguous, because
    segments follow each other in time: a slice then holds a stretch of minutes, and the
    tasks' per-minute partials barely overlap (the driver merges little more than it
    keeps)."""
    if not items:
        return []
    n = max(1, min(n, len(items)))
    total = sum(size for _, _, size in items) or 1
    out: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    seen, index = 0, 0
    for position, (table, path, size) in enumerate(items):
        # the slice this item's middle falls in, kept contiguous (never skip a slice) and
        # leaving at least one item for every slice still empty
        ideal = min(n - 1, int((seen + size / 2) * n / total))
        fewest = n - (len(items) - position)
        if position:
            index = max(fewest, index, min(ideal, index + 1))
        out[index].append((table, path))
        seen += size
    return out


def run_slices(
    slices: Iterable[list[tuple[str, str]]],
    since: dt.datetime | None,
    until: dt.datetime | None,
    topics: Sequence[str] | None = None,
) -> Iterator[tuple[str, Any]]:
    """A Spark partition's function (``mapPartitions``): its slices, as one :func:`task`."""
    return task((item for s in slices for item in s), since, until, topics)


def task(
    items: Iterable[tuple[str, str]],
    since: dt.datetime | None,
    until: dt.datetime | None,
    topics: Sequence[str] | None = None,
) -> Iterator[tuple[str, Any]]:
    """One Spark task: read ``items`` (table, path) and yield its partials (see the module
    docstring). With ``topics``, only the ``topic_minute`` grain of those topics."""
    gathered: dict[str, list[pa.Table]] = {MESSAGES: [], SESSIONS: []}
    rows = {MESSAGES: 0, SESSIONS: 0}
    partials: dict[str, list[pa.Table]] = {}
    for table, path in items:
        try:
            data = _read(path, table, topics is not None)
        except (OSError, pa.ArrowException) as e:
            yield ("skipped", (path, f"damaged data ({one_line(e)})"))
            continue
        data = _window(data, since, until)
        gathered[table].append(data)
        rows[table] += data.num_rows
        if rows[table] >= ROWS_PER_STEP:
            _reduce(table, gathered[table], topics, partials)
            gathered[table], rows[table] = [], 0
    for table in (MESSAGES, SESSIONS):
        if gathered[table]:
            _reduce(table, gathered[table], topics, partials)
    for grain, tables in partials.items():
        yield ("table", (grain, _to_ipc(merge(grain, tables))))


def merge(grain: str, tables: Sequence[pa.Table]) -> pa.Table:
    """Partials of ``grain`` (from steps or tasks) as one: grouped by its keys again."""
    if len(tables) == 1:
        return without_dictionaries(tables[0])
    return group_at(pa.concat_tables(tables).unify_dictionaries(), grain)


def empty(grain: str) -> pa.Table:
    """``grain`` with no rows (no task had any), with the columns and types of one that has."""
    if grain in ("failures", "sessions"):
        data = pa.table({n: pa.array([], t) for n, t in SESSION_COLUMNS.items()})
        data = with_nodes(data, NODE_COLUMNS[SESSIONS])
        return session_grains(data)[grain]
    data = pa.table({n: pa.array([], t) for n, t in MESSAGE_COLUMNS.items()})
    data = with_nodes(data, NODE_COLUMNS[MESSAGES])
    grains = topic_minute_grain(data, []) if grain == "topic_minute" else message_grains(data)
    return grains[grain]


def from_ipc(payload: bytes) -> pa.Table:
    with pa.ipc.open_stream(payload) as reader:
        return reader.read_all()


def _to_ipc(table: pa.Table) -> bytes:
    """``table`` as an Arrow stream, strings dictionary-encoded and LZ4-compressed: the
    largest partial shrinks 20 MB → 4 MB for 0.04 s, and it crosses the JVM on its way to
    the driver."""
    encoded = pa.table(
        [pc.dictionary_encode(c) if pa.types.is_string(c.type) else c for c in table.columns],
        names=table.column_names,
    )
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, encoded.schema, options=options) as writer:
        writer.write_table(encoded)
    return bytes(sink.getvalue())


def _read(path: str, table: str, topic_minute: bool) -> pa.Table:
    """A segment's columns this task needs, as :data:`MESSAGE_COLUMNS` /
    :data:`SESSION_COLUMNS` types, but for the messages' strings, which stay
    dictionary-encoded as Parquet stores them (reading and grouping integer codes is three
    times faster), the ``recipients`` map's keys with them (its values are cast later)."""
    wanted = SESSION_COLUMNS if table == SESSIONS else MESSAGE_COLUMNS
    nodes_wanted = NODE_COLUMNS[table]
    if table == MESSAGES and topic_minute:
        wanted = {c: MESSAGE_COLUMNS[c] for c in TOPIC_MINUTE_COLUMNS}
        nodes_wanted = ("origin_node",)  # a topic's series counts messages where published
    layout = pq.read_metadata(path).schema
    present = set(layout.to_arrow_schema().names)
    nodes = tuple(c for c in nodes_wanted if c in present)
    wanted = {**wanted, **dict.fromkeys(nodes, DICTIONARY)}
    encoded = [c for c in DICTIONARY_COLUMNS if c in wanted]
    if table == SESSIONS:
        encoded = list(nodes)
    uncast = set(encoded)
    if "recipients" in wanted:
        uncast.add("recipients")
        # the key's column path names the map's entry group, which writers name differently
        encoded += [
            path
            for path in (layout.column(i).path for i in range(len(layout)))
            if path.startswith("recipients.") and path.endswith(".key")
        ]
    data = pq.read_table(path, columns=[c for c in wanted if c in present], read_dictionary=encoded)
    columns = []
    for name, kind in wanted.items():
        if name not in present:  # only "count" may be missing (messages/1): footer checked
            columns.append(pa.nulls(data.num_rows, kind))
            continue
        column = data.column(name)
        if not (column.type.equals(kind) or name in uncast):
            column = column.cast(kind)
        columns.append(column)
    return with_nodes(pa.table(columns, names=list(wanted)), nodes_wanted)


def _window(data: pa.Table, since: dt.datetime | None, until: dt.datetime | None) -> pa.Table:
    ts = data.column("ts")
    keep = None
    if since is not None:
        keep = pc.greater_equal(ts, pa.scalar(since, TIMESTAMP))
    if until is not None:
        before = pc.less(ts, pa.scalar(until, TIMESTAMP))
        keep = before if keep is None else pc.and_(keep, before)
    return data if keep is None else data.filter(keep)


def _reduce(
    table: str,
    gathered: list[pa.Table],
    topics: Sequence[str] | None,
    partials: dict[str, list[pa.Table]],
) -> None:
    try:
        data = pa.concat_tables(gathered).unify_dictionaries()
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # segments whose types differ after reading (another writer's layout): one by one
        if len(gathered) > 1:
            for one in gathered:
                _reduce(table, [one], topics, partials)
            return
        raise
    if table == MESSAGES:
        grains = topic_minute_grain(data, topics) if topics is not None else message_grains(data)
    else:
        grains = {} if topics is not None else session_grains(data)
    for grain, partial in grains.items():
        partials.setdefault(grain, []).append(partial)


def one_line(error: BaseException) -> str:
    """The error as one printable line (a decoder's message may quote the bad bytes)."""
    text = " ".join("".join(c if c.isprintable() else "?" for c in str(error)).split())
    return text if len(text) <= 160 else text[:157] + "..."
