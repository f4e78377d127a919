"""The ``msgbroker`` PySpark data source: a streaming sink that publishes rows into the broker.

::

    register(spark)
    (df.writeStream.format("msgbroker")         # df has columns topic, payload
        .option("broker", "127.0.0.1:4444")
        .option("checkpointLocation", "/var/lib/stats/checkpoint")
        .start())

Each row becomes one SSMP ``MCAST topic payload`` (``payload`` a string, sent as UTF-8, or
binary). Rows SSMP cannot carry (a topic that is not an SSMP id, an empty payload or one over
1024 bytes) are skipped and counted, not fatal: a query that fails on a row would fail again
on the same row after every restart.

Exactly once per micro-batch, by batch id: the executors' :meth:`MsgbrokerStreamWriter.write`
only hands its rows back as a commit message; the driver's ``commit(messages, batchId)``
publishes them over one connection and then records ``batchId`` in a small state file
(written atomically: temp file, fsync, rename, fsync of the directory). A batch id not above
the recorded one is skipped, so the batch Spark replays after a restart from the checkpoint
(the one whose commit it had not logged yet) is not published twice. What remains is the
window between the last ``200`` from the broker and the state file's rename: a crash there (or
a broker that fails mid-batch) publishes the whole batch again on the replay, at least once.
See docs/streaming.md.

The state file lives at the ``state`` option, by default ``msgbroker-sink.state`` inside the
query's ``checkpointLocation`` option (which must then be a local path: the state file is
written by the driver, with plain file I/O). It belongs to that checkpoint: delete both or
neither.

How it logs in is :class:`BrokerLogin`: an identity, a scheme (``open``, ``secret``, ``cert``,
or any a plugin adds), the credential's file, TLS with a client certificate. Only paths go
into Spark's options: the driver reads the files when it publishes, so a secret never appears
in a query plan and never travels to the executors.

This module imports PySpark at import time; import it only with the ``spark`` extra installed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import ssl
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from msgbroker.plugins.ssmp.codec import MAX_PAYLOAD, is_valid_id

NAME = "msgbroker"
DEFAULT_IDENTITY = "spark-stats"
DEFAULT_PORT = 4444
DEFAULT_TIMEOUT = 10.0
STATE_NAME = "msgbroker-sink.state"

log = logging.getLogger(__name__)


class SinkError(Exception):
    """The sink was set up wrong (options, schema): the message says what to change."""


#: the sink's login options (Spark's options are strings)
LOGIN_OPTIONS = ("identity", "scheme", "secret_file", "tls", "ca", "cert", "key")


@dataclass(frozen=True)
class BrokerLogin:
    """How the sink logs in to the broker's SSMP listener, with the options of the protocol
    clients (``msgbroker ssmp --help``): ``identity``; ``scheme`` (None: ``secret`` with a
    ``secret_file``, ``cert`` with a ``cert``, else ``open``); ``secret_file``, the file holding
    the credential (without its final line break); TLS when ``tls`` or any of ``ca`` (the CA
    to verify the broker with; default the system's), ``cert`` and ``key`` (the client
    certificate, for the cert scheme) is given."""

    identity: str = DEFAULT_IDENTITY
    scheme: str | None = None
    secret_file: str | None = None
    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str] | Any) -> BrokerLogin:
        """The login a writer's options name (:meth:`options`)."""
        values = {name: options.get(name) or None for name in LOGIN_OPTIONS}
        tls = str(values.pop("tls") or "").lower() in ("true", "1", "yes")
        return cls(**{k: v for k, v in values.items() if v is not None}, tls=tls)

    def options(self) -> dict[str, str]:
        """As the sink's options (what is not set is left out)."""
        values = {"identity": self.identity, "scheme": self.scheme,
                  "secret_file": self.secret_file, "ca": self.ca, "cert": self.cert,
                  "key": self.key, "tls": "true" if self.tls else None}  # fmt: skip
        return {name: value for name, value in values.items() if value}

    @property
    def login_scheme(self) -> str:
        if self.scheme:
            return self.scheme
        if self.secret_file:
            return "secret"
        return "cert" if self.cert else "open"

    @property
    def uses_tls(self) -> bool:
        return bool(self.tls or self.ca or self.cert)

    def check(self) -> None:
        """:class:`SinkError` for an identity SSMP cannot carry, or a login that lacks
        its file."""
        if not is_valid_id(self.identity):
            raise SinkError(f"identity {self.identity!r} is not a valid SSMP id")
        if self.login_scheme == "secret" and not self.secret_file:
            raise SinkError("the secret scheme needs a secret file (--secret-file)")

    def credential(self) -> bytes | None:
        """The secret file's contents (read now), or None without one."""
        if not self.secret_file:
            return None
        try:
            data = Path(self.secret_file).read_bytes()
        except OSError as e:
            raise SinkError(f"cannot read secret file {self.secret_file}: {e.strerror}") from None
        return data.removesuffix(b"\n").removesuffix(b"\r")

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS for the connection (the files read now), or None."""
        if not self.uses_tls:
            return None
        from msgbroker.clientkit.tls import ssl_context

        try:
            return ssl_context(self.ca, self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise SinkError(f"cannot set up TLS: {e}") from None

    def connect(self, host: str, port: int, timeout: float, **options: Any) -> Any:
        """A logged-in :class:`~msgbroker.plugins.ssmp.client.BlockingSSMPClient`."""
        return BlockingSSMPClient(
            host, port, self.identity, self.login_scheme, self.credential(),
            ssl_context=self.ssl_context(), timeout=timeout, **options,
        )  # fmt: skip


# Spark pickles commit messages between processes; attrs classes pickle too, but a
# dataclass is what pyspark.sql.datasource documents and subclasses
@dataclass(frozen=True)
class PublishRows(WriterCommitMessage):
    """One task's share of a micro-batch: the messages to publish, and how many rows could
    not be sent."""

    messages: list[tuple[str, bytes]] = field(default_factory=list)
    skipped: int = 0


def parse_broker(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``HOST`` (port 4444) or ``[V6]:PORT`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or "]" in port:  # no port: "host" or "[::1]"
        host, port = text, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SinkError(f"broker must be HOST:PORT, not {text!r}")
    return host, int(port)


def local_path(location: str) -> Path:
    """A checkpoint location as a local path (``file:`` URIs too); :class:`SinkError` for
    other file systems (HDFS, S3 ...), which the driver cannot rename into with plain I/O."""
    if location.startswith("file://"):
        location = location[len("file://") :]
    elif location.startswith("file:"):
        location = location[len("file:") :]
    elif "://" in location:
        raise SinkError(
            f"the checkpoint location {location!r} is not a local path: give the msgbroker "
            "sink a local 'state' file option"
        )
    return Path(location)


def state_path(options: dict[str, str] | Any) -> Path:
    """Where the last published batch id is recorded (see the module docstring)."""
    state = options.get("state")
    if state:
        return Path(state)
    checkpoint = options.get("checkpointLocation")
    if not checkpoint:
        raise SinkError(
            "the msgbroker sink needs a 'state' option or a 'checkpointLocation' option "
            "on the writeStream (a session-wide checkpoint root is not visible to it)"
        )
    return local_path(checkpoint) / STATE_NAME


def read_state(path: Path) -> int | None:
    """The last batch id published, or ``None`` before the first."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return int(json.loads(text)["batch"])
    except (ValueError, KeyError, TypeError) as e:
        # guessing would either republish or silently drop batches: make a person decide
        raise SinkError(f"unreadable msgbroker sink state {path}: {e}") from None


