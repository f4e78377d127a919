"""The hook linepub adds to msgbroker (through ``msgbroker_add_hookspecs``), so that other
plugins can decide what linepub says; :mod:`msgbroker_linepub.motd` implements it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import hookspec

if TYPE_CHECKING:
    from msgbroker import Broker, Plugins


@hookspec(firstresult=True)
def msgbroker_linepub_motd(broker: Broker, identity: str) -> str | None:
    """The message of the day a linepub client gets right after its login, or None for
    none. *firstresult*: the first implementation that returns a string decides; ``None``
    abstains."""


def linepub_motd(plugins: Plugins, broker: Broker, identity: str) -> str | None:
    """Ask the plugins (typed: the hook caller itself is untyped)."""
    motd: str | None = plugins.caller("msgbroker_linepub_motd")(broker=broker, identity=identity)
    return motd
