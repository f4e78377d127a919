"""``msgbroker analytics stream``: live per-topic rates from the growing journal, published back
into the broker.

::

    msgbroker analytics stream /var/lib/msgbroker/journal --broker 127.0.0.1:4444
    msgbroker ssmp sub '_stats/topic/news'      # {"window_start":"2026-11-22T17:30:00Z", ...}
    msgbroker analytics stream JOURNAL --broker broker.example:4443 --tls --ca ca.pem \
        --cert stats.pem --key stats.key        # the cert scheme, as CN/spark-stats
    msgbroker analytics stream JOURNAL --id stats --secret-file /etc/msgbroker/secret

It logs in with the options every client has (``msgbroker ssmp --help``): ``--id``,
``--scheme``, ``--secret-file``, and TLS with ``--tls``, ``--ca``, ``--cert``, ``--key``; the
sink reads the files when it publishes (:class:`~.datasource.BrokerLogin`).

A Structured Streaming query reads ``JOURNAL_DIR/messages`` as a Parquet file stream (finished
segments only: the journal writes ``.seg-*.tmp`` first and Spark skips names starting with
``.``; only ``seg-*.parquet`` files are read at all), counts the MCASTs per topic per tumbling
window of ``ts`` and writes, through the ``msgbroker`` data source (:mod:`.datasource`), one
message per (topic, window) on ``_stats/topic/<topic>``::

    {"window_start":"2026-11-22T17:30:00Z","window_end":"2026-11-22T17:30:10Z","messages":42,"rate":4.2}

``rate`` is messages per second over the window. Each window is published once, final, when
the watermark (the latest ``ts`` seen, minus ``watermark``) has passed its end: Spark 4's
Python data sources only take the ``append`` output mode (``update`` fails with "msgbroker
does not support Update mode"), so a window still filling cannot be published early. Any
journal row moves the watermark (it is taken before the filtering below), but when the
journal gets nothing at all, the last window waits for the next message. Topics are skipped
when ``_stats/topic/`` plus the topic is not an SSMP id (over 64 characters, or characters
SSMP ids cannot have), and so are the ``_stats/`` topics themselves, whose counts would
otherwise feed back into the counts. Only MCASTs are counted (a UCAST's "topic" is its
target), each once: a row of a message another node of a cluster published (its
``origin_node``) is that node's to count.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgbroker.cli import CommandError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from .datasource import BrokerLogin

STATS_PREFIX = "_stats/"
TOPIC_PREFIX = "_stats/topic/"
#: journal topics that still make an SSMP id (64 characters at most) after TOPIC_PREFIX
PUBLISHABLE_TOPIC = (
    rf"^[A-Za-z0-9.:@/_\-+=~]{{1,{64 - len(TOPIC_PREFIX)}}}\z"  # Java regex: \z, not $
)
#: the columns of the journal's messages table (plugins/journal/schema.py) the query reads;
#: ``count`` (how many messages a row stands for) is missing from ``messages/1`` segments,
#: whose rows are one message each; ``origin_node`` (set on a node's deliveries of a message
#: another node published) is missing from segments before node names: null, published here
MESSAGES_SCHEMA = "ts timestamp, kind string, topic string, count int, origin_node string"
DEFAULT_WINDOW = 10.0
#: the journal's rows arrive in ``ts`` order (segments are written and renamed in sequence),
#: so little lateness needs allowing for; each second of it delays every window's publication
DEFAULT_WATERMARK = 2.0
DEFAULT_TRIGGER = 1.0
#: bounds a catch-up micro-batch (after downtime) without slowing the live case, where each
#: trigger sees the one or two segments rotated since the last
MAX_FILES_PER_TRIGGER = 64
CHECKPOINT_NAME = ".stream-checkpoint"
#: ISO 8601 in UTC, whatever the session's time zone
_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ssXXX", "timeZone": "UTC"}

HELP = "publish per-topic message rates from the growing journal into the broker"
DESCRIPTION = (
    "Count the MCASTs per topic per window of JOURNAL_DIR as it grows (Spark Structured "
    "Streaming) and publish each count to the broker on _stats/topic/<topic>, exactly once "
    "per micro-batch. Runs until interrupted; restarts resume from --checkpoint."
)


def seconds(value: float) -> str:
    """A Spark interval string for ``value`` seconds ("10 seconds", "500 milliseconds")."""
    if value == int(value):
        return f"{int(value)} seconds"
    return f"{round(value * 1000)} milliseconds"


def stats(
    spark: SparkSession,
    journal_dir: str | os.PathLike[str],
    window: str = "10 seconds",
    watermark: str = seconds(DEFAULT_WATERMARK),
    max_files_per_trigger: int = MAX_FILES_PER_TRIGGER,
) -> DataFrame:
    """The streaming DataFrame of (``topic``, ``payload``) rows the query publishes.

    ``watermark`` (default ``2 seconds``) is how far behind the latest ``ts`` seen a message
    may still arrive and be counted; a window is published once the watermark passes its end.
    """
    from pyspark.sql import functions as F

    messages = (
        spark.readStream.schema(MESSAGES_SCHEMA)
        .option("maxFilesPerTrigger", max_files_per_trigger)
        # segments only: a foreign file in the directory is not even listed
        .option("pathGlobFilter", "seg-*.parquet")
        # the date=YYYY-MM-DD directories are not read as a partition column: the query does
        # not need it, and inferring it fails the query ("Invalid batch") when the first
        # date directory appears after it started on an empty journal
        .option("recursiveFileLookup", "true")
        # and a truncated or corrupt segment is skipped, not fatal to the query
        .option("ignoreCorruptFiles", "true")
        .parquet(str(Path(journal_dir, "messages")))
    )
    counted = (
        (F.col("kind") == "mcast")
        & F.col("topic").rlike(PUBLISHABLE_TOPIC)
        & ~F.col("topic").startswith(STATS_PREFIX)
        # a cluster's message counts once, on the node it was published on (a directory
        # several nodes write into holds the other nodes' rows of it too)
        & F.col("origin_node").isNull()
    )
    # Every journal row must move the watermark on, so the rows not counted are not filtered
    # out before the aggregation: Spark's optimizer would push such a filter below the
    # watermark. They count as 0 instead, and the groups with nothing counted are dropped
    # after it (a filter on an aggregate stays where it is).
    counts = (
        messages.withWatermark("ts", watermark)
        .groupBy(F.window("ts", window), F.col("topic"))
        .agg(F.sum(F.when(counted, F.coalesce("count", F.lit(1))).otherwise(0)).alias("count"))
        .where(F.col("count") > 0)
    )
    start, end = F.col("window.start"), F.col("window.end")
    length = end.cast("double") - start.cast("double")
    payload = F.struct(
        start.alias("window_start"),
        end.alias("window_end"),
        F.col("count").alias("messages"),
        F.round(F.col("count") / length, 3).alias("rate"),
    )
    return counts.select(
        F.concat(F.lit(TOPIC_PREFIX), F.col("topic")).alias("topic"),
        F.to_json(payload, _JSON_OPTIONS).alias("payload"),
    )


def run_stream(
    spark: SparkSession,
    journal_dir: str | os.PathLike[str],
    broker: str,
    window: str = "10 seconds",
    checkpoint: str | os.PathLike[str] | None = None,
    trigger: Mapping[str, Any] | None = None,
    *,
    watermark: str = seconds(DEFAULT_WATERMARK),
    identity: str | None = None,
    max_files_per_trigger: int = MAX_FILES_PER_TRIGGER,
    query_name: str | None = None,
    login: BrokerLogin | None = None,
) -> StreamingQuery:
    """Start the stats query; returns the running :class:`StreamingQuery`.

    ``broker`` is ``HOST:PORT`` (SSMP). ``checkpoint`` (default ``JOURNAL_DIR/.stream-checkpoint``)
    is where Spark keeps its offsets and the sink its last published batch id: restarting
    with the same one resumes without publishing a batch twice. ``trigger`` takes
    :meth:`DataStreamWriter.trigger`'s keywords (default ``{"processingTime": "1 seconds"}``;
    ``{"availableNow": True}`` processes what is there and stops). ``login`` is how the sink
    logs in (default: ``identity``, or ``spark-stats``, with the ``open`` scheme).
    """
    from .datasource import NAME, register

    register(spark)
    checkpoint = checkpoint or Path(journal_dir, CHECKPOINT_NAME)
    writer = (
        stats(spark, journal_dir, window, watermark, max_files_per_trigger)
        .writeStream.format(NAME)
        .outputMode("append")
        .option("broker", broker)
        # as an option (not start()'s argument) so that the sink sees it: its state file
        # goes beside Spark's offsets
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"processingTime": seconds(DEFAULT_TRIGGER)}))
    )
    if identity:
        writer = writer.option("identity", identity)
    for name, value in (login.options() if login is not None else {}).items():
        writer = writer.option(name, value)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()


# -- command line ---------------------------------------------------------------------------


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    return value


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``stream`` action's arguments (and ``--master`` unless the parser has it already);
    sets ``action_run`` to :func:`main`."""
    parser.add_argument("journal_dir", metavar="JOURNAL_DIR", type=Path)
    parser.add_argument(
        "--broker",
        metavar="HOST:PORT",
        default="127.0.0.1:4444",
        help="the broker's SSMP listener (default 127.0.0.1:4444)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="DIR",
        type=Path,
        help=f"Spark's checkpoint and the sink's state (default JOURNAL_DIR/{CHECKPOINT_NAME})",
    )
    parser.add_argument(
        "--window",
        metavar="SECONDS",
        type=_positive,
        default=DEFAULT_WINDOW,
        help=f"tumbling window length (default {DEFAULT_WINDOW:g})",
    )
    parser.add_argument(
        "--trigger",
        metavar="SECONDS",
        type=_positive,
        default=DEFAULT_TRIGGER,
        help=f"how often to look for new segments (default {DEFAULT_TRIGGER:g})",
    )
    parser.add_argument(
        "--watermark",
        metavar="SECONDS",
        type=_non_negative,
        default=DEFAULT_WATERMARK,
        help="how late a message may be and still count; delays each window's publication "
        f"by as much (default {DEFAULT_WATERMARK:g})",
    )
    login = parser.add_argument_group("login (as every client's; see msgbroker ssmp --help)")
    login.add_argument(
        "--id", "--identity", dest="identity", metavar="ID", default=None,
        help="identity to log in as [spark-stats; with the cert scheme CN/spark-stats]",
    )  # fmt: skip
    from msgbroker.clientkit import cli as kit

    for option in (*kit.LOGIN, *kit.TLS_FILES, kit.tls()):
        option.add_to(login)
    if "--master" not in parser._option_string_actions:
        parser.add_argument(
            "--master", metavar="URL", default="local[*]", help="Spark master (default local[*])"
        )
    parser.set_defaults(action_run=main)


