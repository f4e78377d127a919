"""The report's map side: what each Spark task computes from its slice of the journal.

Spark SQL reads the journal fine, but on a small machine most of a report's time went into
Spark itself: every aggregation is a query to plan, generate code for and JIT-compile in a
cold JVM, plus a shuffle, and the ``recipients`` map goes through a row-at-a-time reader.
Here each task instead reads its segments with pyarrow (columnar, C++) and reduces them to
*partial aggregates* at the few grains the report's tables roll up from; the driver merges
the tasks' partials (:func:`merge`) and derives the tables. Spark distributes the slices
and runs the tasks, on one machine's cores or a cluster's executors alike; a task needs only
pyarrow, which PySpark's Arrow support needs anyway. This module is shipped to the executors
*by value* (see :func:`ship_by_value`), so they need no msgbroker either: it imports nothing
but the standard library and pyarrow, on purpose.

A task's result is a list of ``(name, payload)`` pairs: ``("table", (grain, ipc_bytes))``
for a partial table, ``("skipped", (path, reason))`` for a segment whose data pages could not
be read (its footer was checked on the driver already: this is the rarer damage past it).

The grains (keys → values; sums unless said otherwise)::

    by_sender    kind, minute, protocol, sender, node → messages, received, bytes, delivered,
                 skipped, dropped
    span         kind, node → first (min ts), last (max ts)
    by_topic     kind, topic, fanout → messages, bytes, routed, delivered, skipped, dropped
    recipients   kind, protocol (a recipient's) → deliveries
    topic_minute minute, topic → messages, bytes             [mcast, listed topics only]
    failures     node, identity, host → failures, last (max ts)              [auth failures]
    sessions     node, session_id → opened (min), closed (max), protocol, identity, host,
                 reason

A journal row stands for ``count`` messages (null in ``messages/1`` segments: 1): messages
are ``sum(count)``, bytes ``sum(payload_size)`` (a run's total), deliveries and skips
``sum(delivered * count)`` (per message in the row), drops ``sum(dropped)`` (a run's total).

Several nodes (a cluster): every row names its ``node`` (null before node names: ``""``), and
a row of a message another node published names its ``origin_node``. A message counts once,
where it was published: ``messages`` and ``bytes`` are those of the rows without an origin;
``received`` counts the others (messages a node routed for another), ``routed`` both (a
node's fan-out); deliveries, skips and drops count on every row (each node records its own).
A segment is one node's, so ``node`` as a key adds no groups (but for the senders whose
messages other nodes received): the per-node tables roll up from these grains on the
driver, at no cost to a task but a dictionary-coded key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

MESSAGES = "messages"
SESSIONS = "sessions"
TIMESTAMP = pa.timestamp("us", tz="UTC")

MICROS_PER_MINUTE = 60_000_000

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
#: columns a segment written before node names lacks, read as dictionaries: ``node`` as
#: ``""`` (no node recorded), ``origin_node`` as null (published on the row's node)
NODE_COLUMNS = {MESSAGES: ("node", "origin_node"), SESSIONS: ("node",)}
DICTIONARY = pa.dictionary(pa.int32(), pa.string())
SESSION_COLUMNS = {
    "ts": TIMESTAMP,
    "event": pa.string(),
    "protocol": pa.string(),
    "session_id": pa.int64(),
    "identity": pa.string(),
    "host": pa.string(),
    "reason": pa.string(),
}

#: what the first job returns (the second one: ``topic_minute``)
MAIN_GRAINS = ("by_sender", "span", "by_topic", "recipients", "failures", "sessions")

#: grain → (keys, {value: how partials merge})
GRAINS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "by_sender": (
        ("kind", "minute", "protocol", "sender", "node"),
        dict.fromkeys(("messages", "received", "bytes", "delivered", "skipped", "dropped"), "sum"),
    ),
    "span": (("kind", "node"), {"first": "min", "last": "max"}),
    "by_topic": (
        ("kind", "topic", "fanout"),
        dict.fromkeys(("messages", "bytes", "routed", "delivered", "skipped", "dropped"), "sum"),
    ),
    "recipients": (("kind", "protocol"), {"deliveries": "sum"}),
    "topic_minute": (("minute", "topic"), {"messages": "sum", "bytes": "sum"}),
    "failures": (("node", "identity", "host"), {"failures": "sum", "last": "max"}),
    "sessions": (
        ("node", "session_id"),
        {
            "opened": "min",
            "closed": "max",
            "protocol": "min",
            "identity": "max",
            "host": "min",
            "reason": "max",
        },
    ),
}


def ship_by_value() -> None:
    """Have PySpark pickle this module's functions with their code, not as an import the
    executors would have to resolve (they may have PySpark and pyarrow but no msgbroker)."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


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
        return _plain(tables[0])
    return _group(pa.concat_tables(tables).unify_dictionaries(), grain)


