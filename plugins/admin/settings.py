"""The admin plugin's configuration section, ``[admin]``, and its command-line options.

::

    [admin]
    endpoint = "tcp:8090:interface=127.0.0.1"  # --admin ENDPOINT; none: no admin endpoint
    secret-file = "/etc/msgbroker/admin.secret" # --admin-secret-file; none: no API
    sys-interval = 10                          # --admin-sys-interval; 0: no _sys topics
    sample-seconds = 1                         # --admin-sample-seconds
    top-topics = 20                            # --admin-top-topics
    metrics-auth = false                       # --admin-metrics-auth
"""

from __future__ import annotations

from pathlib import Path

from attrs import frozen

from msgbroker import BrokerConfig, ConfigError, ConfigSection, Option

#: the name the running admin endpoint is registered under among the broker's plugins
ACTIVE = "admin.active"


@frozen
class AdminSettings:
    """Where the admin endpoint listens (``None``: nowhere, the plugin does nothing), the
    file holding the admin credential, how often the ``_sys`` topics are published and the
    broker is sampled, how many topics the metrics and the dashboard rank, and whether
    ``/metrics`` asks for the credential too."""

    endpoint: str | None = None
    secret_file: str | None = None
    sys_interval: float = 10.0
    sample_seconds: float = 1.0
    top_topics: int = 20
    metrics_auth: bool = False

    def __attrs_post_init__(self) -> None:
        if self.sys_interval < 0:
            raise ConfigError(f"admin-sys-interval must be 0 or more, not {self.sys_interval}")
        if not self.sample_seconds > 0:
            raise ConfigError(
                f"admin-sample-seconds must be positive, not {self.sample_seconds}"
            )
        if self.top_topics < 1:
            raise ConfigError(f"admin-top-topics must be at least 1, not {self.top_topics}")

    def secret(self) -> bytes | None:
        """The admin credential: the secret file's first line (``None`` without a file).
        An unreadable or empty file is a :class:`ConfigError`."""
        if not self.secret_file:
            return None
        try:
            text = Path(self.secret_file).read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read the admin secret file: {e}") from None
        lines = text.splitlines()
        secret = lines[0].strip() if lines else b""
        if not secret:
            raise ConfigError(f"the admin secret file {self.secret_file} is empty")
        return secret


SECTION = ConfigSection(
    "admin",
    AdminSettings,
    options=(
        Option(
            "endpoint",
            "str",
            "Serve metrics, the admin API and the dashboard on this endpoint "
            "(e.g. tcp:8090:interface=127.0.0.1).",
            flag="admin",
        ),
        Option(
            "secret-file",
            "str",
            "The admin credential (its first line): required by the API and the dashboard.",
        ),
        Option("sys-interval", "float", "Publish the _sys/... topics this often; 0: never [10]."),
        Option("sample-seconds", "float", "Sample rates for the dashboard this often [1]."),
        Option("top-topics", "count", "Topics ranked in the metrics and the dashboard [20]."),
        Option("metrics-auth", "bool", "Ask for the admin credential on /metrics too."),
    ),
    help="metrics, the admin API and the live dashboard (docs/operations.md)",
)


def admin_settings(config: BrokerConfig) -> AdminSettings:
    """The ``[admin]`` settings of a broker's (resolved) configuration."""
    return config.section(SECTION.name, AdminSettings)