def broker_login(args: argparse.Namespace) -> BrokerLogin:
    """The sink's login from the command line: the clients' options and defaults."""
    from msgbroker.clientkit import cli as kit

    from .datasource import DEFAULT_IDENTITY, BrokerLogin, SinkError

    scheme = kit.login_scheme(args)
    identity = args.identity or kit.default_identity(args, scheme, DEFAULT_IDENTITY)
    login = BrokerLogin(
        identity, args.scheme, args.secret_file, args.tls, args.ca, args.cert, args.key
    )
    try:
        login.check()
    except SinkError as e:
        raise CommandError(str(e)) from None
    return login


def _check_broker(broker: str, login: BrokerLogin) -> None:
    """Fail now, in one line, rather than at the first micro-batch's commit."""
    from msgbroker.plugins.ssmp.client import SSMPError

    from .datasource import SinkError, parse_broker

    try:
        host, port = parse_broker(broker)
        login.connect(host, port, timeout=5.0).close()
    except SinkError as e:
        raise CommandError(str(e)) from None
    except SSMPError as e:
        raise CommandError(
            f"{broker} refused the login as {login.identity!r} with scheme "
            f"{login.login_scheme!r}: {e}"
        ) from None
    except ssl.SSLError as e:
        raise CommandError(f"TLS with {broker} failed: {e.reason or e}") from None
    except (OSError, TimeoutError) as e:
        raise CommandError(f"cannot connect to the broker at {broker}: {e}") from None