def empty(grain: str) -> pa.Table:
    """``grain`` with no rows (no task had any), with the columns and types of one that has."""
    if grain in ("failures", "sessions"):
        data = pa.table({n: pa.array([], t) for n, t in SESSION_COLUMNS.items()})
        data = _with_nodes(data, NODE_COLUMNS[SESSIONS])
        return _sessions(data)[grain]
    data = pa.table({n: pa.array([], t) for n, t in MESSAGE_COLUMNS.items()})
    data = _with_nodes(data, NODE_COLUMNS[MESSAGES])
    grains = _topic_minutes(data, []) if grain == "topic_minute" else _messages(data)
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
    return _with_nodes(pa.table(columns, names=list(wanted)), nodes_wanted)


def _with_nodes(data: pa.Table, names: Sequence[str]) -> pa.Table:
    """``data`` with the node columns ``names`` as every segment gets them: ``node``
    (``""`` where not recorded: in a segment from before node names) and ``origin_node``
    (null where missing: published on the row's node), dictionary-encoded."""
    for name in names:
        if name in data.column_names:
            column = data.column(name)
            if name == "node" and column.null_count:
                index = data.column_names.index(name)
                data = data.set_column(index, name, pc.fill_null(column, ""))
            continue
        if name == "node":
            zeros = pa.array(np.zeros(data.num_rows, np.int32))
            missing = pa.DictionaryArray.from_arrays(zeros, pa.array([""], pa.string()))
        else:
            missing = pa.nulls(data.num_rows, DICTIONARY)
        data = data.append_column(name, missing)
    return data


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
        grains = _topic_minutes(data, topics) if topics is not None else _messages(data)
    else:
        grains = {} if topics is not None else _sessions(data)
    for grain, partial in grains.items():
        partials.setdefault(grain, []).append(partial)


def _one_node(data: pa.Table) -> str | None:
    """The node of every row when there is one (the usual case: a step's segments are
    one node's, or several that happen to be the same one), else None."""
    node = data.column("node")
    if node.num_chunks == 0 or node.null_count:
        return None
    first = node.chunk(0).dictionary
    if len(first) != 1 or any(
        len(c) and not c.dictionary.equals(first) for c in node.chunks
    ):  # unified dictionaries: one entry is one node
        return None
    name: str = first[0].as_py()
    return name


