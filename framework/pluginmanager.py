"""The plugin manager: built-ins and third-party plugins, found the same way.

Built-in plugins (the protocols, auth schemes and the journal in ``msgbroker.plugins``, the
analytics command in ``msgbroker.analytics``) are declared in the ``msgbroker`` entry-point
group of our own distribution, exactly like a third-party plugin's; ``--plugin MODULE``
adds a module by import name, ``--no-plugin NAME`` blocks a plugin by its entry-point name
(or module name).

Framework code calls hooks through :class:`msgbroker.hooks.Plugins`, never through
``pm.hook`` (a test checks it): this module and that one are the only ones that touch the
pluggy manager.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable
from typing import Any, cast

import pluggy
from attrs import frozen

from . import hookspecs
from .errors import ConfigError
from .markers import PROJECT

#: ``on_error(plugin_name, one_line)``: a broken plugin, reported and left out
ErrorReport = Callable[[str, str], None]


@frozen
class PluginSource:
    """Where a registered plugin came from."""

    name: str
    #: the module's import name (an object plugin: its class)
    module: str
    #: ``"entry point"``, ``"--plugin"`` or ``"object"``
    how: str
    distribution: str | None = None
    version: str | None = None


class PluginManager(pluggy.PluginManager):
    """A pluggy manager with the framework's hookspecs that also accepts undecorated
    ``msgbroker_*`` methods of :class:`msgbroker.Broker` subclasses (subclass hooks), calls
    ``msgbroker_add_hookspecs`` (historic) for every plugin as it is registered, and
    remembers where each plugin came from and which hookspecs it added."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.add_hookspecs(hookspecs)
        #: registered plugins' origins, by plugin name
        self.sources: dict[str, PluginSource] = {}
        #: hook name -> the plugin that added its spec (framework hooks are not in it)
        self.spec_owners: dict[str, str] = {}
        #: plugins left out, with why (lenient building only: the command line)
        self.problems: dict[str, str] = {}
        self._registering: str | None = None
        self.hook.msgbroker_add_hookspecs.call_historic(kwargs={"add": self._add_plugin_specs})

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if (
            opts is None
            and name.startswith("msgbroker_")
            and getattr(plugin, "_msgbroker_subclass_hooks", False)
            and callable(getattr(plugin, name, None))
        ):
            return {}
        return opts

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        outer = self._registering
        self._registering = name or self.get_canonical_name(plugin)
        try:
            return super().register(plugin, name)
        finally:
            self._registering = outer

    def unregister(self, plugin: Any = None, name: str | None = None) -> Any:
        registered_as = name if name is not None else self.get_name(plugin)
        removed = super().unregister(plugin, name)
        if registered_as is not None:
            self.sources.pop(registered_as, None)
        return removed

    def _add_plugin_specs(self, namespace: object) -> None:
        owner = self._registering or "?"
        before = self.spec_names()
        try:
            self.add_hookspecs(cast(Any, namespace))  # a module or a class
        except ValueError as e:
            raise ConfigError(f"plugin {owner!r} cannot add hookspecs: {one_line(e)}") from None
        for name in self.spec_names() - before:
            self.spec_owners[name] = owner

    def spec_names(self) -> set[str]:
        """Every hook with a spec: the framework's and those plugins added."""
        return {name for name, caller in self._callers() if caller.has_spec()}

    def _callers(self) -> Iterable[tuple[str, pluggy.HookCaller]]:
        return ((n, c) for n, c in vars(self.hook).items() if not n.startswith("_"))

    def unknown_hooks(self) -> dict[str, list[str]]:
        """Plugin name -> the hooks it implements that nobody declares (and that it did
        not mark ``optionalhook``)."""
        unknown: dict[str, list[str]] = {}
        for name, caller in self._callers():
            if not caller.has_spec():
                for impl in caller.get_hookimpls():
                    if not impl.optionalhook:
                        unknown.setdefault(impl.plugin_name, []).append(name)
        return unknown


def one_line(error: object) -> str:
    """An error's text on one line (pluggy's messages span several)."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=PROJECT))


def _raise(name: str, message: str) -> None:
    raise ConfigError(message)


def build_plugin_manager(
    plugins: Iterable[str] = (),
    blocked: Iterable[str] = (),
    extra: Iterable[Any] = (),
    on_error: ErrorReport | None = None,
) -> PluginManager:
    """A plugin manager with every hookspec, the entry-point plugins (the built-ins are
    entry points of our own distribution, listed once, in pyproject.toml), then ``plugins``
    (module names) and ``extra`` (plugin objects), minus ``blocked`` names.

    A plugin that fails to load or to register, or that implements a hook nobody declares,
    is a :class:`ConfigError`; with ``on_error`` it is reported there instead (one line) and
    left out, so the others still work (what the ``msgbroker`` command line does)."""
    pm = PluginManager()
    report = on_error or _raise
    for name in blocked:
        pm.set_blocked(name)
    seen: set[str] = set()
    for ep in _entry_points():
        if ep.name in seen or pm.is_blocked(ep.name) or pm.is_blocked(ep.value):
            continue
        seen.add(ep.name)
        try:
            module = ep.load()
        except Exception as e:
            _left_out(pm, report, ep.name, f"plugin {ep.name!r} ({ep.value}) failed to load: {e}")
            continue
        dist = ep.dist
        source = PluginSource(
            ep.name,
            ep.value,
            "entry point",
            dist.name if dist else None,
            dist.version if dist else None,
        )
        _register(pm, module, source, report)
    for module_name in plugins:
        if pm.is_blocked(module_name):
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            _left_out(pm, report, module_name, f"cannot import plugin {module_name!r}: {e}")
            continue
        _register(pm, module, PluginSource(module_name, module_name, "--plugin"), report)
    for obj in extra:
        name = pm.get_canonical_name(obj)
        _register(pm, obj, PluginSource(name, _type_name(obj), "object"), report, name=None)
    for name, hooks in pm.unknown_hooks().items():
        what = ", ".join(repr(hook) for hook in hooks)
        _left_out(pm, report, name, f"plugin error: unknown hook {what} in plugin {name!r}")
        pm.unregister(name=name)
    return pm


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _register(
    pm: PluginManager,
    plugin: Any,
    source: PluginSource,
    report: ErrorReport,
    name: str | None = "",
) -> None:
    if pm.is_registered(plugin):
        return
    registered_as = source.name if name == "" else name
    try:
        pm.register(plugin, name=registered_as)
    except (pluggy.PluginValidationError, ValueError, ConfigError) as e:
        if pm.is_registered(plugin):  # a historic call failed half-way
            pm.unregister(plugin)
        text = str(e) if isinstance(e, ConfigError) else f"plugin error: {one_line(e)}"
        _left_out(pm, report, source.name, text)
        return
    pm.sources[pm.get_name(plugin) or source.name] = source


def _left_out(pm: PluginManager, report: ErrorReport, name: str, message: str) -> None:
    pm.problems[name] = message
    report(name, message)
