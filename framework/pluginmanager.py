"""The plugin manager: built-ins and third-party plugins, found the same way.

Built-in plugins (the protocols and auth schemes in ``msgbroker.plugins``) are declared in
the ``msgbroker`` entry-point group of our own distribution, exactly like a third-party
plugin's; ``--plugin MODULE`` adds a module by import name, ``--no-plugin NAME`` blocks a
plugin by its entry-point name (or module name).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Iterable
from typing import Any

import pluggy

from . import hookspecs
from .errors import ConfigError

PROJECT = "msgbroker"
log = logging.getLogger(__name__)


class PluginManager(pluggy.PluginManager):
    """A pluggy manager that also accepts undecorated ``msgbroker_*`` methods of
    :class:`msgbroker.Broker` subclasses (subclass hooks)."""

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


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=PROJECT))


def build_plugin_manager(
    plugins: Iterable[str] = (), blocked: Iterable[str] = (), extra: Iterable[Any] = ()
) -> PluginManager:
    """A plugin manager with every hookspec, the entry-point plugins (the built-ins are
    entry points of our own distribution, listed once, in pyproject.toml), then ``plugins``
    (module names) and ``extra`` (plugin objects), minus ``blocked`` names."""
    pm = PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
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
            raise ConfigError(f"plugin {ep.name!r} ({ep.value}) failed to load: {e}") from None
        if not pm.is_registered(module):
            pm.register(module, name=ep.name)
    for module_name in plugins:
        if pm.is_blocked(module_name):
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"cannot import plugin {module_name!r}: {e}") from None
        if not pm.is_registered(module):
            pm.register(module, name=module_name)
    for obj in extra:
        pm.register(obj)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        raise ConfigError(f"plugin error: {e}") from None
    return pm


def has_implementations(pm: pluggy.PluginManager, hook_name: str) -> bool:
    """True when some plugin implements ``hook_name`` (resolved once, not per message)."""
    return bool(getattr(pm.hook, hook_name).get_hookimpls())
