"""Every hook the framework calls, documented.

Implement a hook by defining a function of the same name in a plugin module (or a method on
a plugin object) decorated with :data:`msgbroker.hookimpl`; it may accept any subset of the
documented arguments, by name. Register the plugin through the ``msgbroker`` entry-point
group, ``--plugin MODULE``, or as methods of a :class:`msgbroker.Broker` subclass.

Plugins add hooks of their own through :func:`msgbroker_add_hookspecs` (STMP's
``msgbroker_register_stmp_routes`` is in ``plugins/stmp/hookspecs.py``, Micromessage2's
``msgbroker_register_mm2_extensions`` in ``plugins/mm2/hookspecs.py``). Framework code calls
hooks through :class:`msgbroker.hooks.Plugins`, never through the plugin manager directly.

*firstresult* hooks stop at the first implementation that returns something other than
``None``; returning ``None`` abstains and lets the next implementation (or the default)
decide.

Hot path: ``msgbroker_authorize`` and ``msgbroker_message_routed`` are called per message
only when some plugin implements them; with no implementation they cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .markers import hookspec

if TYPE_CHECKING:
    from .auth import AuthResult, AuthScheme, LoginRequest
    from .broker import Broker
    from .commands import RegisterCommand
    from .config import BrokerConfig
    from .engine import EngineSpec
    from .message import Message, MessageRun, RouteResult
    from .registry import ProtocolSpec
    from .sections import ConfigSection
    from .session import Session


@hookspec(historic=True)
def msgbroker_add_hookspecs(add: Callable[[object], None]) -> None:
    """Add hookspecs of your own, for other plugins to implement. *historic*.

    Call ``add(namespace)`` with a module or class holding functions decorated with
    :data:`msgbroker.hookspec`, named so that they say whose they are
    (``msgbroker_register_stmp_routes``). Called as the plugin is registered (historic: a
    plugin registered later is called too), so implementations of the new hooks are
    accepted whether their plugin was registered before or after this one; an
    implementation of a hook no loaded plugin declares is refused unless marked
    ``@hookimpl(optionalhook=True)``. Call them through ``plugins.caller(name)``
    (:class:`msgbroker.hooks.Plugins`), in a typed function of your package. A hook name
    that already has a spec is a configuration error.
    """


@hookspec
def msgbroker_register_config_sections(register: Callable[[ConfigSection[object]], None]) -> None:
    """Declare configuration sections.

    Call ``register(ConfigSection(name, settings, options))``: the TOML file's ``[name]``
    table holds the options' keys, and each option is also a ``twistd msgbroker``
    command-line option and a top-level key (its flag, ``NAME-KEY`` by default). The broker
    makes ``settings(**values)`` from what was given (an unknown key is a configuration error
    naming the section and key); read it with ``config.section(name, SettingsClass)``. Two
    sections with one name, or two options with one flag, are a configuration error.
    Called while the configuration is read and again while the ``Broker`` is built.
    """


@hookspec
def msgbroker_register_commands(register: RegisterCommand) -> None:
    """Add ``msgbroker`` sub-commands.

    Call ``register(command, order=100)`` with a module (or object) that has ``NAME``,
    ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``
    (:class:`msgbroker.commands.Command`); best, a
    :class:`msgbroker.commands.LazyCommand` (``NAME``, ``HELP`` and the module's dotted
    path), whose module is imported only when the command runs, so neither a broker nor
    another command imports it. ``msgbroker --help`` lists commands by ``order`` (the
    built-ins use 10 to 90), then by name. Two commands with one name are an error (the
    later one is left out, with one line on stderr).
    """


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
    register: Callable[[AuthScheme], None], config: BrokerConfig, broker: Broker
) -> None:
    """Register authentication schemes.

    Call ``register(scheme)`` with an object that has a ``name`` and an
    ``authenticate(request) -> Accept | Deny`` method (:class:`msgbroker.auth.AuthScheme`);
    a slow check may answer with a Deferred instead (the ``password`` scheme hashes in a
    thread of its own on ``broker.reactor``). ``config`` is the broker configuration
    (e.g. ``secret_file``); ``broker`` the broker being built (its ``reactor``; its plugins'
    ``state``). A scheme is offered to clients only when ``--auth NAME`` enables it, or
    its ``implied_by(config)`` says its settings do (``password`` with ``--users``).
    """


@hookspec
def msgbroker_register_engines(register: Callable[[EngineSpec], None]) -> None:
    """Register cluster engines.

    Call ``register(EngineSpec(name, schemes, build))`` once per engine
    (:mod:`msgbroker.engine`): ``--cluster URL`` picks the engine whose ``schemes`` hold the
    URL's scheme (``redis`` for ``redis://host:6379``; an empty URL is ``memory``, the
    single-node default). ``build(context)`` makes the :class:`msgbroker.engine.Engine`
    when the broker starts (``None``: no cluster). Two engines with one scheme are an error.
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
def msgbroker_broker_stopping(broker: Broker) -> None:
    """The broker begins to stop (SIGTERM): its listeners are about to close, then its
    connections get ``--shutdown-grace`` seconds to flush what they hold."""


@hookspec
def msgbroker_broker_stopped(broker: Broker) -> None:
    """The broker stopped: every connection is closed, every listener released."""


@hookspec
def msgbroker_reload(broker: Broker, config: BrokerConfig) -> Callable[[], None] | None:
    """SIGHUP: the configuration was read again (``config``, the whole new one; the broker
    still runs on ``broker.config``). Read and check what your plugin loads for it (its
    files, its section), and raise :class:`~msgbroker.errors.ConfigError` to refuse the
    reload: then nothing changes anywhere and one log line gives your message. Otherwise
    return a callable that puts your new settings in place, or ``None`` when you have
    nothing to change. The callables run only once every implementation has accepted, in
    registration order, and must not fail. Existing connections stay open."""


#: hooks whose return value matters; the rest are notifications
FIRSTRESULT_HOOKS = ("msgbroker_authenticate", "msgbroker_authorize")


def hook_names() -> list[str]:
    """The framework's hook names, in definition order (plugins add more: see
    :meth:`msgbroker.hooks.Plugins.hookspecs`)."""
    return [name for name in globals() if name.startswith("msgbroker_")]


def _unused(*_: Any) -> None:  # keeps the TYPE_CHECKING imports referenced for linters
    pass