def _messages(data: pa.Table) -> dict[str, pa.Table]:
    # every kind is grouped, presence too, and the driver keeps the kinds each table wants:
    # dropping a few groups there is cheaper than filtering every row here
    data = _with_nodes(data, NODE_COLUMNS[MESSAGES])  # segments reduced one by one
    count = pc.fill_null(data.column("count"), 1)
    kind = data.column("kind")
    ts = data.column("ts")
    size = data.column("payload_size")
    outcomes = {
        "delivered": pc.multiply(data.column("delivered"), count),
        "skipped": pc.multiply(data.column("skipped"), count),
        "dropped": data.column("dropped"),
    }
    by_sender: dict[str, Any] = {
        "kind": kind,
        "minute": _minute(ts),
        "protocol": data.column("protocol"),
        "sender": data.column("sender"),
        **outcomes,
    }
    by_topic: dict[str, Any] = {
        "kind": kind,
        "topic": data.column("topic"),
        "fanout": data.column("delivered"),
        **outcomes,
    }
    span: dict[str, Any] = {"kind": kind, "first": ts, "last": ts}
    # the usual case, one node's rows that all were published on it, costs no more than a
    # journal without nodes: the node, the nothing received and the routed (= published)
    # are put in after grouping, on the groups
    node = _one_node(data)
    origin = data.column("origin_node")
    after: dict[str, Any] = {}
    if node is not None:
        after["node"] = node
    else:
        by_sender["node"] = span["node"] = data.column("node")
    if origin.null_count == len(origin):
        by_sender |= {"messages": count, "bytes": size}
        by_topic |= {"messages": count, "bytes": size}
        after |= {"received": 0, "routed": "messages"}
    else:  # each message counts once, where it was published: elsewhere it is received
        here = pc.is_null(origin)
        published, published_bytes = pc.if_else(here, count, 0), pc.if_else(here, size, 0)
        by_sender |= {"messages": published, "bytes": published_bytes}
        by_sender["received"] = pc.if_else(here, 0, count)
        by_topic |= {"messages": published, "bytes": published_bytes, "routed": count}

    # deliveries by the recipients' protocols: each map entry, weighed by its row's count;
    # chunk by chunk, as each file's keys have their own dictionary
    by_recipient: list[pa.Table] = []
    row = 0
    for recipients in data.column("recipients").chunks:
        # .keys and .items are the whole child arrays; a slice's offsets point into them
        offsets = recipients.offsets.to_numpy()
        start, used = int(offsets[0]), int(offsets[-1] - offsets[0])
        owners = row + np.repeat(np.arange(len(recipients)), np.diff(offsets))
        row += len(recipients)
        deliveries = recipients.items.slice(start, used).cast(pa.int64())
        by_recipient.append(
            pa.table(
                {
                    "kind": pc.take(kind, owners),
                    "protocol": recipients.keys.slice(start, used),
                    "deliveries": pc.multiply(deliveries, pc.take(count, owners)),
                }
            )
        )
    return {
        "by_sender": _group(pa.table(by_sender), "by_sender", after),
        "span": _group(pa.table(span), "span", after),
        "by_topic": _group(pa.table(by_topic), "by_topic", after),
        "recipients": _group(_concat(by_recipient), "recipients"),
    }


def _topic_minutes(data: pa.Table, topics: Sequence[str]) -> dict[str, pa.Table]:
    data = _with_nodes(data, ("origin_node",))
    keep = pc.and_(
        pc.equal(data.column("kind"), "mcast"),
        pc.is_in(data.column("topic"), pa.array(topics, pa.string())),
    )
    origin = data.column("origin_node")
    if origin.null_count != len(origin):  # counted where published, once
        keep = pc.and_(keep, pc.is_null(origin))
    rows = data.filter(keep)
    frame = pa.table(
        {
            "minute": _minute(rows.column("ts")),
            "topic": rows.column("topic"),
            "messages": pc.fill_null(rows.column("count"), 1),
            "bytes": rows.column("payload_size"),
        }
    )
    return {"topic_minute": _group(frame, "topic_minute")}


