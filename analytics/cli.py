"""``msgbroker analytics ...``: the PySpark jobs over the broker's journal.

::

    msgbroker analytics report /var/lib/msgbroker/journal --out report/
    msgbroker analytics report /srv/journals/db1 /srv/journals/db2 --out report/  # a cluster
    msgbroker analytics report JOURNAL --out report/ --since 2026-11-22T08:00 --until 2026-11-23
    msgbroker analytics report JOURNAL --out report/ --master spark://head:7077
    msgbroker analytics prepare         # once: the class-data archive, for faster start-up

Needs the ``spark`` extra (``pip install 'msgbroker[spark]'``) and Java 17. Each action is
a ``_run_<action>`` function below and a sub-parser in :func:`add_arguments`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import threading
from pathlib import Path

from msgbroker.cli import CommandError

from . import stream
from .plugin import COMMAND as REGISTERED
from .spark import require_spark_extra, start_spark
from .stream import add_stream_arguments

NAME = REGISTERED.NAME
HELP = REGISTERED.HELP


def _time(text: str) -> dt.datetime:
    from .report import parse_time

    try:
        return parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 date or time (2026-11-22, 2026-11-22T08:30, "
            "2026-11-22T08:30:00+01:00)"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    report = actions.add_parser(
        "report",
        help="aggregate the journal into Parquet tables and an HTML report with charts",
        description="Aggregate JOURNAL_DIR into REPORT_DIR/tables/<name>/ (Parquet) and "
        "REPORT_DIR/index.html (with PNG charts). Several JOURNAL_DIRs (the nodes of a "
        "cluster; or one directory holding a journal per subdirectory) make one report, "
        "cluster-wide and per node.",
    )
    report.add_argument("journal_dir", metavar="JOURNAL_DIR", type=Path, nargs="+")
    report.add_argument("--out", metavar="REPORT_DIR", type=Path, required=True)
    _spark_arguments(report)
    report.add_argument(
        "--since",
        metavar="ISO",
        type=_time,
        help="only rows at or after this time (UTC if no zone)",
    )
    report.add_argument(
        "--until", metavar="ISO", type=_time, help="only rows before this time (UTC if no zone)"
    )
    report.set_defaults(action_run=_run_report)

    prepare = actions.add_parser(
        "prepare",
        help="build the class-data archive that halves the Spark driver's start-up",
        description="Build a HotSpot class-data (CDS) archive of Spark's classes for this Java "
        "and PySpark in ${XDG_CACHE_HOME:-~/.cache}/msgbroker/spark-cds/ (about a minute); "
        "every later Spark session maps it (MSGBROKER_SPARK_CDS=off: not).",
    )
    prepare.add_argument(
        "--force", action="store_true", help="build it again even when it is there"
    )
    prepare.set_defaults(action_run=_run_prepare)

    # `stream`: Structured Streaming over the growing journal, back into the broker
    add_stream_arguments(
        actions.add_parser("stream", help=stream.HELP, description=stream.DESCRIPTION)
    )


def _spark_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every Spark action takes."""
    parser.add_argument(
        "--master",
        metavar="URL",
        default="local[*]",
        help="Spark master: local[*] (default, all cores here), spark://HOST:7077, yarn, ...",
    )


def run(args: argparse.Namespace) -> int:
    status: int = args.action_run(args)
    return status


def _running_spark() -> bool:
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None


def _run_prepare(args: argparse.Namespace) -> int:
    require_spark_extra()
    from . import classcache
    from .java import JavaMissing

    try:
        done = classcache.prepare(force=args.force)
    except (JavaMissing, classcache.PrepareFailed) as e:
        raise CommandError(str(e))
    except OSError as e:
        raise CommandError(f"cannot write the class-data archive: {e}")
    size = f"{done.size / 2**20:.0f} MB"
    if done.built:
        print(f"prepared {done.path} ({size}) in {done.seconds:.0f} s")
    else:
        print(f"already prepared: {done.path} ({size})")
    if done.removed:
        count = len(done.removed)
        print(
            f"removed {count} old class-data archive{'s' if count > 1 else ''} "
            f"({done.removed_bytes / 2**20:.0f} MB)"
        )
    return 0


def _preload() -> None:
    # only a head start: drawing imports the same again, on the report's own path, where a
    # failure (a broken matplotlib) is reported, so a thread's traceback would only repeat it
    with contextlib.suppress(Exception):
        from . import charts  # pyarrow and matplotlib: only for a report

        charts.preload()


def _stage(text: str) -> None:
    """What the report is doing now, on stderr (it runs for a while, mostly in Spark)."""
    sys.stderr.write(f"msgbroker analytics: {text} ...\n")
    sys.stderr.flush()


def _run_report(args: argparse.Namespace) -> int:
    for journal_dir in args.journal_dir:
        if not journal_dir.is_dir():
            raise CommandError(f"{journal_dir} is not a directory")
    if args.since and args.until and args.since >= args.until:
        raise CommandError("--since must be before --until")
    require_spark_extra()  # before the preload thread imports any of it
    # stop Spark afterwards only if this command started it
    ours = not _running_spark()
    # what drawing imports loads meanwhile (the JVM starts in another process)
    threading.Thread(target=_preload, name="preload", daemon=True).start()
    from .java import JavaMissing, check_java

    try:
        check_java()  # before the first stage: without Java, the error is the only line
    except JavaMissing as e:
        raise CommandError(str(e)) from None
    _stage(f"starting Spark ({args.master})" if ours else "using the running Spark")
    spark = start_spark(args.master, sql=False)
    from .report import SkippedFile, run_report

    def report_skip(item: SkippedFile) -> None:
        sys.stderr.write(f"msgbroker analytics: {item}\n")

    try:
        report = run_report(
            spark,
            args.journal_dir,
            args.out,
            since=args.since,
            until=args.until,
            on_skip=report_skip,
            on_stage=_stage,
        )
    finally:
        if ours:
            _stage("stopping Spark")
            spark.stop()
    summary = report.tables["summary"].to_pylist()[0]
    nodes = f", {summary['nodes']:,} nodes" if summary["nodes"] > 1 else ""
    print(
        f"report: {report.index} ({summary['messages']:,} messages, "
        f"{summary['sessions']:,} sessions{nodes}; tables in {report.out_dir / 'tables'})"
    )
    return 0