def main(args: argparse.Namespace) -> int:
    """Run the stats query until interrupted (Ctrl-C, SIGTERM) or it fails."""
    from .spark import require_spark_extra, start_spark

    require_spark_extra()  # before the import of pyspark below
    if not Path(args.journal_dir).is_dir():
        raise CommandError(f"{args.journal_dir} is not a directory")
    login = broker_login(args)
    _check_broker(args.broker, login)
    from pyspark.errors import StreamingQueryException

    spark = start_spark(args.master)
    try:
        query = run_stream(
            spark,
            args.journal_dir,
            args.broker,
            window=seconds(args.window),
            checkpoint=args.checkpoint,
            trigger={"processingTime": seconds(args.trigger)},
            watermark=seconds(args.watermark),
            login=login,
        )
        sys.stderr.write(
            f"msgbroker analytics: streaming {Path(args.journal_dir, 'messages')} to "
            f"{args.broker} as {TOPIC_PREFIX}<topic> (window {args.window:g} s; logged in "
            f"as {login.identity} with {login.login_scheme}{' over TLS' * login.uses_tls})\n"
        )
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        except StreamingQueryException as e:
            # Spark's message is a page (plan, offsets); its first line says what failed
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CommandError(f"the streaming query failed: {first}") from None
        return 0
    finally:
        spark.stop()
