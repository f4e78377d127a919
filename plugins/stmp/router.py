"""STMP action routing: handlers registered for an action or a dotted prefix
(``10.1.0.0/16``), longest prefix wins.

Plugins add routes in ``msgbroker_register_stmp_routes(router)``::

    @hookimpl
    def msgbroker_register_stmp_routes(router):
        router.add("10.1.0.0/16", handle_inventory, timeout=5.0)

A handler gets one :class:`RouteRequest` and returns the reply's payload (an object
encoded in the request's encoding; ``None`` for no payload), a :class:`Reply` to choose the
status, a Deferred or a coroutine of either; or raises :class:`STMPStatusError` for an
error status. Any other exception becomes ``0x30 InternalServerError`` with nothing of it
sent to the client; no answer within the route's timeout becomes ``0x34 GatewayTimeout``.
Actions ``0.0.0.0/24`` belong to the protocol and cannot be routed (a shorter prefix may
cover them: they are answered by the protocol before routing).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attrs import define, field, frozen
from twisted.internet import defer

from msgbroker.errors import ConfigError

from . import hookspecs
from .codec import Status, action_to_str, parse_prefix

if TYPE_CHECKING:
    from msgbroker import Broker, Session

DEFAULT_TIMEOUT = 30.0


@frozen
class RouteRequest:
    """What a handler receives.

    ``payload`` is decoded by encoding: JSON and msgpack into Python objects, anything else
    (raw, protobuf, bson, none) as bytes. ``raw`` is the payload as received. ``session``
    carries the identity (``session.identity``) and ``broker`` the rest of the broker.
    ``notify`` is true for a notify message (its return value is discarded).
    """

    session: Session
    broker: Broker
    action: int
    encoding: int
    payload: Any
    raw: bytes
    notify: bool = False

    @property
    def action_text(self) -> str:
        return action_to_str(self.action)


@frozen
class Reply:
    """A reply with an explicit status (``payload`` encoded like a plain return value);
    ``after`` runs once the reply is sent (e.g. to send notifies that must follow it)."""

    status: int = Status.OK
    payload: Any = None
    after: Callable[[], None] | None = None


class STMPStatusError(Exception):
    """Raise from a handler to answer with ``status`` (and optionally a payload)."""

    def __init__(self, status: int, payload: Any = None) -> None:
        super().__init__(status, payload)
        self.status = status
        self.payload = payload


Handler = Callable[[RouteRequest], Any]


@frozen
class Route:
    prefix: str
    handler: Handler
    timeout: float = DEFAULT_TIMEOUT


@define
class Router:
    """Longest-prefix action router: one dict per prefix length, longest first."""

    _by_length: dict[int, dict[int, Route]] = field(factory=dict)
    _lengths: list[int] = field(factory=list)

    def add(self, prefix: str, handler: Handler, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Route ``prefix`` (``"a.b.c.d"`` or ``"a.b.c.d/len"``) to ``handler``."""
        value, length = parse_prefix(prefix)
        self._check_not_reserved(prefix, value, length)
        table = self._by_length.setdefault(length, {})
        if value in table:
            raise ValueError(f"two routes for {prefix}")
        if not timeout > 0:
            raise ValueError(f"route timeout must be positive: {timeout}")
        table[value] = Route(prefix, handler, timeout)
        self._lengths = sorted(self._by_length, reverse=True)

    @staticmethod
    def _check_not_reserved(prefix: str, value: int, length: int) -> None:
        # a shorter prefix may cover the range: reserved actions never reach the router
        if length >= 24 and value >> 8 == 0:
            raise ValueError(f"{prefix} is in 0.0.0.0/24, reserved for the protocol")

    def lookup(self, action: int) -> Route | None:
        """The route with the longest prefix containing ``action``."""
        for length in self._lengths:
            mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
            route = self._by_length[length].get(action & mask)
            if route is not None:
                return route
        return None

    def routes(self) -> list[Route]:
        return [r for length in self._lengths for r in self._by_length[length].values()]


def run_handler(route: Route, request: RouteRequest) -> Any:
    """``route``'s handler on ``request``: its answer, or a Deferred of it (a coroutine runs
    as one), so the server session (sans-IO) waits on nothing but Deferreds."""
    result = route.handler(request)
    if inspect.iscoroutine(result):
        return defer.ensureDeferred(result)
    return result


#: where the broker keeps its router (``broker.plugins.state``)
ROUTER_STATE = "stmp.router"


def router_for(broker: Broker) -> Router:
    """The broker's STMP router, built once from ``msgbroker_register_stmp_routes``."""
    return broker.plugins.state(ROUTER_STATE, lambda: _build_router(broker))


def _build_router(broker: Broker) -> Router:
    router = Router()
    try:
        hookspecs.register_stmp_routes(broker.plugins, router)
    except ValueError as e:
        raise ConfigError(f"bad STMP route: {e}") from None
    return router
