"""msgbroker: one message broker for SSMP, STMP, Micromessage2 and sbus.

The public API, re-exported: :data:`hookimpl` to implement hooks (and :func:`per_topic` to
say an authorization hook decides per topic) and :data:`hookspec` to declare a plugin's
own, :class:`Broker` to embed or subclass, :class:`Plugins` (a broker's plugins and the
typed way to call hooks), the value types plugins see, and the errors.
"""

from __future__ import annotations

from .auth import Accept, AuthScheme, Deny, LoginRequest
from .broker import Broker, ProtocolSpec
from .config import BrokerConfig, ConfigSection, Listener, Option
from .errors import ConfigError, MsgbrokerError, RemoteProtocolError
from .hooks import Plugins
from .markers import hookimpl, hookspec, per_topic
from .message import Kind, Message, RouteResult
from .session import Session

__all__ = [
    "Accept",
    "AuthScheme",
    "Broker",
    "BrokerConfig",
    "ConfigError",
    "ConfigSection",
    "Deny",
    "Kind",
    "Listener",
    "LoginRequest",
    "Message",
    "MsgbrokerError",
    "Option",
    "Plugins",
    "ProtocolSpec",
    "RemoteProtocolError",
    "RouteResult",
    "Session",
    "hookimpl",
    "hookspec",
    "per_topic",
]
