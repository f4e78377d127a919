"""The STMP plugin's own hook, added by :mod:`.plugin` through ``msgbroker_add_hookspecs``.

Implement it in any plugin (registered before or after the STMP plugin); mark the
implementation ``@hookimpl(optionalhook=True)`` if the plugin should also load where STMP
is blocked (``--no-plugin stmp``). The STMP plugin calls it through
:func:`register_stmp_routes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import hookspec

if TYPE_CHECKING:
    from msgbroker import Plugins

    from .router import Router


@hookspec
def msgbroker_register_stmp_routes(router: Router) -> None:
    """Route STMP actions to handlers.

    Call ``router.add(prefix, handler, timeout=30.0)`` with an action (``"10.1.2.3"``) or a
    dotted prefix (``"10.1.0.0/16"``); the longest matching prefix wins. ``handler``
    receives a :class:`msgbroker.plugins.stmp.router.RouteRequest` (session, broker,
    action, encoding, decoded payload) and returns the reply payload, a ``Reply``, a
    Deferred or a coroutine; raising ``STMPStatusError`` answers with its status, any other
    exception with ``0x30``; no answer within ``timeout`` seconds with ``0x34``. Actions in
    ``0.0.0.0/24`` belong to the protocol; the broker's own actions use ``0.0.1.0/24``.
    Called once per broker, when its first STMP listener is built.
    """


def register_stmp_routes(plugins: Plugins, router: Router) -> None:
    """Call ``msgbroker_register_stmp_routes`` on every plugin implementing it."""
    plugins.caller("msgbroker_register_stmp_routes")(router=router)
