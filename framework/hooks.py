"""A broker's plugins, and the one typed way to call hooks.

:class:`Plugins` wraps the plugin manager: framework code and plugins call hooks through
it (never through ``pm.hook``), find plugins by name, and keep per-broker state. The
framework's hooks have typed methods; a plugin calls its *own* hooks (those it added with
``msgbroker_add_hookspecs``) through :meth:`Plugins.caller`, wrapped in a typed function
of its package (``msgbroker.plugins.stmp.hookspecs.register_stmp_routes``).

Hot path: the per-connection and per-message hooks are resolved by :meth:`Plugins.bind`
into :class:`BoundHooks`, each the hook's caller or ``None`` when nobody implements it; the
broker binds once, and again whenever a plugin is added or removed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from attrs import frozen

from .commands import DEFAULT_ORDER, RegisteredCommand, problem
from .config import KNOWN_KEYS
from .errors import ConfigError
from .markers import PER_TOPIC
from .pluginmanager import ErrorReport, PluginManager, build_plugin_manager, one_line
from .sections import ConfigSection, check_sections

if TYPE_CHECKING:
    from .auth import AuthResult, AuthScheme, LoginRequest
    from .broker import Broker
    from .commands import Command
    from .config import BrokerConfig
    from .engine import EngineSpec
    from .message import Message, MessageRun, RouteResult
    from .registry import ProtocolSpec
    from .session import Session

_State = TypeVar("_State")


class AuthenticateHook(Protocol):
    def __call__(self, *, request: LoginRequest) -> AuthResult | None: ...


class AuthorizeHook(Protocol):
    def __call__(self, *, session: Session, action: str, topic: str | None) -> bool | None: ...


class SessionOpenedHook(Protocol):
    def __call__(self, *, session: Session) -> None: ...


class SessionLoginHook(Protocol):
    def __call__(self, *, session: Session, request: LoginRequest, result: AuthResult) -> None: ...


class SessionClosedHook(Protocol):
    def __call__(self, *, session: Session, reason: str) -> None: ...


class MessageRoutedHook(Protocol):
    def __call__(self, *, message: Message, result: RouteResult) -> None: ...


class RunRoutedHook(Protocol):
    def __call__(self, *, run: MessageRun, result: RouteResult) -> None: ...


@frozen
class BoundHooks:
    """The observation hooks, each its caller (keyword arguments, as documented) or
    ``None`` when no plugin implements it: a hook nobody implements costs nothing, and
    one implemented once is that implementation, called directly."""

    authenticate: AuthenticateHook | None
    authorize: AuthorizeHook | None
    session_opened: SessionOpenedHook | None
    session_login: SessionLoginHook | None
    session_closed: SessionClosedHook | None
    message_routed: MessageRoutedHook | None
    run_routed: RunRoutedHook | None
    #: every ``msgbroker_authorize`` implementation is marked :func:`~msgbroker.per_topic`
    authorize_per_topic: bool = False


@frozen
class HookSpec:
    """A declared hook: its spec function (the docstring documents it) and the plugin that
    added it (``None``: the framework)."""

    name: str
    function: Callable[..., Any]
    owner: str | None
    historic: bool
    firstresult: bool


@frozen
class PluginInfo:
    """What ``msgbroker plugins`` lists of one plugin."""

    name: str
    module: str
    how: str
    distribution: str | None
    version: str | None
    #: the hooks it implements, and the hookspecs it added
    hooks: tuple[str, ...]
    hookspecs: tuple[str, ...]


class Plugins:
    """One broker's (or one command line's) plugins. ``Broker.plugins`` is the broker's."""

    def __init__(self, pm: PluginManager) -> None:
        self._pm = pm
        self._state: dict[str, Any] = {}

    @classmethod
    def load(
        cls,
        plugins: tuple[str, ...] = (),
        blocked: tuple[str, ...] = (),
        extra: tuple[Any, ...] = (),
        on_error: ErrorReport | None = None,
    ) -> Plugins:
        """The entry-point plugins, then ``plugins`` (module names) and ``extra`` (objects),
        minus ``blocked`` (see :func:`msgbroker.pluginmanager.build_plugin_manager`)."""
        return cls(build_plugin_manager(plugins, blocked, extra, on_error))

    # -- the registry ------------------------------------------------------------------------

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register ``plugin`` (a module or object with hook implementations); returns the
        name it is registered under. A hook it implements that nobody declares (unless
        marked ``optionalhook``) is a :class:`ConfigError`, and it is not registered."""
        try:
            registered = self._pm.register(plugin, name=name)
        except ValueError as e:
            raise ConfigError(f"plugin error: {one_line(e)}") from None
        if registered is None:
            raise ConfigError(f"plugin {name!r} is blocked")
        unknown = self._pm.unknown_hooks().get(registered)
        if unknown:
            self._pm.unregister(plugin)
            raise ConfigError(f"plugin error: unknown hook {unknown[0]!r} in plugin {registered!r}")
        return registered

    def unregister(self, plugin: object | None = None, name: str | None = None) -> object:
        """Unregister a plugin, by object or by name; returns it."""
        removed: object = self._pm.unregister(plugin, name=name)
        return removed

    def get(self, name: str) -> object | None:
        """The plugin registered as ``name`` (an entry-point name, a module name, or the
        name given to ``broker.add_plugin``), or ``None``."""
        plugin: object | None = self._pm.get_plugin(name)
        return plugin

    def names(self) -> list[str]:
        """Every registered plugin's name, in registration order."""
        return [name for name, plugin in self._pm.list_name_plugin() if plugin is not None]

    def implements(self, hook_name: str) -> bool:
        """True when some registered plugin implements ``hook_name``."""
        caller = getattr(self._pm.hook, hook_name, None)
        return caller is not None and bool(caller.get_hookimpls())

    def caller(self, hook_name: str) -> Callable[..., Any]:
        """The caller of a declared hook: call it with keyword arguments. For a plugin's
        own hooks; wrap it in a typed function. ``LookupError`` when no spec declares it."""
        caller = getattr(self._pm.hook, hook_name, None)
        if caller is None or not caller.has_spec():
            raise LookupError(f"no plugin declares the hook {hook_name!r}")
        return cast(Callable[..., Any], caller)

    def hookspecs(self) -> dict[str, HookSpec]:
        """Every declared hook, by name: the framework's and those plugins added."""
        specs: dict[str, HookSpec] = {}
        for name in sorted(self._pm.spec_names()):
            spec = getattr(self._pm.hook, name).spec
            opts = spec.opts
            specs[name] = HookSpec(
                name,
                spec.function,
                self._pm.spec_owners.get(name),
                bool(opts.get("historic")),
                bool(opts.get("firstresult")),
            )
        return specs

    def info(self) -> list[PluginInfo]:
        """What is registered, in registration order: origin, hooks and added hookspecs."""
        found = []
        for name in self.names():
            plugin = self._pm.get_plugin(name)
            source = self._pm.sources.get(name)
            hooks = sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or ())
            added = sorted(h for h, owner in self._pm.spec_owners.items() if owner == name)
            found.append(
                PluginInfo(
                    name=name,
                    module=source.module if source else type(plugin).__name__,
                    how=source.how if source else "object",
                    distribution=source.distribution if source else None,
                    version=source.version if source else None,
                    hooks=tuple(hooks),
                    hookspecs=tuple(added),
                )
            )
        return found

    def problems(self) -> dict[str, str]:
        """Plugins left out as broken (a lenient load: the command line), with why."""
        return dict(self._pm.problems)

    def state(self, key: str, factory: Callable[[], _State]) -> _State:
        """Per-broker plugin state: the value kept under ``key`` (by convention your
        plugin's name, or ``"name.what"``), made by ``factory()`` the first time. State a
        plugin keeps here lives and dies with its broker, unlike a module-level cache."""
        try:
            value: _State = self._state[key]
        except KeyError:
            value = self._state[key] = factory()
        return value

    # -- the framework's hooks, typed ------------------------------------------------------------

    def register_protocols(self, register: Callable[[ProtocolSpec], None]) -> None:
        self._pm.hook.msgbroker_register_protocols(register=register)

    def register_auth_schemes(
        self, register: Callable[[AuthScheme], None], config: BrokerConfig, broker: Broker
    ) -> None:
        self._pm.hook.msgbroker_register_auth_schemes(
            register=register, config=config, broker=broker
        )

    def register_engines(self, register: Callable[[EngineSpec], None]) -> None:
        self._pm.hook.msgbroker_register_engines(register=register)

    def config_sections(self) -> tuple[ConfigSection[Any], ...]:
        """Every section the plugins declare, checked: one name once, one flag once."""
        declared = [s for sections in self.config_sections_by_plugin().values() for s in sections]
        return check_sections(declared, KNOWN_KEYS)

    def config_sections_by_plugin(self) -> dict[str, tuple[ConfigSection[Any], ...]]:
        """The sections each plugin declares (``msgbroker_register_config_sections``)."""
        found: dict[str, list[ConfigSection[Any]]] = {}
        for plugin_name, call in self._each("msgbroker_register_config_sections"):
            sections = found.setdefault(plugin_name, [])

            def register(section: ConfigSection[Any], into: list[Any] = sections) -> None:
                if not isinstance(section, ConfigSection):
                    raise ConfigError(f"{section!r} is no ConfigSection")
                into.append(section)

            call(register=register)
        return {name: tuple(sections) for name, sections in found.items()}

    def commands(self, on_error: ErrorReport | None = None) -> list[RegisteredCommand]:
        """The ``msgbroker`` sub-commands the plugins register, in ``--help`` order. A
        plugin whose hook fails, a command that is none, or a second command with a name
        taken is a :class:`ConfigError`, or with ``on_error`` reported there and left out."""
        report = on_error or _raise
        commands: dict[str, RegisteredCommand] = {}
        for plugin_name, call in self._each("msgbroker_register_commands"):

            def register(
                command: Command, order: int = DEFAULT_ORDER, by: str = plugin_name
            ) -> None:
                wrong = problem(command)
                if wrong is not None:
                    report(by, f"plugin {by!r}: {wrong}")
                elif command.NAME in commands:
                    taken = commands[command.NAME].plugin
                    report(
                        by,
                        f"plugin {by!r}: the command name {command.NAME!r} is taken "
                        f"(by plugin {taken!r})",
                    )
                else:
                    commands[command.NAME] = RegisteredCommand(command, order, by)

            try:
                call(register=register)
            except ConfigError:
                raise
            except Exception as e:
                report(plugin_name, f"plugin {plugin_name!r} failed to register commands: {e!r}")
        return sorted(commands.values(), key=lambda c: (c.order, c.name))

    def broker_started(self, broker: Broker) -> None:
        self._pm.hook.msgbroker_broker_started(broker=broker)

    def broker_stopping(self, broker: Broker) -> None:
        self._pm.hook.msgbroker_broker_stopping(broker=broker)

    def broker_stopped(self, broker: Broker) -> None:
        self._pm.hook.msgbroker_broker_stopped(broker=broker)

    def reload(self, broker: Broker, config: BrokerConfig) -> list[Callable[[], None]]:
        """``msgbroker_reload``: each implementation, in registration order, checks
        ``config``; their callables that put it in place (``None`` left out). The first
        refusal (:class:`ConfigError`; any other exception is one too, naming the plugin)
        ends it: nothing is committed then."""
        commits: list[Callable[[], None]] = []
        arguments = {"broker": broker, "config": config}
        for impl in self._pm.hook.msgbroker_reload.get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                continue
            try:
                commit = cast(
                    "Callable[[], None] | None",
                    impl.function(*(arguments[name] for name in impl.argnames)),
                )
            except ConfigError:
                raise
            except Exception as e:
                raise ConfigError(f"plugin {impl.plugin_name!r} failed to reload: {e!r}") from e
            if commit is not None:
                commits.append(commit)
        return commits

    def bind(self) -> BoundHooks:
        """The observation hooks as they are implemented now (see :class:`BoundHooks`)."""
        return BoundHooks(
            authenticate=self._bound("msgbroker_authenticate"),
            authorize=self._bound("msgbroker_authorize"),
            session_opened=self._bound("msgbroker_session_opened"),
            session_login=self._bound("msgbroker_session_login"),
            session_closed=self._bound("msgbroker_session_closed"),
            message_routed=self._bound("msgbroker_message_routed"),
            run_routed=self._bound("msgbroker_run_routed"),
            authorize_per_topic=self._all_marked("msgbroker_authorize", PER_TOPIC),
        )

    def _all_marked(self, hook_name: str, marker: str) -> bool:
        """Whether the hook has implementations, each marked with ``marker``."""
        impls = getattr(self._pm.hook, hook_name).get_hookimpls()
        return bool(impls) and all(getattr(impl.function, marker, False) for impl in impls)

    def _bound(self, hook_name: str) -> Any:
        """The hook's caller; ``None`` when nobody implements it. With one implementation
        (no wrapper), that implementation itself: what pluggy's caller would do for it, less
        its per-call work (a copy of the implementations, the arguments checked against the
        spec, the result loop), which was most of a per-request hook's cost."""
        caller = getattr(self._pm.hook, hook_name)
        impls = caller.get_hookimpls()
        if not impls:
            return None
        if len(impls) > 1 or impls[0].hookwrapper or impls[0].wrapper:
            return caller
        impl = impls[0]
        if set(impl.argnames) == set(caller.spec.argnames):
            return impl.function  # called with the spec's names, as keywords
        return functools.partial(_pick, impl.function, tuple(impl.argnames))

    def _each(self, hook_name: str) -> Iterator[tuple[str, Callable[..., None]]]:
        """Each implementation of a registration hook on its own, in registration order
        (so what it registers can be told by plugin), as ``(plugin name, call)``."""
        for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                continue

            yield impl.plugin_name, functools.partial(_call, impl.function, tuple(impl.argnames))


def _call(function: Callable[..., None], argnames: tuple[str, ...], **kwargs: Any) -> None:
    """What pluggy does for one implementation: the arguments it asks for, positionally."""
    function(*(kwargs[name] for name in argnames))


def _pick(function: Callable[..., Any], argnames: tuple[str, ...], **kwargs: Any) -> Any:
    """:func:`_call`, returning the implementation's result (a firstresult hook's answer)."""
    return function(*[kwargs[name] for name in argnames])


def _raise(name: str, message: str) -> None:
    raise ConfigError(message)


def declared_sections(
    plugins: Sequence[str], blocked: Sequence[str]
) -> tuple[ConfigSection[Any], ...]:
    """The configuration sections there are when the entry-point plugins and ``plugins``
    (module names) run, minus ``blocked`` (for reading a configuration before a broker)."""
    return Plugins.load(tuple(plugins), tuple(blocked)).config_sections()
