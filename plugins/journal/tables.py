"""Pending journal records to Arrow tables, in the writer thread, losing no good record.

The records are what :class:`~.writer.JournalWriter` appends in the reactor thread: plain
tuples (a message: ``ts, protocol, sender, kind, topic, size, recipients, skipped,
dropped, payload, count, origin_node``; a session event: ``ts, event, protocol,
session_id, identity, host, scheme, reason``) and :class:`RunRecord`. :func:`build` turns a
batch into one table; the ``node`` column, the same on every row, is the writer's.

The batch is built in one go first (the usual case, a few C-level passes per column). If
that fails, one bad record must not cost the others: names that cannot be written as UTF-8
are stored escaped (:mod:`.names`, listed in the row's ``escaped`` column) and the batch
built again; if it still fails, the batch is halved until each record that cannot be built
on its own is found, and only those are set aside (:attr:`Built.set_aside`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from operator import itemgetter, methodcaller
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
from attrs import frozen

from . import names, schema

_values = methodcaller("values")

#: a row's ``escaped`` list (column names), or None: nothing escaped
Escaped = list[str] | None

#: the string columns a client can name, by their index in a record tuple
MESSAGE_NAMES = (
    (1, "protocol"), (2, "sender"), (3, "kind"), (4, "topic"), (11, "origin_node"),
)  # fmt: skip
SESSION_NAMES = (
    (1, "event"), (2, "protocol"), (4, "identity"), (5, "host"), (6, "scheme"), (7, "reason"),
)  # fmt: skip
RUN_NAMES = ("protocol", "sender", "kind", "topic", "origin_node")


@frozen(slots=True)
class RunRecord:
    """``count`` messages routed at once (``msgbroker_run_routed``), kept as one record until
    the writer thread writes it. ``payloads()`` gives their payloads, only when the journal
    keeps payloads (``None`` otherwise); ``dropped`` counts the whole run's slow-consumer
    drops."""

    ts: int
    protocol: str
    sender: str
    kind: str
    topic: str
    count: int
    payloads: Callable[[], Sequence[bytes]] | None
    recipients: Mapping[str, int]
    dropped: int
    #: the payloads' total size
    size: int
    #: the node the run was published on, when another node published it (a cluster)
    origin_node: str | None = None


@frozen
class Built:
    """A batch as a table (``None`` when no record could be built), and what was left out:
    ``set_aside`` messages or session events (a run counts its messages), the first
    ``error`` met building them."""

    table: pa.Table | None
    set_aside: int = 0
    error: Exception | None = None


def build(
    table_name: str, records: list[Any], keep_payloads: bool = False, node: str = ""
) -> Built:
    """``records`` of ``table_name`` as one table, every record that can be written in it;
    ``node``: the writing broker's node name, on every row."""

    def maker(batch: list[Any], escaped: list[Escaped] | None) -> pa.Table:
        if table_name == schema.MESSAGES:
            return messages_table(batch, keep_payloads, escaped, node)
        return sessions_table(batch, escaped, node)

    # an unwritable name, most likely: escape, and try again
    with contextlib.suppress(Exception):
        return Built(maker(records, None))
    fields = MESSAGE_NAMES if table_name == schema.MESSAGES else SESSION_NAMES
    escaped_records, escaped = _escape_all(records, fields)
    # something else: find the records that cannot be built alone
    with contextlib.suppress(Exception):
        return Built(maker(escaped_records, escaped))
    tables: list[pa.Table] = []
    bad: list[tuple[Any, Exception]] = []
    _bisect(maker, escaped_records, escaped, tables, bad)
    lost = sum(r.count if isinstance(r, RunRecord) else 1 for r, _ in bad)
    table = pa.concat_tables(tables) if tables else None
    return Built(table, lost, bad[0][1] if bad else None)


