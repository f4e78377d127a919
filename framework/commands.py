"""``msgbroker`` sub-commands as plugins add them (``msgbroker_register_commands``).

A command is a module (or any object) with:

- ``NAME`` (the sub-command, e.g. ``"ssmp"``) and ``HELP`` (one line);
- ``add_arguments(parser)``: add its options and actions to its ``argparse`` sub-parser;
- ``run(args) -> int``: do it and return the exit status; raise
  :class:`msgbroker.cli.CommandError` for anything the user should be told in one line.

A plugin registers a :class:`LazyCommand` (the name, the help line and the module's dotted
path) rather than the module itself, so that ``msgbroker --help`` and every other command
start without importing it: the command line imports only the module of the command it runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Protocol

from attrs import frozen

#: where a command goes in ``msgbroker --help`` when its plugin does not say
DEFAULT_ORDER = 100


class Command(Protocol):
    """What ``register`` takes: a :class:`LazyCommand`, a module (``plugins/ssmp/cli.py`` is
    one) or any object with these."""

    @property
    def NAME(self) -> str: ...  # read-only: a module constant, or a LazyCommand field

    @property
    def HELP(self) -> str: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class RegisterCommand(Protocol):
    """The ``register`` of ``msgbroker_register_commands``."""

    def __call__(self, command: Command, order: int = DEFAULT_ORDER) -> None: ...


@frozen
class LazyCommand:
    """A command whose implementation, the module ``module`` (a :class:`Command`), is
    imported only when the command line runs this command: ``msgbroker --help`` and the
    other commands never import it, nor what it imports (PySpark, pyarrow, a client).

    ``NAME`` and ``HELP`` are given here, for ``--help``; a module that has a ``NAME`` of
    its own must have this one (checked when it is loaded)."""

    NAME: str
    HELP: str
    module: str

    def load(self) -> Command:
        """The module, imported now (once: Python keeps it); one whose ``NAME`` differs is a
        ``TypeError``."""
        implementation: Command = importlib.import_module(self.module)
        name = getattr(implementation, "NAME", self.NAME)
        if name != self.NAME:
            raise TypeError(f"{self.module} is the command {name!r}, not {self.NAME!r}")
        return implementation

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.load().add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        return self.load().run(args)


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
