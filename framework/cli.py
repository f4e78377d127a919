"""The ``msgbroker`` console command: ``msgbroker PROTOCOL ACTION ...``.

Each protocol's client commands live in a module listed in :data:`PROTOCOL_COMMANDS`; adding
a protocol (``msgbroker stmp ...``) means adding its module there. A module provides:

- ``NAME`` (the sub-command, e.g. ``"ssmp"``) and ``HELP`` (one line);
- ``add_arguments(parser)``: add its options and actions to its ``argparse`` sub-parser;
- ``run(args) -> int``: do it and return the exit status.

``run`` raises :class:`CommandError` for anything the user should be told in one line
(connection refused, login refused, ...): ``main`` prints ``msgbroker: error: ...`` on stderr
and exits with status 1. Ctrl-C ends any command without a traceback (status 130, unless
the command handles it itself, like ``sub``, which exits 0).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .errors import MsgbrokerError

#: modules providing ``msgbroker PROTOCOL ...`` commands, in the order ``--help`` lists them
PROTOCOL_COMMANDS = (
    "msgbroker.plugins.ssmp.cli",
    "msgbroker.plugins.stmp.cli",
    "msgbroker.plugins.mm2.cli",
    "msgbroker.plugins.sbus.cli",
    "msgbroker.analytics.cli",
)

PROG = "msgbroker"


class CommandError(MsgbrokerError):
    """What went wrong, in one line for the user; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Command-line clients for msgbroker "
        "(run the broker itself with `twistd -n msgbroker`).",
        epilog="Example, from two terminals: `msgbroker ssmp sub news` and "
        "`msgbroker ssmp pub news hello`.",
    )
    commands = parser.add_subparsers(dest="protocol", metavar="PROTOCOL", required=True)
    for module_name in PROTOCOL_COMMANDS:
        module = importlib.import_module(module_name)
        sub = commands.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``msgbroker`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
    except CommandError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return e.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`msgbroker ssmp sub t | head -1`)
        _silence_stdout()
        return 0
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
