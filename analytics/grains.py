"""The grains of the report's partial aggregates: what a table of journal rows reduces to,
grain by grain, in pyarrow (a task's step, :mod:`.partials`), and how partials of a grain
group again (the driver's merge). The report's tables roll up from these on the driver.

Split out of :mod:`.partials`, which reads segments and runs the tasks; this module holds
only the aggregations. Both are shipped to the executors *by value*
(:func:`.partials.ship_by_value`), so this one too imports nothing but the standard
library, numpy and pyarrow.

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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the journal's tables
MESSAGES = "messages"
SESSIONS = "sessions"
TIMESTAMP = pa.timestamp("us", tz="UTC")

MICROS_PER_MINUTE = 60_000_000

#: columns a segment written before node names lacks, read as dictionaries: ``node`` as
#: ``""`` (no node recorded), ``origin_node`` as null (published on the row's node)
NODE_COLUMNS = {MESSAGES: ("node", "origin_node"), SESSIONS: ("node",)}
DICTIONARY = pa.dictionary(pa.int32(), pa.string())

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


def with_nodes(data: pa.Table, names: Sequence[str]) -> pa.Table:
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


def message_grains(data: pa.Table) -> dict[str, pa.Table]:
    """The messages' grains of ``data`` (rows of the ``messages`` table): by_sender, span,
    by_topic, recipients."""
    # every kind is grouped, presence too, and the driver keeps the kinds each table wants:
    # dropping a few groups there is cheaper than filtering every row here
    data = with_nodes(data, NODE_COLUMNS[MESSAGES])  # segments reduced one by one
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
        "minute": minute_of(ts),
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
        "by_sender": group_at(pa.table(by_sender), "by_sender", after),
        "span": group_at(pa.table(span), "span", after),
        "by_topic": group_at(pa.table(by_topic), "by_topic", after),
        "recipients": group_at(_concat(by_recipient), "recipients"),
    }


def topic_minute_grain(data: pa.Table, topics: Sequence[str]) -> dict[str, pa.Table]:
    """The ``topic_minute`` grain of ``data`` (``messages`` rows): MCASTs on ``topics``."""
    data = with_nodes(data, ("origin_node",))
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
            "minute": minute_of(rows.column("ts")),
            "topic": rows.column("topic"),
            "messages": pc.fill_null(rows.column("count"), 1),
            "bytes": rows.column("payload_size"),
        }
    )
    return {"topic_minute": group_at(frame, "topic_minute")}


def session_grains(data: pa.Table) -> dict[str, pa.Table]:
    """The sessions' grains of ``data`` (rows of the ``sessions`` table): failures, sessions."""
    data = with_nodes(data, NODE_COLUMNS[SESSIONS])
    event = data.column("event")
    failed = data.filter(pc.equal(event, "auth_failure"))
    out = {
        "failures": group_at(
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
    out["sessions"] = group_at(
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


def group_at(frame: pa.Table, grain: str, after: Mapping[str, Any] | None = None) -> pa.Table:
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
    return without_dictionaries(grouped.select([*keys, *values]))


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


def without_dictionaries(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded columns as plain ones."""
    for index, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            plain = table.column(index).cast(field.type.value_type)
            table = table.set_column(index, field.name, plain)
    return table


def minute_of(ts: pa.ChunkedArray) -> pa.ChunkedArray:
    """``ts`` down to its minute. Integer arithmetic: ``floor_temporal`` looks the time zone
    up row by row, ten times slower, and a UTC minute needs no zone (``divide`` truncates
    towards zero: right for every instant after 1970, which journal timestamps are)."""
    micros = ts.cast(pa.int64())
    return pc.multiply(pc.divide(micros, MICROS_PER_MINUTE), MICROS_PER_MINUTE).cast(TIMESTAMP)
