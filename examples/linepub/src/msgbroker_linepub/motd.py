"""A second plugin (its own entry point, ``linepub-motd``) implementing the hook that
:mod:`msgbroker_linepub.plugin` declares: the MOTD comes from ``[linepub] motd``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import hookimpl

from .settings import linepub_settings

if TYPE_CHECKING:
    from msgbroker import Broker


@hookimpl
def msgbroker_linepub_motd(broker: Broker, identity: str) -> str | None:
    motd = linepub_settings(broker.config).motd
    return None if motd is None else motd.replace("{identity}", identity)
