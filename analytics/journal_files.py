"""Which files of a journal directory a job may read, checked before Spark sees them.

One unreadable file must not fail a whole job, and a skipped file must be named (Spark's
``ignoreCorruptFiles`` skips without saying which). So the jobs list the segments
themselves, read each one's Parquet footer with pyarrow (a few kilobytes, no data pages),
and read only the files whose schema has the journal's columns with the journal's types.
Everything else is *reported* (one :class:`SkippedFile` each) and left out, never fatal: a
truncated segment from a disk that filled up, a stray CSV, a Parquet file of some other
program.

The layout is the journal plugin's (docs/journal.md)::

    DIR/messages/date=YYYY-MM-DD/seg-00000042.parquet
    DIR/sessions/date=YYYY-MM-DD/seg-00000007.parquet

Names starting with ``.`` (temporaries being written) or ``_`` (Spark's and Hadoop's
``_SUCCESS``, ``_metadata``) are not journal files and are passed over silently. The
schemas are restated here rather than imported from the journal plugin so the jobs do not
depend on the plugin being installed (the analytics machine needs no broker); a test checks
that the two agree.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import attrs
import pyarrow as pa
import pyarrow.parquet as pq

# the table names, the timestamp type and the error line are the tasks' (grains and
# partials import nothing of msgbroker, so the sharing goes this way)
from .grains import MESSAGES, SESSIONS, TIMESTAMP
from .partials import one_line

#: the columns a job reads, with their types (``messages/2``: a row stands for ``count``
#: messages, ``payload_size`` is all of theirs). A file may have more columns, never fewer
#: (but see :data:`OPTIONAL`) or of another type (but a narrower integer reads as a wider one)
MESSAGES_COLUMNS = pa.schema(
    [
        ("ts", TIMESTAMP),
        ("protocol", pa.string()),
        ("sender", pa.string()),
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("count", pa.int32()),
        ("payload_size", pa.int64()),
        ("recipients", pa.map_(pa.string(), pa.int32())),
        ("delivered", pa.int32()),
        ("skipped", pa.int32()),
        ("dropped", pa.int32()),
        ("payload", pa.binary()),
    ]
)
SESSIONS_COLUMNS = pa.schema(
    [
        ("ts", TIMESTAMP),
        ("event", pa.string()),
        ("protocol", pa.string()),
        ("session_id", pa.int64()),
        ("identity", pa.string()),
        ("host", pa.string()),
        ("scheme", pa.string()),
        ("reason", pa.string()),
    ]
)
COLUMNS = {MESSAGES: MESSAGES_COLUMNS, SESSIONS: SESSIONS_COLUMNS}
#: the node columns (``messages/4``, ``sessions/3``), which segments written before node
#: names lack (the jobs read ``node`` as ``""``, ``origin_node`` as null); when a file has
#: them, their types are checked as the others' are
NODE_COLUMNS = {
    MESSAGES: pa.schema([("node", pa.string()), ("origin_node", pa.string())]),
    SESSIONS: pa.schema([("node", pa.string())]),
}

#: columns a segment may lack: ``messages/1`` segments (one row per message, int32
#: ``payload_size``) have no ``count``; the jobs read it as null and count 1; and the node
#: columns
OPTIONAL = frozenset({"count", "node", "origin_node"})

PARTITION_PREFIX = "date="


@attrs.frozen
class SkippedFile:
    """A file in the journal directory that is not a readable segment, and why."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.path}: {self.reason}"


@attrs.frozen
class JournalFiles:
    """The segments of one table a job may read, and the files passed over with a reason."""

    table: str
    segments: tuple[Path, ...]
    skipped: tuple[SkippedFile, ...]


def list_table(
    journal_dir: Path,
    table: str,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> JournalFiles:
    """Check every file of ``journal_dir/table`` and sort it into good and skipped.

    ``since``/``until`` (aware datetimes) prune whole ``date=`` partitions that cannot hold a
    row in ``[since, until)``: their files are not even opened. Rows are still filtered by
    the job; this only saves reading days that cannot match.
    """
    expected = pa.schema([*COLUMNS[table], *NODE_COLUMNS[table]])
    segments: list[Path] = []
    skipped: list[SkippedFile] = []
    for path in _walk(journal_dir / table):
        day = _partition_day(path)
        if day is not None and not _day_in_range(day, since, until):
            continue
        reason = schema_problem(path, expected)
        if reason is None:
            segments.append(path)
        else:
            skipped.append(SkippedFile(path, reason))
    return JournalFiles(table, tuple(segments), tuple(skipped))


def schema_problem(path: Path, expected: pa.Schema) -> str | None:
    """Why ``path`` is not a segment with ``expected``'s columns, or None if it is one.

    Reads the footer only. A file whose footer is fine but whose data pages are damaged gets
    past this check: the report's tasks find and report that rarer case
    (:mod:`.partials`); the streaming query runs Spark's reader with ``ignoreCorruptFiles``.
    """
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as e:
        return f"not a readable Parquet file ({one_line(e)})"
    missing = [f.name for f in expected if f.name not in schema.names and f.name not in OPTIONAL]
    if missing:
        return f"not a journal segment (no column {', '.join(missing)})"
    for field in expected:
        if field.name not in schema.names:
            continue
        actual = schema.field(field.name).type
        if not _same_type(actual, field.type):
            return f"not a journal segment (column {field.name} is {actual}, not {field.type})"
    return None


def _same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_map(expected):
        # a map's entry field names ("entries"/"key_value") differ between writers
        return bool(
            pa.types.is_map(actual)
            and actual.key_type.equals(expected.key_type)
            and actual.item_type.equals(expected.item_type)
        )
    if pa.types.is_timestamp(expected):
        # Spark reads us and ms instants alike; a zone-less timestamp would be read as local
        # wall time, which is not what the journal writes
        return bool(
            pa.types.is_timestamp(actual)
            and actual.unit in ("ms", "us")
            and actual.tz in ("UTC", "+00:00", "Etc/UTC", "Z")
        )
    if pa.types.is_signed_integer(expected) and pa.types.is_signed_integer(actual):
        widens: bool = actual.bit_width <= expected.bit_width  # Spark widens on read
        return widens
    return bool(actual.equals(expected))


def _walk(root: Path) -> Iterator[Path]:
    """Every regular file under ``root``, sorted, passing over hidden and ``_`` names."""
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for name in sorted(filenames):
            if not name.startswith((".", "_")):
                path = Path(dirpath, name)
                if path.is_file():
                    yield path


def _partition_day(path: Path) -> dt.date | None:
    for part in reversed(path.parent.parts):
        if part.startswith(PARTITION_PREFIX):
            try:
                return dt.date.fromisoformat(part.removeprefix(PARTITION_PREFIX))
            except ValueError:
                return None
    return None


def _day_in_range(day: dt.date, since: dt.datetime | None, until: dt.datetime | None) -> bool:
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)
    return (since is None or end > since) and (until is None or start < until)
