"""``msgbroker`` sub-commands as plugins add them (``msgbroker_register_commands``).

A command is a module (or any object) with:

- ``NAME`` (the sub-command, e.g. ``"ssmp"``) and ``HELP`` (one line);
- ``add_arguments(parser)``: add its options and actions to its ``argparse`` sub-parser;
- ``run(args) -> int``: do it and return the exit status; raise
  :class:`msgbroker.cli.CommandError` for anything the user should be told in one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Protocol

from attrs import frozen

#: where a command goes in ``msgbroker --help`` when its plugin does not say
DEFAULT_ORDER = 100


class Command(Protocol):
    """What ``register`` takes: a module (``plugins/ssmp/cli.py`` is one) or an object."""

    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class RegisterCommand(Protocol):
    """The ``register`` of ``msgbroker_register_commands``."""

    def __call__(self, command: Command, order: int = DEFAULT_ORDER) -> None: ...


@frozen
class RegisteredCommand:
    """A command, where ``--help`` lists it, and the plugin that registered it."""

    command: Command
    order: int
    plugin: str

    @property
    def name(self) -> str:
        return self.command.NAME


def problem(command: object) -> str | None:
    """What ``command`` lacks of the contract, or None."""
    lacking = [
        attribute
        for attribute, check in _CONTRACT.items()
        if not check(getattr(command, attribute, None))
    ]
    if lacking:
        return f"{command!r} is no command: it lacks {', '.join(lacking)}"
    return None


_CONTRACT: dict[str, Callable[[object], bool]] = {
    "NAME": lambda value: isinstance(value, str) and bool(value),
    "HELP": lambda value: isinstance(value, str),
    "add_arguments": callable,
    "run": callable,
}
