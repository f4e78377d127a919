"""Every hook msgbroker calls, documented.

Implement a hook by defining a function of the same name in a plugin module (or a method on
a plugin object) decorated with :data:`msgbroker.hookimpl`; it may accept any subset of the
documented arguments, by name. Register the plugin through the ``msgbroker`` entry-point
group, ``--plugin MODULE``, or as methods of a :class:`msgbroker.Broker` subclass.

*firstresult* hooks stop at the first implementation that returns something other than
``None``; returning ``None`` abstains and lets the next implementation (or the default)
decide.

Hot path: ``msgbroker_authorize`` and ``msgbroker_message_routed`` are called per message
only when some plugin implements them; with no implementation they cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .auth import AuthResult, AuthScheme, LoginRequest
    from .broker import Broker, ProtocolSpec
    from .config import BrokerConfig
    from .message import Message, MessageRun, RouteResult
    from .session import Session

hookspec = pluggy.HookspecMarker("msgbroker")


@hookspec
def msgbroker_register_protocols(register: Callable[[ProtocolSpec], None]) -> None:
    """Register wire protocols.

    Call ``register(ProtocolSpec(...))`` once per protocol. The spec's ``name`` is what
    ``--listen NAME=ENDPOINT`` uses; ``default_endpoint`` (or ``None``) is where the
    embedded default configuration listens; ``build_factory(broker, listener)`` returns the
    Twisted protocol factory for one listener. Two protocols with one name are an error.
    """


@hookspec
def msgbroker_register_auth_schemes(
    register: Callable[[AuthScheme], None], config: BrokerConfig
) -> None:
    """Register authentication schemes.

    Call ``register(scheme)`` with an object that has a ``name`` and an
    ``authenticate(request) -> Accept | Deny`` method (:class:`msgbroker.auth.AuthScheme`).
    ``config`` is the broker configuration (e.g. ``secret_file``). A scheme is offered to
    clients only when ``--auth NAME`` enables it.
    """


@hookspec
def msgbroker_register_stmp_routes(router: Any) -> None:
    """Route STMP actions to handlers.

    Call ``router.add(prefix, handler, timeout=30.0)`` with an action (``"10.1.2.3"``) or a
    dotted prefix (``"10.1.0.0/16"``); the longest matching prefix wins. ``handler``
    receives a :class:`msgbroker.plugins.stmp.router.RouteRequest` (session, broker,
    action, encoding, decoded payload) and returns the reply payload, a ``Reply``, a
    Deferred or a coroutine; raising ``STMPStatusError`` answers with its status, any other
    exception with ``0x30``; no answer within ``timeout`` seconds with ``0x34``. Actions in
    ``0.0.0.0/24`` belong to the protocol; the broker's own actions use ``0.0.1.0/24``.
    """


@hookspec
def msgbroker_register_mm2_extensions(register: Callable[[Any], None]) -> None:
    """Add Micromessage2 extensions.

    Call ``register(spec)`` with a :class:`msgbroker.plugins.mm2.extensions.ExtensionSpec`:
    the extension's name (``[a-z0-9-]+``; vendor extensions start with ``x-``), a factory
    that makes its per-connection handler from an ``ExtensionContext``, whether the server
    offers or requires it in the handshake, and the COMMAND names it handles. The handler
    sees its EXTENSION frames, its commands, and (when it overrides those methods) every
    MESSAGE the client sends and every one it is sent. Two extensions with one name, or
    two claiming one command, are a configuration error.
    """


@hookspec(firstresult=True)
def msgbroker_authenticate(request: LoginRequest) -> AuthResult | None:
    """Decide a login before its scheme does. *firstresult*.

    Return :class:`msgbroker.Accept` (possibly with another identity) or
    :class:`msgbroker.Deny` to decide, or ``None`` to abstain and let the scheme named in
    ``request.scheme`` decide. Only called for schemes that are enabled.
    """


@hookspec(firstresult=True)
def msgbroker_authorize(session: Session, action: str, topic: str | None) -> bool | None:
    """May ``session`` do ``action`` on ``topic``? *firstresult*.

    ``action`` is ``"subscribe"``, ``"publish"`` (multicast, ``topic`` = the topic),
    ``"unicast"`` (``topic`` = the target identity) or ``"broadcast"`` (``topic`` is
    ``None``). Return ``False`` to refuse (the protocol answers with its "not allowed" code,
    e.g. SSMP ``405``), ``True`` to allow, ``None`` to abstain. Everything is allowed when
    every implementation abstains. Called once per request, so keep it fast.
    """


@hookspec
def msgbroker_session_opened(session: Session) -> None:
    """A connection was accepted (before any login). ``session.protocol`` names its protocol."""


@hookspec
def msgbroker_session_login(session: Session, request: LoginRequest, result: AuthResult) -> None:
    """A login attempt was decided: ``result`` is :class:`~msgbroker.Accept` or
    :class:`~msgbroker.Deny` (``request.scheme`` says which scheme was tried)."""


@hookspec
def msgbroker_session_closed(session: Session, reason: str) -> None:
    """A connection ended; ``reason`` says why: ``"closed by peer"``, ``"CLOSE"``,
    ``"login timeout"``, ``"login refused"``, ``"second LOGIN"``, ``"keepalive timeout"``,
    ``"kicked"``, ``"slow consumer"``, ``"protocol error: ..."`` or ``"shutdown"``. Its
    subscriptions are already gone (and the UNSUBSCRIBE presence events sent)."""


@hookspec
def msgbroker_message_routed(message: Message, result: RouteResult) -> None:
    """A message was routed: ``result`` counts its deliveries per protocol, skipped recipients
    and slow-consumer drops. Called synchronously after the fan-out: keep it cheap (the
    journal hands the record to a writer thread)."""


@hookspec
def msgbroker_run_routed(run: MessageRun, result: RouteResult) -> None:
    """A run of ``run.count`` MCASTs (one sender, one topic, pipelined) was routed in one go,
    and every message of it reached the same recipients: ``result.recipients`` counts the
    deliveries of *each* message per protocol; ``result.dropped`` counts the whole run's
    slow-consumer drops; nothing was skipped. ``run.payloads()`` gives the payloads.

    Implement it beside :func:`msgbroker_message_routed` to observe every message without
    costing the hub its run fast path: without an implementation of this hook, an observed
    hub routes runs message by message so that ``msgbroker_message_routed`` sees each. A run
    whose messages do not all reach the same recipients (some too large for a protocol, a
    filtered or queue topic, sbus patterns) is still routed, and reported, message by
    message. Called synchronously after the fan-out: keep it cheap."""


@hookspec
def msgbroker_broker_started(broker: Broker) -> None:
    """The broker started: every listener is bound (see ``broker.listening``)."""


@hookspec
def msgbroker_broker_stopped(broker: Broker) -> None:
    """The broker stopped: every connection is closed, every listener released."""


#: hooks whose return value matters; the rest are notifications
FIRSTRESULT_HOOKS = ("msgbroker_authenticate", "msgbroker_authorize")


def hook_names() -> list[str]:
    """All hook names, in definition order (used by the documentation test)."""
    return [name for name, value in globals().items() if name.startswith("msgbroker_")]


def _unused(*_: Any) -> None:  # keeps the TYPE_CHECKING imports referenced for linters
    pass
