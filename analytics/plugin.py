"""The analytics plugin: ``msgbroker analytics`` (entry point ``analytics``).

Only the command: its module is imported when the command line asks for it, and PySpark
only when an action runs, so a broker that loads this plugin pays nothing for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import hookimpl

if TYPE_CHECKING:
    from msgbroker.commands import RegisterCommand


@hookimpl
def msgbroker_register_commands(register: RegisterCommand) -> None:
    from . import cli

    register(cli, order=90)
