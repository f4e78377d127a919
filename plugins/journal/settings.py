"""The journal's configuration section, ``[journal]``, and its command-line options.

::

    [journal]
    directory = "/var/lib/msgbroker/journal"   # --journal DIR; no directory: no journal
    payloads = true                            # --journal-payloads
    rotate-seconds = 10                        # --journal-rotate-seconds
    rotate-bytes = "64M"                       # --journal-rotate-bytes
    max-records = 1000000                      # --journal-max-records

Each option's flag is also a top-level key (``journal = "DIR"``, ``journal-payloads =
true``), as before the section existed.
"""

from __future__ import annotations

from attrs import frozen

from msgbroker import BrokerConfig, ConfigError, ConfigSection, Option


@frozen
class JournalSettings:
    """Where the journal writes (``None``: no journal), whether it keeps payload bytes,
    when it closes a segment (seconds, bytes), and how many records it holds in memory
    before it drops (and counts) new ones."""

    directory: str | None = None
    payloads: bool = False
    rotate_seconds: float = 10.0
    rotate_bytes: int = 64 << 20
    max_records: int = 1_000_000

    def __attrs_post_init__(self) -> None:
        if not self.rotate_seconds > 0:
            raise ConfigError(f"journal-rotate-seconds must be positive, not {self.rotate_seconds}")
        for name, size in (
            ("journal-rotate-bytes", self.rotate_bytes),
            ("journal-max-records", self.max_records),
        ):
            if size < 1:
                raise ConfigError(f"{name} must be at least 1, not {size}")


SECTION = ConfigSection(
    "journal",
    JournalSettings,
    options=(
        Option(
            "directory",
            "str",
            "Write the journal of routed messages and sessions there.",
            flag="journal",
        ),
        Option("payloads", "bool", "Keep payload bytes in the journal."),
        Option("rotate-seconds", "float", "Close a journal segment after this long [10]."),
        Option("rotate-bytes", "size", "Close a journal segment at about this size [64M]."),
        Option("max-records", "count", "Records held before new ones are dropped [1000000]."),
    ),
    help="the journal of routed messages and sessions (docs/journal.md)",
)


def journal_settings(config: BrokerConfig) -> JournalSettings:
    """The ``[journal]`` settings of a broker's (resolved) configuration."""
    return config.section(SECTION.name, JournalSettings)