def _bisect(
    maker: Callable[[list[Any], list[Escaped] | None], pa.Table],
    records: list[Any],
    escaped: list[Escaped],
    tables: list[pa.Table],
    bad: list[tuple[Any, Exception]],
) -> None:
    """Tables of ``records`` in order, halving a part that fails down to its bad records:
    about two builds of the batch per bad record, only when something is wrong."""
    try:
        tables.append(maker(records, escaped))
        return
    except Exception as e:
        if len(records) == 1:
            bad.append((records[0], e))
            return
    middle = len(records) // 2
    _bisect(maker, records[:middle], escaped[:middle], tables, bad)
    _bisect(maker, records[middle:], escaped[middle:], tables, bad)


def _escape_all(
    records: list[Any], fields: Sequence[tuple[int, str]]
) -> tuple[list[Any], list[Escaped]]:
    """The records with their unwritable names escaped (``fields``: where a tuple holds
    names), and each one's escaped columns."""
    pairs = [_escape(record, fields) for record in records]
    return [record for record, _ in pairs], [escaped for _, escaped in pairs]


def _escape(record: Any, fields: Sequence[tuple[int, str]]) -> tuple[Any, Escaped]:
    if type(record) is tuple:
        bad = [
            (i, column)
            for i, column in fields
            if isinstance(record[i], str) and names.needs_escape(record[i])
        ]
        if not bad:
            return record, None
        row = list(record)
        for i, _ in bad:
            row[i] = names.escape(row[i])
        return tuple(row), [column for _, column in bad]
    if isinstance(record, RunRecord):
        columns = [
            column
            for column in RUN_NAMES
            if isinstance(value := getattr(record, column), str) and names.needs_escape(value)
        ]
        if not columns:
            return record, None

        def stored(column: str) -> Any:
            value = getattr(record, column)
            return names.escape(value) if column in columns else value

        escaped = attrs.evolve(
            record,
            protocol=stored("protocol"),
            sender=stored("sender"),
            kind=stored("kind"),
            topic=stored("topic"),
            origin_node=stored("origin_node"),
        )
        return escaped, columns
    return record, None


def _escaped_column(escaped: list[Escaped] | None, rows: int) -> pa.Array:
    if escaped is None:
        return pa.nulls(rows, schema.ESCAPED)
    return pa.array(escaped, schema.ESCAPED)


def messages_table(
    records: list[Any],
    keep_payloads: bool = False,
    escaped: list[Escaped] | None = None,
    node: str = "",
) -> pa.Table:
    """Message and run records as a messages table: a row per record, or with payloads kept
    a row per message."""
    if keep_payloads and any(type(record) is not tuple for record in records):
        return _with_runs(records, escaped, node)  # a row per payload
    rows = [record if type(record) is tuple else _run_row(record) for record in records]
    return pa.Table.from_batches([rows_batch(rows, escaped, node)])


def _run_row(run: RunRecord) -> tuple[Any, ...]:
    """A run as one row: ``count`` messages, their total size, the same recipients each."""
    return (
        run.ts, run.protocol, run.sender, run.kind, run.topic, run.size,
        run.recipients, 0, run.dropped, None, run.count, run.origin_node,
    )  # fmt: skip


def _spread(total: int, count: int) -> list[int]:
    """``total`` split over ``count`` rows as evenly as possible (earlier rows get the rest)."""
    base, rest = divmod(total, count)
    return [base + 1] * rest + [base] * (count - rest)


