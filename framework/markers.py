"""The two pluggy markers of the ``msgbroker`` project: :data:`hookimpl` implements a hook,
:data:`hookspec` declares one (in ``framework/hookspecs.py``, or in a plugin's own hookspec
module that it adds through ``msgbroker_add_hookspecs``). Both are re-exported by
:mod:`msgbroker`, as is :func:`per_topic`, which says more of an authorization hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pluggy

PROJECT = "msgbroker"

hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)

#: the attribute :func:`per_topic` sets on an implementation
PER_TOPIC = "msgbroker_per_topic"
_Function = TypeVar("_Function", bound=Callable[..., Any])


def per_topic(function: _Function) -> _Function:
    """Mark a ``msgbroker_authorize`` implementation whose answer depends on nothing but the
    session, the action and the topic, for as long as the broker's hooks stay as they are
    (``hub.generation``): the protocols may then ask it once for many requests alike (a
    run of pipelined publishes to one topic is authorized, or refused, as a whole) and
    remember its answer for a topic (sbus's route cache) until the generation changes.
    Without it, every request is asked about. Put it under ``@hookimpl``."""
    setattr(function, PER_TOPIC, True)
    return function
