"""Starting Spark for the jobs: the Java check and the SparkSession settings.

PySpark starts a JVM through ``spark-submit``; without Java it fails with a page of shell
and Py4J errors. :func:`check_java` looks first and raises :class:`JavaMissing`, one line
saying what to install, which the command line prints as its only error line.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

from .java import check_java

DEFAULT_MASTER = "local[*]"
APP_NAME = "msgbroker-analytics"

# Spark's own INFO/WARN lines at start-up (native-hadoop, default log level ...) say nothing
# to someone running a report; errors still show
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# pyspark counts as a shell: Spark moves the root level to this logger's (announcing it on
# stderr) unless the two agree
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def session_config(master: str) -> dict[str, str]:
    """The settings the jobs run with (see docs/analytics.md for why each one)."""
    config = {
        "spark.master": master,
        "spark.app.name": APP_NAME,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # DataFrame results come back to Python as Arrow (the streaming query's batches)
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # the footer check (journal_files) catches truncated and foreign files; for Spark's
        # own reader (the streaming query) this covers a segment whose footer is intact but
        # whose data pages are not (the report's tasks find and name those themselves)
        "spark.sql.files.ignoreCorruptFiles": "true",
    }
    if is_local(master):
        # 200 shuffle partitions of a few rows each cost more in task start-up than the
        # aggregation; locally a few per core is plenty
        cores = os.cpu_count() or 2
        config["spark.sql.shuffle.partitions"] = str(max(2, 2 * cores))
        config["spark.driver.host"] = "127.0.0.1"
        config["spark.driver.bindAddress"] = "127.0.0.1"
    return config


def _class_archive_option(config: dict[str, str]) -> str | None:
    """``-XX:SharedArchiveFile=...`` for the driver, or None: switched off, none prepared, the
    driver not on this machine (cluster deploy mode), or the settings choose their own."""
    from . import classcache

    if not classcache.enabled() or config.get("spark.submit.deployMode") == "cluster":
        return None
    own = config.get("spark.driver.extraJavaOptions", "")
    if "SharedArchiveFile" in own or "-Xshare" in own:
        return None
    archive = classcache.archive_for_current_setup()
    # the JVM checks the archive against its classpath and jars again and, when it does not
    # fit, runs without it and prints nothing (Java 17's -Xshare:auto)
    return None if archive is None else classcache.java_option(archive)


def start_session(master: str = DEFAULT_MASTER, quiet: bool = True, **extra: Any) -> SparkSession:
    """A SparkSession for ``master`` (``local[*]``, ``spark://HOST:7077``, ``yarn`` ...): the
    context of :func:`start_context` (its arguments and checks) with Spark SQL's session."""
    start_context(master, quiet, **extra)
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


def start_context(master: str = DEFAULT_MASTER, quiet: bool = True, **extra: Any) -> SparkContext:
    """A SparkContext for ``master``, without Spark SQL: what the report needs (its tasks
    are plain RDD tasks), and two seconds quicker to start than a session. An active
    context is returned as it is.

    Checks for Java first (:class:`JavaMissing`). ``quiet`` keeps Spark's start-up chatter off
    stderr (unless ``SPARK_CONF_DIR`` is set: then its logging configuration wins).
    ``extra`` settings override :func:`session_config`. The driver maps the class-data archive
    (:mod:`.classcache`) when one was prepared for this Java and PySpark, unless
    ``MSGBROKER_SPARK_CDS=off``.
    """
    check_java()
    from pyspark import SparkConf, SparkContext

    if is_local(master):
        # local Python workers (the report's tasks, the streaming sink) run this
        # interpreter, not whatever `python3` is first on PATH (read at start only)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    config = session_config(master)
    config.update({k: str(v) for k, v in extra.items()})
    log_config: Path | None = None
    java_options = [config.get("spark.driver.extraJavaOptions", "")]
    if quiet and "SPARK_CONF_DIR" not in os.environ:
        # the JVM reads it once, at start: the file is gone again when this returns
        fd, name = tempfile.mkstemp(prefix="msgbroker-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2)
        log_config = Path(name)
        java_options.append(f"-Dlog4j2.configurationFile=file:{log_config}")
    archive_option = _class_archive_option(config)
    if archive_option:
        java_options.append(archive_option)
    config["spark.driver.extraJavaOptions"] = " ".join(o for o in java_options if o)
    try:
        return SparkContext.getOrCreate(SparkConf().setAll(list(config.items())))
    finally:
        if log_config is not None:
            log_config.unlink(missing_ok=True)
