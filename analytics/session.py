"""Starting Spark for the jobs: the Java check and the SparkSession settings.

PySpark starts a JVM through ``spark-submit``; without Java it fails with a page of shell
and Py4J errors. :func:`check_java` looks first and raises :class:`JavaMissing`, one line
saying what to install, which the command line prints as its only error line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
APP_NAME = "msgbroker-analytics"

JAVA_MISSING = (
    "Java 17 is needed to run Spark and none was found (no JAVA_HOME, no java on PATH): "
    "install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
)

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


class JavaMissing(Exception):
    """No usable Java: the message says what to install."""

    def __init__(self, message: str = JAVA_MISSING) -> None:
        super().__init__(message)


def find_java() -> str | None:
    """The ``java`` Spark's launcher will run: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home, "bin", "java")
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def check_java() -> str:
    """The java executable, or :class:`JavaMissing` (a set but empty JAVA_HOME counts as none,
    as it does for ``spark-submit``)."""
    java = find_java()
    if java is None:
        raise JavaMissing
    return java


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
        # results come back to the driver as Arrow tables (DataFrame.toArrow)
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # the footer check (journal_files) catches truncated and foreign files; this covers a
        # segment whose footer is intact but whose data pages are not
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


def start_session(master: str = DEFAULT_MASTER, quiet: bool = True, **extra: Any) -> SparkSession:
    """A SparkSession for ``master`` (``local[*]``, ``spark://HOST:7077``, ``yarn`` ...).

    Checks for Java first (:class:`JavaMissing`). ``quiet`` keeps Spark's start-up chatter off
    stderr (unless ``SPARK_CONF_DIR`` is set: then its logging configuration wins).
    ``extra`` settings override :func:`session_config`.
    """
    check_java()
    from pyspark.sql import SparkSession

    if is_local(master):
        # local Python workers (the streaming sink, any UDF) must import msgbroker: run them
        # on this interpreter, not whatever `python3` is first on PATH (read at start only)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = SparkSession.builder
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
    config["spark.driver.extraJavaOptions"] = " ".join(o for o in java_options if o)
    for key, value in config.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    finally:
        if log_config is not None:
            log_config.unlink(missing_ok=True)
