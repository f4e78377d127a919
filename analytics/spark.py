"""Starting Spark for the analytics jobs, with one-line errors: the spark extra checked
before anything imports it, then a SparkSession or SparkContext. Used by the command line
(:mod:`.cli`) and by the stream job (:mod:`.stream`), which the command line imports."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Literal, overload

from msgbroker.cli import CommandError

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

#: what the spark extra adds that the jobs import (pyarrow is the broker's own dependency)
SPARK_EXTRA = ("pyspark", "pandas", "matplotlib")


def require_spark_extra() -> None:
    """:class:`CommandError`, one line, unless every module of the spark extra is installed.

    Called before anything imports them: the report starts importing matplotlib on a thread
    at once, and a failure there printed that thread's traceback before the error line.
    The modules are looked up, not imported (that is a second's work the jobs do later,
    overlapping the JVM's start)."""
    for name in SPARK_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # a finder that refuses the name outright
            found = False
        if not found:
            raise CommandError(
                f"the spark extra is not installed (No module named {name!r}): "
                "pip install 'msgbroker[spark]'"
            )


@overload
def start_spark(master: str) -> SparkSession: ...
@overload
def start_spark(master: str, sql: Literal[False]) -> SparkContext: ...
def start_spark(master: str, sql: bool = True) -> SparkSession | SparkContext:
    """A SparkSession for ``master`` (with ``sql=False``, a bare SparkContext, quicker to
    start), or :class:`CommandError` with one line for a missing extra or a missing Java.
    One already running in this process (a notebook, the tests) is returned as it is,
    ``master`` aside."""
    from .java import JavaMissing
    from .session import start_context, start_session

    require_spark_extra()
    try:
        import pyspark  # noqa: F401
    except ImportError as e:  # there, but broken
        raise CommandError(f"cannot import pyspark ({e}): pip install 'msgbroker[spark]'")
    try:
        return start_session(master) if sql else start_context(master)
    except JavaMissing as e:
        raise CommandError(str(e))
