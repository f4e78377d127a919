"""``twistd msgbroker``: command-line options and ``makeService``.

Like twisted.words' tap: :class:`Options` parses, :func:`makeService` builds; the global
reactor is never imported at module level. The options are made from
:data:`msgbroker.config.OPTIONS`, the one list of settings the TOML file shares.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.python import usage

from .config import OPTIONS, build_config
from .errors import ConfigError
from .service import BrokerService


def _repeatable(name: str, doc: str) -> Any:
    def opt(self: BrokerOptions, value: str) -> None:
        self[name].append(value)

    opt.__doc__ = doc
    return opt


class BrokerOptions(usage.Options):
    """The options, raising :class:`usage.UsageError` for bad input (what tests use)."""

    synopsis = "[options]"
    longdesc = (
        "Run msgbroker. With no options: every protocol on its default loopback port, "
        "open login for loopback peers only."
    )
    optParameters = [
        ["config", "c", None, "TOML configuration file (same keys as these options)."],
        *([o.name, None, None, o.help] for o in OPTIONS if o.kind not in ("list", "bool")),
    ]
    optFlags = [[o.name, None, o.help] for o in OPTIONS if o.kind == "bool"]

    def __init__(self) -> None:
        super().__init__()
        for option in OPTIONS:
            if option.kind == "list":
                self[option.name] = []

    for _option in OPTIONS:
        if _option.kind == "list":
            locals()["opt_" + _option.name.replace("-", "_")] = _repeatable(
                _option.name, _option.help
            )
    del _option

    def postOptions(self) -> None:
        overrides: dict[str, Any] = {}
        for o in OPTIONS:
            value = self[o.name]
            if o.kind == "bool":
                if value:  # a flag given on the command line
                    overrides[o.name] = True
            elif value not in (None, []):
                overrides[o.name] = value
        try:
            self.config = build_config(self["config"], overrides)
        except ConfigError as e:
            raise usage.UsageError(str(e)) from None


class Options(BrokerOptions):
    """The options ``twistd`` uses: a bad option or configuration prints one line saying
    what is wrong (not the whole usage text) and exits with status 2."""

    def parseOptions(self, options: Any = None) -> None:
        try:
            super().parseOptions(options)
        except usage.UsageError as e:
            sys.stderr.write(f"twistd msgbroker: error: {e}\n")
            raise SystemExit(2) from None


def makeService(options: BrokerOptions, reactor: Any = None) -> BrokerService:
    if isinstance(options, Options):  # twistd: filter what it is about to log
        from .logs import filter_twistd_logging

        filter_twistd_logging(options.config.log_level)
    try:
        broker_service = BrokerService(options.config, reactor)
        broker_service.exit_on_error = isinstance(options, Options)
        return broker_service
    except ConfigError as e:
        if isinstance(options, Options):
            sys.stderr.write(f"twistd msgbroker: error: {e}\n")
            raise SystemExit(2) from None
        raise
