"""cluster.changes (msgbroker.clusterwatch): waiting on a node's state without polling —
listeners run after each change, ``when(check)`` fires at the change that makes the check
true, and the Cluster tells it after what comes from its engine and from its timer."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from msgbroker import Broker, BrokerConfig, hookimpl
from msgbroker import clusterwire as wire
from msgbroker.cluster import Cluster
from msgbroker.clusterwatch import ClusterChanges
from msgbroker.engine import EngineContext, EngineSpec


def test_listeners_run_after_each_change_until_stopped() -> None:
    changes = ClusterChanges()
    heard: list[str] = []
    stop_one = changes.listen(lambda: heard.append("one"))
    changes.listen(lambda: heard.append("two"))
    changes.notify()
    assert heard == ["one", "two"]
    stop_one()
    stop_one()  # harmless twice
    changes.notify()
    assert heard == ["one", "two", "two"]
    assert changes.listening == 1


def test_a_listener_that_raises_is_logged_and_the_others_still_run() -> None:
    changes = ClusterChanges()
    heard: list[str] = []
    logged: list[dict[str, Any]] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    changes.listen(broken)
    changes.listen(lambda: heard.append("after"))
    globalLogPublisher.addObserver(logged.append)
    try:
        changes.notify()
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert heard == ["after"]
    failures = [e for e in logged if "log_failure" in e]
    assert len(failures) == 1 and failures[0]["log_failure"].check(RuntimeError)


def test_when_fires_at_once_or_at_the_change_that_makes_the_check_true() -> None:
    changes = ClusterChanges()
    fired: list[object] = []
    changes.when(lambda: True).addCallback(fired.append)
    assert fired == [None] and changes.listening == 0
    state = {"n": 0}
    checks: list[int] = []

    def check() -> bool:
        checks.append(state["n"])
        return state["n"] >= 2

    waiting = changes.when(check)
    waiting.addCallback(fired.append)
    state["n"] = 1
    changes.notify()
    assert fired == [None] and changes.listening == 1
    state["n"] = 2
    changes.notify()
    assert fired == [None, None]
    assert checks == [0, 1, 2]  # checked now and after each change, nothing more
    assert changes.listening == 0  # done: it listens no more
    changes.notify()
    assert checks == [0, 1, 2]


def test_when_cancelled_stops_listening_and_a_failing_check_fails_it() -> None:
    changes = ClusterChanges()
    waiting = changes.when(lambda: False)
    assert changes.listening == 1
    waiting.cancel()
    assert changes.listening == 0
    with pytest.raises(CancelledError):
        waiting.result.raiseException()
    waiting.addErrback(lambda _: None)

    state = {"broken": False}

    def check() -> bool:
        if state["broken"]:
            raise KeyError("gone")
        return False

    failing = changes.when(check)
    state["broken"] = True
    changes.notify()  # the waiter hears of it, notify does not raise
    errors: list[Any] = []
    failing.addErrback(errors.append)
    assert errors[0].check(KeyError) and changes.listening == 0


# -- the Cluster tells its changes


class _Engine:
    """An engine that answers every snapshot with nobody's state, records nothing."""

    def __init__(self, context: EngineContext) -> None:
        self.context = context
        self.snapshots: list[Deferred[dict[str, Any]]] = []

    def snapshot(self, nodes: Any = None) -> Deferred[dict[str, Any]]:
        d: Deferred[dict[str, Any]] = Deferred()
        self.snapshots.append(d)
        return d

    def stop(self) -> Deferred[None]:
        return succeed(None)

    def status(self) -> dict[str, Any]:
        return {}

    def __getattr__(self, name: str) -> Any:
        return lambda *args: True


class _Plugin:
    @hookimpl
    def msgbroker_register_engines(self, register: Any) -> None:
        register(EngineSpec("watched", ("watched",), _Engine, "for this test"))


def _cluster() -> tuple[Cluster, Clock, _Engine]:
    clock = Clock()
    config = BrokerConfig(sections={"cluster": {"url": "watched://x", "heartbeat": 1.0}})
    broker = Broker(config, clock, plugins=(_Plugin(),))
    broker.started()
    cluster = broker.cluster
    assert isinstance(cluster, Cluster)
    engine = cluster.engine
    assert isinstance(engine, _Engine)
    return cluster, clock, engine


def test_the_cluster_tells_connects_snapshots_chunks_losses_and_nodes_gone() -> None:
    cluster, clock, engine = _cluster()
    told: list[tuple[bool, int]] = []
    cluster.changes.listen(lambda: told.append((cluster.connected, len(cluster.view.nodes))))
    cluster.engine_connected()
    assert told == [(True, 0)]
    engine.snapshots.pop().callback({})  # the others' state read: synced
    assert len(told) == 2
    # another node announces itself: known once its own state is read, told each time
    other = wire.header("other", "e1") + wire.body(wire.JOIN)
    cluster.announced(other)
    cluster.chunk_done()
    assert told[-1] == (True, 1) and len(told) == 3
    engine.snapshots.pop().callback({"other": {}})  # may come on a timer (NATS): told too
    assert len(told) == 4 and not cluster.view.nodes["other"].syncing
    before = len(told)
    clock.advance(2.0)  # no heartbeat from "other" for longer than the timeout: gone
    assert told[-1] == (True, 0) and len(told) > before
    cluster.engine_lost("test")
    assert told[-1] == (False, 0)


def test_when_waits_for_a_remote_interest_through_the_cluster() -> None:
    cluster, _clock, engine = _cluster()
    cluster.engine_connected()
    engine.snapshots.pop().callback({"other": {wire.member_field("news", "bob"):
                                               wire.member_value("ssmp", False)}})
    fired: list[object] = []
    cluster.changes.when(lambda: cluster.interested("sport")).addCallback(fired.append)
    assert not fired
    change = [[wire.member_field("sport", "bob"), wire.member_value("ssmp", False)]]
    cluster.announced(wire.header("other", "e1") + wire.body(wire.CHANGES, change))
    assert not fired  # applied, but told after the chunk
    cluster.chunk_done()
    assert fired == [None]