def rows_batch(
    rows: list[tuple[Any, ...]], escaped: list[Escaped] | None = None, node: str = ""
) -> pa.RecordBatch:
    """Message tuples as a record batch of the messages schema, written by ``node``."""
    # one C-level pass per column (zip(*rows) makes an iterator per row)
    (ts, protocol, sender, kind, topic, size, recipients, skipped, dropped, payload, count,
     origin) = (list(map(itemgetter(i), rows)) for i in range(12))  # fmt: skip
    return pa.RecordBatch.from_arrays(
        [
            # int64 first: Python ints straight to a timestamp type take a slow path
            pa.array(ts, pa.int64()).view(schema.TIMESTAMP),
            pa.array(protocol, pa.string()),
            pa.array(sender, pa.string()),
            pa.array(kind, pa.string()),
            pa.array(topic, pa.string()),
            pa.array(count, pa.int32()),
            pa.array(size, pa.int64()),
            pa.array(recipients, schema.RECIPIENTS),
            pa.array(list(map(sum, map(_values, recipients))), pa.int32()),
            pa.array(skipped, pa.int32()),
            pa.array(dropped, pa.int32()),
            pa.array(payload, pa.binary()),
            _escaped_column(escaped, len(rows)),
            _node_column(node, len(rows)),
            pa.array(origin, pa.string()),
        ],
        schema=schema.MESSAGES_SCHEMA,
    )


def _node_column(node: str, rows: int) -> pa.Array:
    """``node`` on every row (one C-level fill; Parquet stores it as one dictionary entry)."""
    return pa.repeat(pa.scalar(node, pa.string()), rows)


def _with_runs(records: list[Any], escaped: list[Escaped] | None, node: str) -> pa.Table:
    """Messages and runs expanded to a row per message (payloads are kept): the columns a
    run's rows share are built once per record and repeated by a gather (``take``); only
    the payload sizes, drops and payloads are per row, by C-level list operations."""
    heads: list[tuple[Any, ...]] = []
    counts: list[int] = []
    sizes: list[int] = []
    drops: list[int] = []
    payloads: list[bytes | None] = []
    for record in records:
        if type(record) is tuple:
            heads.append(record)
            counts.append(1)
            sizes.append(record[5])
            drops.append(record[8])
            payloads.append(record[9])
            continue
        assert record.payloads is not None  # a journal that keeps payloads keeps them
        run = record.payloads()
        n = len(run)
        heads.append(
            (record.ts, record.protocol, record.sender, record.kind, record.topic,
             0, record.recipients, 0, 0, None, 1, record.origin_node)
        )  # fmt: skip
        counts.append(n)
        sizes.extend(map(len, run))
        drops.extend(_spread(record.dropped, n) if record.dropped and n else [0] * n)
        payloads.extend(run)
    shared = pa.Table.from_batches([rows_batch(heads, escaped, node)])
    total = len(sizes)
    offsets = pa.array(list(accumulate(counts, initial=0)), pa.int32())
    # row -> its record: the parent index of each element of a list per record
    parents = pc.list_parent_indices(pa.ListArray.from_arrays(offsets, pa.nulls(total)))
    table = shared.take(parents)
    for name, column in (
        ("payload_size", pa.array(sizes, pa.int64())),
        ("dropped", pa.array(drops, pa.int32())),
        ("payload", pa.array(payloads, pa.binary())),
    ):
        table = table.set_column(
            table.schema.get_field_index(name), schema.MESSAGES_SCHEMA.field(name), column
        )
    return table


def sessions_table(
    records: list[tuple[Any, ...]], escaped: list[Escaped] | None = None, node: str = ""
) -> pa.Table:
    """Session event tuples as a sessions table, written by ``node``."""
    ts, event, protocol, session_id, identity, host, scheme, reason = (
        list(map(itemgetter(i), records)) for i in range(8)
    )
    return pa.Table.from_arrays(
        [
            pa.array(ts, pa.int64()).view(schema.TIMESTAMP),
            pa.array(event, pa.string()),
            pa.array(protocol, pa.string()),
            pa.array(session_id, pa.int64()),
            pa.array(identity, pa.string()),
            pa.array(host, pa.string()),
            pa.array(scheme, pa.string()),
            pa.array(reason, pa.string()),
            _escaped_column(escaped, len(records)),
            _node_column(node, len(records)),
        ],
        schema=schema.SESSIONS_SCHEMA,
    )
