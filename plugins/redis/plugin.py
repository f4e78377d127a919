"""Registers the Redis engine: ``--cluster redis://HOST:PORT[/DB]`` (``rediss://`` for TLS).
Its module (and hiredis) is imported only when a broker uses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.engine import EngineContext, EngineSpec

if TYPE_CHECKING:
    from .engine import RedisEngine


def build(context: EngineContext) -> RedisEngine:
    from .engine import RedisEngine

    return RedisEngine(context)


REDIS = EngineSpec(
    "redis", ("redis", "rediss"), build, "Redis pub/sub and keys (redis-server 7)"
)


@hookimpl
def msgbroker_register_engines(register: Callable[[EngineSpec], None]) -> None:
    register(REDIS)