def write_state(path: Path, batch_id: int) -> None:
    """Record ``batch_id`` so that a crash leaves either the old or the new file, complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({"batch": batch_id}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)


def to_message(topic: Any, payload: Any) -> tuple[str, bytes] | None:
    """A row's (topic, payload bytes), or ``None`` if SSMP cannot carry it."""
    if not isinstance(topic, str) or not is_valid_id(topic):
        return None
    if isinstance(payload, str):
        data = payload.encode("utf-8")
    elif isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
    else:
        return None
    if not 0 < len(data) <= MAX_PAYLOAD:
        return None
    return topic, data


def check_schema(schema: StructType) -> None:
    """``topic`` must be a string column and ``payload`` a string or binary one."""
    types = {f.name: f.dataType for f in schema.fields}
    problems = []
    if not isinstance(types.get("topic"), StringType):
        problems.append("a string column 'topic'")
    if not isinstance(types.get("payload"), StringType | BinaryType):
        problems.append("a string or binary column 'payload'")
    if problems:
        raise SinkError(
            f"the msgbroker sink needs {' and '.join(problems)}; got {schema.simpleString()}"
        )


class MsgbrokerStreamWriter(DataSourceStreamWriter):
    """Executors collect, the driver publishes once per batch id (module docstring)."""

    def __init__(self, options: dict[str, str] | Any) -> None:
        self.host, self.port = parse_broker(options.get("broker") or f"127.0.0.1:{DEFAULT_PORT}")
        self.login = BrokerLogin.from_options(options)
        self.login.check()
        self.timeout = float(options.get("timeout") or DEFAULT_TIMEOUT)
        self.state = state_path(options)

    @property
    def identity(self) -> str:
        return self.login.identity

    def write(self, iterator: Iterator[Row]) -> PublishRows:
        messages = []
        skipped = 0
        for row in iterator:
            message = to_message(row["topic"], row["payload"])
            if message is None:
                skipped += 1
            else:
                messages.append(message)
        return PublishRows(messages, skipped)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        self.publish(messages, batchId)

    def publish(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> int:
        """Publish a batch unless its id was already published; returns how many messages
        were sent (0 for a batch already done)."""
        last = read_state(self.state)
        if last is not None and batch_id <= last:
            log.info("msgbroker sink: batch %d already published (state: %d)", batch_id, last)
            return 0
        rows = [m for m in messages if isinstance(m, PublishRows)]
        skipped = sum(m.skipped for m in rows)
        if skipped:
            log.warning("msgbroker sink: batch %d: %d rows SSMP cannot carry", batch_id, skipped)
        outgoing = [message for m in rows for message in m.messages]
        if outgoing:
            with self.login.connect(self.host, self.port, self.timeout, keepalive=None) as client:
                for topic, payload in outgoing:
                    client.mcast(topic, payload)
        write_state(self.state, batch_id)
        return len(outgoing)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """A failed batch publishes nothing; Spark runs it again under the same id."""


class MsgbrokerDataSource(DataSource):
    """``format("msgbroker")``: options ``broker`` (HOST:PORT, default 127.0.0.1:4444), the
    login's (:class:`BrokerLogin`: ``identity``, default ``spark-stats``; ``scheme``,
    ``secret_file``; ``tls``, ``ca``, ``cert``, ``key``), ``state`` (the batch id file;
    default inside ``checkpointLocation``), ``timeout`` (seconds per reply)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "topic string, payload string"

    def streamWriter(self, schema: StructType, overwrite: bool) -> MsgbrokerStreamWriter:
        check_schema(schema)
        return MsgbrokerStreamWriter(self.options)


def register(spark: SparkSession) -> None:
    """Make ``format("msgbroker")`` available in ``spark`` (idempotent).

    Locally, Spark's Python workers run ``$PYSPARK_PYTHON`` (read when the session starts;
    default: ``python3`` on PATH), and they import this module: with another interpreter
    the query would fail at its first batch with ``No module named 'msgbroker'``, so say so now.
    """
    context = spark.sparkContext
    worker = shutil.which(context.pythonExec) or context.pythonExec
    if (context.master or "").startswith("local") and os.path.abspath(worker) != sys.executable:
        raise SinkError(
            f"Spark's Python workers run {context.pythonExec!r}, not this Python "
            f"({sys.executable}), and cannot import msgbroker: set PYSPARK_PYTHON="
            f"{sys.executable} before starting the SparkSession"
        )
    spark.dataSource.register(MsgbrokerDataSource)
