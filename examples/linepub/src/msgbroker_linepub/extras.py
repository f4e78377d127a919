"""What linepub adds to the other protocols: a Micromessage2 vendor extension and an STMP
action, each through the hook its protocol plugin declares."""

from __future__ import annotations

from typing import Any

from msgbroker.plugins.mm2.extensions import ExtensionHandler
from msgbroker.plugins.stmp.router import RouteRequest

from .hookspecs import linepub_motd


class MessageCounter(ExtensionHandler):
    """``x-linepub-count``: counts the MESSAGEs the client sends; the COMMAND
    ``linepub-count`` is answered with an EXTENSION frame holding the count (ASCII)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.count = 0

    def incoming(self, message: Any) -> Any:
        self.count += 1
        return message

    def command(self, command: Any) -> None:
        self.context.send_extension_frame(str(self.count).encode("ascii"))


#: the STMP action (in the range STMP leaves to applications) that answers linepub's state
STATUS_ACTION = "10.76.0.1"


def linepub_status(request: RouteRequest) -> dict[str, Any]:
    """``10.76.0.1``: how many linepub clients are connected, and the caller's MOTD."""
    broker = request.broker
    identity = request.session.identity or ""
    return {
        "connections": sum(1 for s in broker.sessions if s.protocol == "linepub"),
        "motd": linepub_motd(broker.plugins, broker, identity),
    }
