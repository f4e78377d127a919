"""The Micromessage2 plugin's own hook, added by :mod:`.plugin` through
``msgbroker_add_hookspecs``.

Implement it in any plugin (registered before or after the Micromessage2 plugin); mark the
implementation ``@hookimpl(optionalhook=True)`` if the plugin should also load where
Micromessage2 is blocked (``--no-plugin mm2``), as the built-in extensions
(:mod:`.builtin`) do. The plugin calls it through :func:`register_mm2_extensions`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from msgbroker import hookspec

if TYPE_CHECKING:
    from msgbroker import Plugins

    from .extensions import ExtensionSpec


@hookspec
def msgbroker_register_mm2_extensions(register: Callable[[ExtensionSpec], None]) -> None:
    """Add Micromessage2 extensions.

    Call ``register(spec)`` with a :class:`msgbroker.plugins.mm2.extensions.ExtensionSpec`:
    the extension's name (``[a-z0-9-]+``; vendor extensions start with ``x-``), a factory
    that makes its per-connection handler from an ``ExtensionContext``, whether the server
    offers or requires it in the handshake, and the COMMAND names it handles. The handler
    sees its EXTENSION frames, its commands, and (when it overrides those methods) every
    MESSAGE the client sends and every one it is sent. Two extensions with one name, or
    two claiming one command, are a configuration error. Called once per broker, when its
    first ``mm2`` listener is built.
    """


def register_mm2_extensions(plugins: Plugins, register: Callable[[ExtensionSpec], None]) -> None:
    """Call ``msgbroker_register_mm2_extensions`` on every plugin implementing it."""
    plugins.caller("msgbroker_register_mm2_extensions")(register=register)
