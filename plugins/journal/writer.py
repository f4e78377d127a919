"""The journal writer: records in memory, Parquet segments written by a thread of its own.

No Twisted here. The broker's hooks call :meth:`JournalWriter.message`,
:meth:`~JournalWriter.run` and :meth:`~JournalWriter.session` in the reactor thread; each
appends a plain tuple to a list under a lock and returns, so routing never waits on the disk.
A daemon thread wakes every ``rotate_seconds``, or early when the pending records' estimated
size reaches ``rotate_bytes``, swaps the lists out, builds Arrow tables (:mod:`.tables`:
expanding each run into its rows there, not in the reactor thread; a name that is not valid
UTF-8 stored escaped; a record that cannot be built at all set aside alone, never costing
the rest of its batch) and writes one segment per table and date.

A segment becomes visible only complete: it is written under a hidden temporary name in its
partition directory, fsynced, renamed to its final name, and the directory is fsynced. A
``kill -9`` therefore loses at most the records not yet written, and may leave a temporary,
which the next writer of that node on the directory removes.

Each writer writes as one node (``node``, the broker's node name): every row carries it,
and its segment files are named after it, so several nodes' writers can share a directory
(each numbers its own segments, and removes only its own temporaries).

Memory is bounded by ``max_records`` pending records: past it new records are dropped and
counted (:attr:`JournalWriter.dropped`, logged at the next rotation). A segment that cannot
be written (disk full) is logged and its records counted in :attr:`JournalWriter.failed`;
the thread goes on with the next batch.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgbroker.nodes import file_form

from . import schema, tables
from .tables import RunRecord

#: estimated bytes per pending record (its tuple and strings), for the size rotation
RECORD_OVERHEAD = 100

_log = logging.getLogger("msgbroker.journal")


class JournalWriter:
    """Writes the journal under ``directory`` (see :mod:`.schema` for the layout).

    ``node`` is the writing broker's node name (:attr:`msgbroker.Broker.node_name`; ``""``:
    none, and the segments are named as before node names). ``clock`` (monotonic seconds)
    times the rotations; ``start=False`` runs no thread, so a test drives the rotations
    itself with :meth:`tick` and :meth:`flush`. Timestamps (``ts``) are microseconds since
    the epoch, given by the caller.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        node: str = "",
        rotate_seconds: float = 10.0,
        rotate_bytes: int = 64 << 20,
        max_records: int = 1_000_000,
        keep_payloads: bool = False,
        clock: Callable[[], float] = time.monotonic,
        warn: Callable[[str], None] = _log.warning,
        start: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.node = node
        #: ``node`` as its segments' names spell it
        self.node_file = file_form(node)
        self.rotate_seconds = rotate_seconds
        self.rotate_bytes = rotate_bytes
        self.max_records = max_records
        self.keep_payloads = keep_payloads
        self._clock = clock
        self._warn = warn
        #: records dropped because ``max_records`` were pending (or after close)
        self.dropped = 0
        #: records lost because their segment could not be written, or because they could
        #: not be built into a table at all (set aside, the rest of the batch written)
        self.failed = 0
        #: records written, and finalized segment files
        self.written = 0
        self.segments = 0
        #: bytes of the segment files written (their size on disk)
        self.bytes_written = 0
        #: leftover temporaries of an earlier writer, removed at start
        self.removed: list[Path] = []
        self._lock = threading.Lock()  # the pending lists and their counts
        self._write_lock = threading.Lock()  # one rotation at a time
        self._written = threading.Condition()
        self._wake = threading.Event()
        self._messages: list[Any] = []
        self._sessions: list[tuple[Any, ...]] = []
        self._pending = 0
        self._size = 0
        self._signalled = False
        self._unreported = 0
        self._limit = max_records  # 0 once closed
        self._closing = False
        self._next_seq = {name: self._scan(name) for name in schema.TABLES}
        # pyarrow initializes lazily on the first conversion (with pandas installed it
        # imports pandas: half a second holding the GIL). Here, at start, rather than in the
        # thread's first rotation, where it stalled the reactor in the middle of traffic
        tables.rows_batch([], node=node)
        tables.sessions_table([], node=node)
        self._last_rotation = clock()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name="journal-writer", daemon=True)
            self._thread.start()

    # -- the reactor thread's side: append and return ----------------------------------------

    def message(
        self,
        ts: int,
        protocol: str,
        sender: str,
        kind: str,
        topic: str | None,
        payload: bytes,
        recipients: Mapping[str, int],
        skipped: int,
        dropped: int,
        origin_node: str | None = None,
    ) -> None:
        """One routed message (``recipients``: deliveries per protocol, not copied: do not
        change it afterwards). ``origin_node``: the node that published it, when that is
        another node of a cluster and this one routed it to its own subscribers (column
        ``origin_node``); ``None``, published here."""
        size = len(payload)
        kept = payload if self.keep_payloads else None
        with self._lock:
            if self._pending >= self._limit:
                self.dropped += 1
                self._unreported += 1
                return
            self._messages.append(
                (ts, protocol, sender, kind, topic, size, recipients, skipped, dropped, kept, 1,
                 origin_node)
            )  # fmt: skip
            self._pending += 1
            self._size += RECORD_OVERHEAD if kept is None else RECORD_OVERHEAD + size
            if self._size >= self.rotate_bytes and not self._signalled:
                self._signalled = True
                self._wake.set()

    def run(
        self,
        ts: int,
        protocol: str,
        sender: str,
        kind: str,
        topic: str,
        count: int,
        payloads: Callable[[], Sequence[bytes]],
        recipients: Mapping[str, int],
        dropped: int,
        payload_bytes: Callable[[], int] | None = None,
        origin_node: str | None = None,
    ) -> None:
        """``count`` messages routed at once to the same ``recipients`` (each): one row with
        that ``count`` and their total size, ``payload_bytes()`` (default: the sum over
        ``payloads()``), asked now; ``origin_node`` as for :meth:`message`. With payloads
        kept the run is expanded to a row per message instead. A run counts against
        ``max_records`` as the rows it will be (one, or ``count`` with payloads); one that
        does not fit is dropped whole, its ``count`` messages counted in :attr:`dropped`.

        Without payloads the record keeps only the numbers: holding ``payloads`` until the
        rotation would keep the run's request bytes and encoded frames alive with it, which
        under load is hundreds of megabytes a second, and a broker slowed by its allocator.
        Asking the size now costs nothing where the sender knows it (SSMP: the request
        block's length) and a C-level sum over payloads already built otherwise."""
        # what it holds in memory until written: a row per message with payloads (they are
        # kept), else one row whatever the count
        if self.keep_payloads:
            kept: Callable[[], Sequence[bytes]] | None = payloads
            total = sum(map(len, payloads()))
            rows, size = count, RECORD_OVERHEAD * count + total
        else:
            kept = None
            total = payload_bytes() if payload_bytes is not None else sum(map(len, payloads()))
            rows, size = 1, RECORD_OVERHEAD
        record = RunRecord(
            ts, protocol, sender, kind, topic, count, kept, recipients, dropped, total,
            origin_node,
        )  # fmt: skip
        with self._lock:
            if self._pending + rows > self._limit:
                self.dropped += count
                self._unreported += count
                return
            self._messages.append(record)
            self._pending += rows
            self._size += size
            if self._size >= self.rotate_bytes and not self._signalled:
                self._signalled = True
                self._wake.set()

    def session(
        self,
        ts: int,
        event: str,
        protocol: str,
        session_id: int | None,
        identity: str | None,
        host: str,
        scheme: str | None,
        reason: str | None,
    ) -> None:
        """One session event (``event``: one of :data:`.schema.SESSION_EVENTS`)."""
        with self._lock:
            if self._pending >= self._limit:
                self.dropped += 1
                self._unreported += 1
                return
            self._sessions.append((ts, event, protocol, session_id, identity, host, scheme, reason))
            self._pending += 1
            self._size += RECORD_OVERHEAD
            if self._size >= self.rotate_bytes and not self._signalled:
                self._signalled = True
                self._wake.set()

    @property
    def pending(self) -> int:
        """Records waiting for the next rotation."""
        return self._pending

    @property
    def lag(self) -> float:
        """Seconds since the last rotation: how old the oldest pending record may be (the
        journal on disk is at most this far behind the broker)."""
        return max(0.0, self._clock() - self._last_rotation)

    # -- rotation ----------------------------------------------------------------------------

    def due(self) -> bool:
        """Whether a rotation is due: ``rotate_seconds`` have passed since the last one, or
        the pending records' estimated size reached ``rotate_bytes``."""
        return (
            self._size >= self.rotate_bytes
            or self._clock() - self._last_rotation >= self.rotate_seconds
        )

    def tick(self) -> list[Path]:
        """Rotate if :meth:`due`; the segments written."""
        return self.flush() if self.due() else []

    def flush(self) -> list[Path]:
        """Write every pending record now (one segment per table and date); the segments
        written. Write errors are logged and counted, never raised."""
        with self._write_lock:
            with self._lock:
                messages, self._messages = self._messages, []
                sessions, self._sessions = self._sessions, []
                self._pending = self._size = 0
                self._signalled = False
                unreported, self._unreported = self._unreported, 0
            self._last_rotation = self._clock()
            if unreported:
                self._warn(
                    f"journal: dropped {unreported} records: {self.max_records} were pending "
                    f"(the disk does not keep up); {self.dropped} dropped in all"
                )
            paths = self._write(schema.MESSAGES, messages)
            paths += self._write(schema.SESSIONS, sessions)
        if paths:
            with self._written:
                self.segments += len(paths)
                self._written.notify_all()
        return paths

    def wait_segments(self, count: int, timeout: float) -> bool:
        """Wait until at least ``count`` segments were written in all; False on timeout."""
        with self._written:
            return self._written.wait_for(lambda: self.segments >= count, timeout)

    def close(self) -> None:
        """Stop the thread, write what is pending; later records are dropped (counted)."""
        if self._closing:
            return
        with self._lock:
            self._closing = True
            self._limit = 0
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def _loop(self) -> None:
        while not self._closing:
            timeout = self._last_rotation + self.rotate_seconds - self._clock()
            if timeout > 0:
                self._wake.wait(timeout)
            # cleared before the swap: a crossing after it sets the event again
            self._wake.clear()
            if self._closing:
                return  # close() writes the rest
            try:
                self.tick()
            except Exception as e:  # never let the thread die: the next batch may work
                self._warn(f"journal: rotation failed: {e!r}")

    # -- files -------------------------------------------------------------------------------

    def _scan(self, table: str) -> int:
        """The next sequence number of ``table`` for this node (after each of its existing
        segments); removes the temporaries a killed writer of this node left behind (and,
        for a node, those of a writer from before node names: it had the directory alone).
        Other nodes' files are theirs: not counted, never removed."""
        root = self.directory / table
        root.mkdir(parents=True, exist_ok=True)
        last = -1
        mine = {self.node_file or None, None}  # the temporaries this writer may remove
        for partition in root.iterdir():
            if not (partition.name.startswith(schema.PARTITION_PREFIX) and partition.is_dir()):
                continue
            for entry in partition.iterdir():
                match = schema.SEGMENT_RE.fullmatch(entry.name)
                if match is not None:
                    if (match.group(1) or "") == self.node_file:
                        last = max(last, int(match.group(2)))
                    continue
                match = schema.TEMP_RE.fullmatch(entry.name)
                if match is not None and match.group(1) in mine:
                    with contextlib.suppress(FileNotFoundError):
                        entry.unlink()
                    self.removed.append(entry)
        return last + 1

    def _write(self, table_name: str, records: list[Any]) -> list[Path]:
        if not records:
            return []
        built = tables.build(table_name, records, self.keep_payloads, self.node)
        if built.set_aside:
            # only the records that cannot be built on their own: never the whole batch
            self.failed += built.set_aside
            self._warn(
                f"journal: {built.set_aside} {table_name} records cannot be written, left "
                f"out of the segment: {built.error!r}"
            )
        table = built.table
        if table is None:
            return []
        paths = []
        for day, part in _by_date(table):
            try:
                paths.append(self._write_segment(table_name, day, part))
            except Exception as e:
                self.failed += part.num_rows
                self._warn(
                    f"journal: cannot write {table_name} segment for {day}, "
                    f"{part.num_rows} records lost: {e}"
                )
            else:
                self.written += part.num_rows
        return paths

    def _write_segment(self, table_name: str, day: datetime.date, table: pa.Table) -> Path:
        root = self.directory / table_name
        partition = root / f"{schema.PARTITION_PREFIX}{day.isoformat()}"
        if not partition.is_dir():
            partition.mkdir(parents=True, exist_ok=True)
            _fsync_dir(root)
        seq = self._next_seq[table_name]
        self._next_seq[table_name] = seq + 1  # a failed write leaves a gap, never a reuse
        temp = partition / schema.segment_name(self.node_file, seq, temporary=True)
        final = partition / schema.segment_name(self.node_file, seq)
        try:
            pq.write_table(table, temp)
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            os.rename(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        _fsync_dir(partition)
        self.bytes_written += size
        return final


def _by_date(table: pa.Table) -> list[tuple[datetime.date, pa.Table]]:
    """``table`` split by the UTC date of its ``ts`` (usually one date: no copy)."""
    days = table.column("ts").cast(pa.date32())
    bounds = pc.min_max(days)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low == high:
        return [(low, table)]
    return [
        (day, table.filter(pc.equal(days, pa.scalar(day, pa.date32()))))
        for day in sorted(pc.unique(days).to_pylist())
    ]


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
