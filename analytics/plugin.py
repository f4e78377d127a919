"""The analytics plugin: ``msgbroker analytics`` (entry point ``analytics``).

Only the command, registered lazily: its module (:mod:`.cli`) is imported only when the
command line runs ``msgbroker analytics``, and PySpark only when an action runs, so neither a
broker that loads this plugin nor any other ``msgbroker`` command pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.commands import LazyCommand

if TYPE_CHECKING:
    from msgbroker.commands import RegisterCommand




#: ``msgbroker analytics``: the jobs' command line (:mod:`.cli`) is imported only when it runs
COMMAND = LazyCommand(
    "analytics",
    (
        "PySpark jobs over the journal: an HTML/Parquet traffic report, and live per-topic rates "
        "published back into the broker (needs Java 17)"
    ),
    "msgbroker.analytics.cli",
)


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    register(COMMAND, order=90)
