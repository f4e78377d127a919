"""The ``msgbroker`` console command: ``msgbroker COMMAND ...``.

The commands come from plugins, through ``msgbroker_register_commands``: each protocol
plugin registers its client (``msgbroker ssmp ...``), the analytics plugin ``msgbroker
analytics``, a third-party plugin its own. A command is a module (or object) providing (see
:class:`msgbroker.commands.Command`):

- ``NAME`` (the sub-command, e.g. ``"ssmp"``) and ``HELP`` (one line);
- ``add_arguments(parser)``: add its options and actions to its ``argparse`` sub-parser;
- ``run(args) -> int``: do it and return the exit status.

``msgbroker plugins`` (the framework's own) lists the installed plugins.

``run`` raises :class:`CommandError` for anything the user should be told in one line
(connection refused, login refused, ...): ``main`` prints ``msgbroker: error: ...`` on stderr
and exits with status 1. Ctrl-C ends any command without a traceback (status 130, unless
the command handles it itself, like ``sub``, which exits 0). A broken plugin (one that does
not load, or whose command does not build) costs one ``msgbroker: warning: ...`` line on
stderr, not the other commands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import MsgbrokerError

if TYPE_CHECKING:
    from .commands import RegisteredCommand
    from .hooks import Plugins

PROG = "msgbroker"


class CommandError(MsgbrokerError):
    """What went wrong, in one line for the user; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def version_line() -> str:
    """``msgbroker 0.1.0 (Twisted 24.11.0, Python 3.11.2)``: the installed distribution's
    version, and what it runs on."""
    import platform
    from importlib import metadata

    try:
        mine = metadata.version("msgbroker")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        mine = "unknown"
    try:
        twisted = metadata.version("twisted")
    except metadata.PackageNotFoundError:
        twisted = "unknown"
    return f"{PROG} {mine} (Twisted {twisted}, Python {platform.python_version()})"


class _Version(argparse.Action):
    """``--version``, reading the version only when asked (every client starts quickly)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        sys.stdout.write(version_line() + "\n")
        parser.exit()


def _warn(plugin: str, message: str) -> None:
    sys.stderr.write(f"{PROG}: warning: {message} (left out)\n")


def load_plugins() -> Plugins:
    """The installed plugins, as the command line uses them: a broken one is reported on
    stderr in one line and left out."""
    from .hooks import Plugins

    return Plugins.load(on_error=_warn)


def build_parser(plugins: Plugins | None = None) -> argparse.ArgumentParser:
    """The parser of every command the plugins register (default: the installed ones),
    in their order, then ``plugins``."""
    plugins = plugins if plugins is not None else load_plugins()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Command-line clients for msgbroker "
        "(run the broker itself with `twistd -n msgbroker`).",
        epilog="Example, from two terminals: `msgbroker ssmp sub news` and "
        "`msgbroker ssmp pub news hello`.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser
    )
    registered = plugins.commands(on_error=_warn)
    for entry in registered:
        command = entry.command
        sub = subparsers.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        sub.set_defaults(run=command.run)
        sub.entry = entry
    listing = subparsers.add_parser("plugins", help=_PLUGINS_HELP, description=_PLUGINS_HELP)
    listing.set_defaults(run=lambda args: _list_plugins(plugins, registered))
    return parser


_PLUGINS_HELP = "list the installed plugins: name, distribution, hooks, commands, sections"


class _CommandParser(argparse.ArgumentParser):
    """A command's sub-parser. Its arguments are added (``add_arguments``, which imports a
    :class:`~msgbroker.commands.LazyCommand`'s module) only when the command line names this
    command, so a call pays for its own command's imports only."""

    entry: RegisteredCommand | None = None

    def complete(self) -> None:
        """Add the command's arguments, once; one that fails costs a warning line, and
        running it says it is broken."""
        entry, self.entry = self.entry, None
        if entry is None:
            return
        try:
            entry.command.add_arguments(self)
        except Exception as e:
            _warn(
                entry.plugin, f"plugin {entry.plugin!r}: the command {entry.name!r} failed: {e!r}"
            )
            self.set_defaults(run=_broken(entry.name))

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.complete()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.complete()
        return super().format_help()

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()


def _broken(name: str) -> object:
    def run(args: argparse.Namespace) -> int:
        raise CommandError(f"the command {name!r} is broken (see the warning above)")

    return run


def _list_plugins(plugins: Plugins, commands: Sequence[RegisteredCommand]) -> int:
    """``msgbroker plugins``: each plugin in registration order, what it implements and adds."""
    sections = plugins.config_sections_by_plugin()
    by_plugin: dict[str, list[str]] = {}
    for entry in commands:
        by_plugin.setdefault(entry.plugin, []).append(entry.name)
    out = sys.stdout
    for info in plugins.info():
        where = f"{info.distribution} {info.version}" if info.distribution else info.how
        out.write(f"{info.name} ({where}): {info.module}\n")
        details = (
            ("hooks", info.hooks),
            ("hookspecs", info.hookspecs),
            ("commands", by_plugin.get(info.name, ())),
            ("sections", [f"[{s.name}]" for s in sections.get(info.name, ())]),
        )
        for label, names in details:
            if names:
                out.write(f"  {label}: {', '.join(names)}\n")
    for name, problem in plugins.problems().items():
        out.write(f"{name} (broken): {problem}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``msgbroker`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    if list(sys.argv[1:] if argv is None else argv) == ["--version"]:
        sys.stdout.write(version_line() + "\n")  # without loading a plugin
        return 0
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
