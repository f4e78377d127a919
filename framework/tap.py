"""``twistd msgbroker``: command-line options and ``makeService``.

Like twisted.words' tap: the options parse, :func:`makeService` builds; the global reactor
is never imported at module level. The options are made from
:data:`msgbroker.config.OPTIONS`, the one list of the broker's settings the TOML file
shares, and from the plugins' configuration sections (``--journal ...``): the options class
twistd uses is built when twistd asks for it (:func:`twistd_options`, from the dropin in
``twisted/plugins``), from the installed plugins' declarations.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from attrs import evolve
from twisted.python import usage

from .broker import Broker
from .config import OPTIONS, Option, build_config
from .errors import ConfigError
from .sections import ConfigSection
from .service import BrokerService


def _repeatable(name: str, doc: str) -> Any:
    def opt(self: BrokerOptions, value: str) -> None:
        self[name].append(value)

    opt.__doc__ = doc
    return opt


def _table(options: Sequence[tuple[str, Option]]) -> dict[str, Any]:
    """The usage.Options class attributes for ``options`` (flag, option): parameters,
    flags, and an ``opt_`` method per repeatable option."""
    attributes: dict[str, Any] = {
        "optParameters": [
            [flag, None, None, o.help] for flag, o in options if o.kind not in ("list", "bool")
        ],
        "optFlags": [[flag, None, o.help] for flag, o in options if o.kind == "bool"],
    }
    for flag, o in options:
        if o.kind == "list":
            attributes["opt_" + flag.replace("-", "_")] = _repeatable(flag, o.help)
    return attributes


class BrokerOptions(usage.Options):
    """The broker's own options, raising :class:`usage.UsageError` for bad input (what
    tests use). :func:`options_class` adds the plugins' options to it."""

    synopsis = "[options]"
    longdesc = (
        "Run msgbroker. With no options: every protocol on its default loopback port, "
        "open login for loopback peers only."
    )
    #: the plugins' sections whose options this class has (see :func:`options_class`)
    sections: tuple[ConfigSection[Any], ...] = ()
    #: a twistd run: a bad option prints one line and exits 2
    twistd = False

    _own = _table([(o.name, o) for o in OPTIONS])
    optParameters = [
        ["config", "c", None, "TOML configuration file (same keys as these options)."],
        *_own["optParameters"],
    ]
    optFlags = _own["optFlags"]
    locals().update({name: value for name, value in _own.items() if name.startswith("opt_")})
    del _own

    def __init__(self) -> None:
        super().__init__()
        for flag, option in self._all_options():
            if option.kind == "list":
                self[flag] = []

    def _all_options(self) -> list[tuple[str, Option]]:
        plugin_options = [(s.flag(o), o) for s in self.sections for o in s.options]
        return [(o.name, o) for o in OPTIONS] + plugin_options

    def postOptions(self) -> None:
        from .hooks import declared_sections

        overrides: dict[str, Any] = {}
        for flag, option in self._all_options():
            value = self[flag]
            if option.kind == "bool":
                if value:  # a flag given on the command line
                    overrides[flag] = True
            elif value not in (None, []):
                overrides[flag] = value
        #: the command line's settings, which a reload applies over the file again
        self.overrides = overrides
        try:
            self.config = build_config(self["config"], overrides, declared_sections)
        except ConfigError as e:
            raise usage.UsageError(str(e)) from None

    def opt_version(self) -> None:
        """Print msgbroker's version (and Twisted's and Python's) and exit."""
        from .cli import version_line

        sys.stdout.write(version_line() + "\n")
        raise SystemExit(0)

    def parseOptions(self, options: Any = None) -> None:
        if not self.twistd:
            super().parseOptions(options)
            return
        try:
            super().parseOptions(options)
        except usage.UsageError as e:
            sys.stderr.write(f"twistd msgbroker: error: {e}\n")
            raise SystemExit(2) from None


def options_class(
    sections: Sequence[ConfigSection[Any]], twistd: bool = False
) -> type[BrokerOptions]:
    """:class:`BrokerOptions` with the options of ``sections`` (``--journal`` ...); for
    ``twistd``, one that prints a bad option or configuration in one line (not the whole
    usage text) and exits with status 2."""
    # the help says where the option goes in the file: "... ([journal] rotate-seconds)"
    plugin_options = [
        (s.flag(o), evolve(o, help=f"{o.help} ([{s.name}] {o.name})"))
        for s in sections
        for o in s.options
    ]
    attributes = _table(plugin_options)
    attributes.update(sections=tuple(sections), twistd=twistd, __doc__=BrokerOptions.__doc__)
    return type("Options", (BrokerOptions,), attributes)


def twistd_options() -> type[BrokerOptions]:
    """The options class twistd uses: the broker's options and those of the installed
    plugins (the entry points; a ``--plugin`` module's options go in its TOML section). A
    broken plugin is left out here; the broker reports it when it is built."""
    from .hooks import Plugins

    plugins = Plugins.load(on_error=lambda name, message: None)
    try:
        sections = plugins.config_sections()
    except ConfigError:
        sections = ()  # reported, in one line, when the configuration is read
    return options_class(sections, twistd=True)


def makeService(
    options: BrokerOptions, reactor: Any = None, broker_class: type[Broker] = Broker
) -> BrokerService:
    """The broker service for ``options``. A custom server (a :class:`Broker` subclass)
    passes its class from its own twistd plugin's ``makeService`` (examples/custom-server)."""
    if options.twistd:  # filter what it is about to log
        from .logs import filter_twistd_logging

        filter_twistd_logging(options.config.log_level, options.config.log_format)
        if reactor is None:  # twistd installs a reactor only when --reactor chose one
            from .reactor import install

            install()
    try:
        broker_service = BrokerService(options.config, reactor, broker_class)
        broker_service.exit_on_error = options.twistd
        broker_service.freeze_heap = options.twistd
        broker_service.config_file = options["config"]
        broker_service.overrides = getattr(options, "overrides", None)
        return broker_service
    except ConfigError as e:
        if options.twistd:
            sys.stderr.write(f"twistd msgbroker: error: {e}\n")
            raise SystemExit(2) from None
        raise
