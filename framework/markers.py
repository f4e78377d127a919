"""The two pluggy markers of the ``msgbroker`` project: :data:`hookimpl` implements a hook,
:data:`hookspec` declares one (in ``framework/hookspecs.py``, or in a plugin's own hookspec
module that it adds through ``msgbroker_add_hookspecs``). Both are re-exported by
:mod:`msgbroker`."""

from __future__ import annotations

import pluggy

PROJECT = "msgbroker"

hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)
