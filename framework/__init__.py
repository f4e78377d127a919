"""msgbroker: one message broker for SSMP, STMP, Micromessage2 and sbus.

The public API, re-exported: :data:`hookimpl` to implement hooks (and :func:`per_topic` to
say an authorization hook decides per topic) and :data:`hookspec` to declare a plugin's
own, :class:`Broker` to embed or subclass, :class:`Plugins` (a broker's plugins and the
typed way to call hooks), the value types plugins see, and the errors.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .markers import hookimpl, hookspec, per_topic

if TYPE_CHECKING:
    from .auth import Accept, AuthResult, AuthScheme, Deny, LoginRequest
    from .broker import Broker
    from .config import BrokerConfig, ConfigSection, Listener, Option
    from .errors import ConfigError, MsgbrokerError, RemoteProtocolError
    from .hooks import Plugins
    from .message import Kind, Message, RemoteMessage, RouteResult
    from .registry import ProtocolSpec
    from .session import Session

#: where each re-exported name lives: imported on first use (PEP 562), so ``import
#: msgbroker`` (every plugin module does it for ``hookimpl``) does not load the broker,
#: Twisted and TLS; the ``msgbroker`` clients start without them
_LAZY = {
    "Accept": "auth",
    "AuthResult": "auth",
    "AuthScheme": "auth",
    "Deny": "auth",
    "LoginRequest": "auth",
    "Broker": "broker",
    "ProtocolSpec": "registry",
    "BrokerConfig": "config",
    "ConfigSection": "config",
    "Listener": "config",
    "Option": "config",
    "ConfigError": "errors",
    "MsgbrokerError": "errors",
    "RemoteProtocolError": "errors",
    "Plugins": "hooks",
    "Kind": "message",
    "Message": "message",
    "RemoteMessage": "message",
    "RouteResult": "message",
    "Session": "session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Accept",
    "AuthResult",
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
    "RemoteMessage",
    "RemoteProtocolError",
    "RouteResult",
    "Session",
    "hookimpl",
    "hookspec",
    "per_topic",
]
