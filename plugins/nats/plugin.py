"""Registers the NATS engine: ``--cluster nats://HOST:PORT`` (``tls://`` or ``nats+tls://``
for TLS). Its modules are imported only when a broker uses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.engine import EngineContext, EngineSpec

if TYPE_CHECKING:
    from .engine import NatsEngine


def build(context: EngineContext) -> NatsEngine:
    from .engine import NatsEngine

    return NatsEngine(context)


NATS = EngineSpec(
    "nats",
    ("nats", "tls", "nats+tls"),
    build,
    "NATS subjects (nats-server 2)",
    # NATS keeps each publisher's order, not one order of all of them
    ordered=False,
    no_queue_groups="queue groups need the Redis engine: this cluster runs on NATS, which "
    "does not carry them across nodes (docs/cluster.md)",
)


@hookimpl
def msgbroker_register_engines(register: Callable[[EngineSpec], None]) -> None:
    register(NATS)
