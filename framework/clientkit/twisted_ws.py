"""WebSocket for the Twisted clients, on autobahn: :class:`WebSocketClientDriver` runs a
session whose units are ``(is_binary, payload)`` messages, :class:`WebSocketClientFactory`
builds it for a ``ws://`` or ``wss://`` URL with its timers on the given reactor
(:class:`ReactorTimer`), not on txaio's global one.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted import websocket
from twisted.python.failure import Failure

from ..timers import ReactorTimer
from .protocol import SessionDriver

__all__ = ["ReactorTimer", "WebSocketClientDriver", "WebSocketClientFactory", "websocket_url"]


class WebSocketClientDriver(SessionDriver, websocket.WebSocketClientProtocol):  # type: ignore[misc]
    """A :class:`~msgbroker.clientkit.protocol.SessionDriver` on an autobahn WebSocket: the
    session starts once the WebSocket handshake is done; a handshake that fails ends it
    with the session's ``closed_error``."""

    def onOpen(self) -> None:
        self._transport_opened()

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self._transport_data((isBinary, payload))

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        if not self._opened and self.session.error is None:
            text = f"WebSocket handshake failed: {reason or code}"
            self.session.lost(self.session.closed_error(text))

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)  # type: ignore[arg-type]
        self._transport_lost(reason)

    def _write(self, unit: Any) -> None:
        binary, payload = unit
        self.sendMessage(payload, isBinary=binary)

    def _drop(self, abort: bool) -> None:
        if abort or not self._opened:
            self.dropConnection(abort=True)
        else:
            self.sendClose(1000)


class WebSocketClientFactory(websocket.WebSocketClientFactory):
    """Builds ``protocol_class(**options)`` for ``url``, its timers on ``reactor``."""

    def __init__(self, url: str, protocol_class: Any, reactor: Any = None, **options: Any) -> None:
        super().__init__(url, reactor=reactor)
        if reactor is not None:
            # autobahn's handshake and close timers run on txaio's loop (the global reactor):
            # put them on ours. (Its wait for the server to drop the TCP connection after a
            # close handshake still uses txaio's loop.)
            self._batched_timer = ReactorTimer(reactor)
        self.protocol_class = protocol_class
        self.options = options

    def buildProtocol(self, addr: Any) -> Any:
        proto = self.protocol_class(**self.options)
        proto.factory = self
        return proto


def websocket_url(host: str, port: int, path: str = "/", secure: bool = False) -> str:
    """``ws://host:port/path`` (``wss`` when ``secure``; an IPv6 host in brackets)."""
    where = host if ":" not in host else f"[{host}]"
    return f"{'wss' if secure else 'ws'}://{where}:{port}{path}"
