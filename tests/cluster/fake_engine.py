"""An engine that records what a node asks of it, for the cluster's sans-IO tests on a
fake clock (tests/cluster/test_unordered_claims.py, test_liveness.py): it takes
everything, keeps what the node announces, and every other node's stored state is empty."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import succeed

from msgbroker import hookimpl
from msgbroker.engine import EngineContext, EngineSpec


class RecordingEngine:
    """Takes everything; keeps this node's announcements in :attr:`announced`."""

    def __init__(self, context: EngineContext) -> None:
        self.context = context
        self.announced: list[bytes] = []

    def announce(self, data: bytes, changes: Any) -> bool:
        self.announced.append(data)
        return True

    def snapshot(self, nodes: Any = None) -> Any:
        return succeed({})

    def status(self) -> dict[str, Any]:
        return {"connected": True, "buffered": 0}

    def __getattr__(self, name: str) -> Any:
        return lambda *args: True


class FakeEnginePlugin:
    """Registers :class:`RecordingEngine` as the ``fake`` engine (``fake://`` URLs)."""

    def __init__(self, ordered: bool = True, no_queue_groups: str = "") -> None:
        self.spec = EngineSpec("fake", ("fake",), RecordingEngine, "", ordered, no_queue_groups)

    @hookimpl
    def msgbroker_register_engines(self, register: Any) -> None:
        register(self.spec)
