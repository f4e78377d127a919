"""msgbroker: one message broker for SSMP, STMP, Micromessage2 and sbus.

The public API, re-exported: :data:`hookimpl` to implement hooks, :class:`Broker` to embed
or subclass, the value types plugins see, and the errors.
"""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("msgbroker")

from .auth import Accept, AuthScheme, Deny, LoginRequest  # noqa: E402
from .broker import Broker, ProtocolSpec  # noqa: E402
from .config import BrokerConfig, Listener  # noqa: E402
from .errors import ConfigError, MsgbrokerError, RemoteProtocolError  # noqa: E402
from .message import Kind, Message, RouteResult  # noqa: E402
from .session import Session  # noqa: E402

__all__ = [
    "Accept",
    "AuthScheme",
    "Broker",
    "BrokerConfig",
    "ConfigError",
    "Deny",
    "Kind",
    "Listener",
    "LoginRequest",
    "Message",
    "MsgbrokerError",
    "ProtocolSpec",
    "RemoteProtocolError",
    "RouteResult",
    "Session",
    "hookimpl",
]
