"""The ``[linepub]`` section of the broker's configuration.

::

    [linepub]
    token-file = "/etc/msgbroker/linepub-tokens"   # --linepub-token-file
    motd = "welcome, {identity}"                   # --linepub-motd

Each key is also a ``twistd msgbroker`` option (``--linepub-token-file``) and a top-level
key of the TOML file, exactly like the built-in journal's.
"""

from __future__ import annotations

from pathlib import Path

from attrs import frozen

from msgbroker import BrokerConfig, ConfigError, ConfigSection, Option


@frozen
class LinepubSettings:
    """``token_file``: ``identity:token`` lines for the ``token`` login scheme (none: the
    scheme refuses everyone); ``motd``: the message of the day (``{identity}`` is replaced)."""

    token_file: str | None = None
    motd: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.motd is not None and "\n" in self.motd:
            raise ConfigError("linepub motd must be one line")


SECTION = ConfigSection(
    "linepub",
    LinepubSettings,
    options=(
        Option("token-file", "str", "identity:token lines for the linepub token login scheme."),
        Option("motd", "str", "Message of the day sent after a linepub login ({identity})."),
    ),
    help="the linepub example protocol (examples/linepub)",
)


def linepub_settings(config: BrokerConfig) -> LinepubSettings:
    return config.section(SECTION.name, LinepubSettings)


def read_tokens(path: str) -> dict[str, bytes]:
    """``identity:token`` lines; blank lines and ``#`` comments are skipped."""
    tokens: dict[str, bytes] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read linepub token file {path}: {e.strerror}") from None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        identity, sep, token = line.partition(":")
        if not sep or not identity or not token:
            raise ConfigError(f"{path}:{number}: expected identity:token")
        tokens[identity] = token.encode()
    return tokens