def _sessions(data: pa.Table) -> dict[str, pa.Table]:
    data = _with_nodes(data, NODE_COLUMNS[SESSIONS])
    event = data.column("event")
    failed = data.filter(pc.equal(event, "auth_failure"))
    out = {
        "failures": _group(
            pa.table(
                {
                    "node": failed.column("node"),
                    "identity": failed.column("identity"),
                    "host": failed.column("host"),
                    "failures": pa.array([1] * failed.num_rows, pa.int64()),
                    "last": failed.column("ts"),
                }
            ),
            "failures",
        )
    }
    known = data.filter(pc.is_valid(data.column("session_id")))
    event = known.column("event")
    ts = known.column("ts")

    def when(condition: pa.Array, values: pa.ChunkedArray) -> pa.Array:
        return pc.if_else(condition, values, pa.nulls(len(values), values.type))

    is_close = pc.equal(event, "close")
    out["sessions"] = _group(
        pa.table(
            {
                "node": known.column("node"),
                "session_id": known.column("session_id"),
                "opened": when(pc.equal(event, "open"), ts),
                "closed": when(is_close, ts),
                "protocol": known.column("protocol"),
                # who logged in: the login's identity, or the close's (it repeats it)
                "identity": when(
                    pc.is_in(event, pa.array(["login", "close"])), known.column("identity")
                ),
                "host": known.column("host"),
                "reason": when(is_close, known.column("reason")),
            }
        ),
        "sessions",
    )
    return out


def _group(frame: pa.Table, grain: str, after: Mapping[str, Any] | None = None) -> pa.Table:
    """``frame`` grouped at ``grain``, its keys as plain strings (partials from other steps
    and tasks have other dictionaries). ``after``: keys and values of the grain that
    ``frame`` lacks because they are the same on every row, put in on the groups: a
    string or number for all, or the name of the value they equal."""
    keys, values = GRAINS[grain]
    for index, field in enumerate(frame.schema):
        if pa.types.is_dictionary(field.type) and values.get(field.name) in ("min", "max"):
            # min and max have no kernel for dictionaries (partials come back encoded)
            plain = frame.column(index).cast(field.type.value_type)
            frame = frame.set_column(index, field.name, plain)
    missing = {name: v for name, v in (after or {}).items() if name not in frame.column_names}
    present = [k for k in keys if k not in missing]
    aggregations = [(v, how) for v, how in values.items() if v not in missing]
    grouped = frame.group_by(present, use_threads=False).aggregate(aggregations)
    grouped = grouped.rename_columns({f"{v}_{how}": v for v, how in aggregations})
    for name, value in missing.items():
        if name not in (*keys, *values):
            continue
        if isinstance(value, str) and value in grouped.column_names:
            column = grouped.column(value)
        else:
            kind = pa.string() if isinstance(value, str) else pa.int64()
            column = pa.repeat(pa.scalar(value, kind), grouped.num_rows)
        grouped = grouped.append_column(name, column)
    return _plain(grouped.select([*keys, *values]))


def _concat(tables: list[pa.Table]) -> pa.Table:
    """The per-chunk recipient tables as one (no chunks: no rows, the same columns)."""
    if not tables:
        return pa.table(
            {
                "kind": pa.array([], pa.string()),
                "protocol": pa.array([], pa.string()),
                "deliveries": pa.array([], pa.int64()),
            }
        )
    return pa.concat_tables(tables).unify_dictionaries()


def _plain(table: pa.Table) -> pa.Table:
    for index, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            plain = table.column(index).cast(field.type.value_type)
            table = table.set_column(index, field.name, plain)
    return table


def _minute(ts: pa.ChunkedArray) -> pa.ChunkedArray:
    """``ts`` down to its minute. Integer arithmetic: ``floor_temporal`` looks the time zone
    up row by row, ten times slower, and a UTC minute needs no zone (``divide`` truncates
    towards zero: right for every instant after 1970, which journal timestamps are)."""
    micros = ts.cast(pa.int64())
    return pc.multiply(pc.divide(micros, MICROS_PER_MINUTE), MICROS_PER_MINUTE).cast(TIMESTAMP)


def one_line(error: BaseException) -> str:
    """The error as one printable line (a decoder's message may quote the bad bytes)."""
    text = " ".join("".join(c if c.isprintable() else "?" for c in str(error)).split())
    return text if len(text) <= 160 else text[:157] + "..."
