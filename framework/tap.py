"""``twistd msgbroker``: command-line options and ``makeService``.

Like twisted.words' tap: :class:`Options` parses, :func:`makeService` builds; the global
reactor is never imported at module level.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.python import usage

from .config import build_config
from .errors import ConfigError
from .service import BrokerService


class BrokerOptions(usage.Options):
    """The options, raising :class:`usage.UsageError` for bad input (what tests use)."""

    synopsis = "[options]"
    longdesc = (
        "Run msgbroker. With no options: every protocol on its default loopback port, "
        "open login for loopback peers only."
    )
    optParameters = [
        ["config", "c", None, "TOML configuration file (same keys as these options)."],
        ["secret-file", None, None, "File holding the shared secret of the secret scheme."],
        ["tls-cert", None, None, "Server certificate (PEM) for TLS listeners."],
        ["tls-key", None, None, "Server private key (PEM) for TLS listeners."],
        ["tls-ca", None, None, "CA certificate(s) (PEM) that client certificates must chain to."],
        ["login-timeout", None, None, "Seconds a connection may take to log in [10]."],
        ["keepalive", None, None, "Seconds of silence before the broker pings [30]."],
        [
            "max-backlog",
            None,
            None,
            "Bytes queued for a slow consumer before the policy applies [16M].",
        ],
        ["slow-consumer", None, None, "Policy past the backlog: disconnect or drop [disconnect]."],
        ["journal", None, None, "Write the journal of routed messages and sessions there."],
        ["journal-rotate-seconds", None, None, "Close a journal segment after this long [10]."],
        ["journal-rotate-bytes", None, None, "Close a journal segment at about this size [64M]."],
        [
            "journal-max-records",
            None,
            None,
            "Records held in memory before new ones are dropped and counted [1000000].",
        ],
    ]
    optFlags = [["journal-payloads", None, "Keep payload bytes in the journal."]]

    def __init__(self) -> None:
        super().__init__()
        self["listen"] = []
        self["auth"] = []
        self["plugin"] = []
        self["no-plugin"] = []

    def opt_listen(self, value: str) -> None:
        """PROTOCOL=ENDPOINT to listen on, repeatable (e.g. ssmp=tcp:4444:interface=127.0.0.1,
        ssmp=tls:4443)."""
        self["listen"].append(value)

    def opt_auth(self, value: str) -> None:
        """Enable an auth scheme, repeatable: open, secret, cert, or a plugin's."""
        self["auth"].append(value)

    def opt_plugin(self, value: str) -> None:
        """Load a plugin module by import name, repeatable."""
        self["plugin"].append(value)

    def opt_no_plugin(self, value: str) -> None:
        """Block a plugin by name, repeatable."""
        self["no-plugin"].append(value)

    def postOptions(self) -> None:
        overrides = {
            key: self[key]
            for key in (
                "listen",
                "auth",
                "plugin",
                "no-plugin",
                "secret-file",
                "tls-cert",
                "tls-key",
                "tls-ca",
                "login-timeout",
                "keepalive",
                "max-backlog",
                "slow-consumer",
                "journal",
                "journal-rotate-seconds",
                "journal-rotate-bytes",
                "journal-max-records",
            )
            if self[key] not in (None, [])
        }
        if self["journal-payloads"]:
            overrides["journal-payloads"] = True
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
    try:
        broker_service = BrokerService(options.config, reactor)
        broker_service.exit_on_error = isinstance(options, Options)
        return broker_service
    except ConfigError as e:
        if isinstance(options, Options):
            sys.stderr.write(f"twistd msgbroker: error: {e}\n")
            raise SystemExit(2) from None
        raise
