"""A node that reads behind does not take its live peers for gone (framework/
clusterliveness.py): their data is a sign of life, and while its own heartbeats have not
come back it gives every peer that much longer; a node reading in time still sees a dead
peer gone within the node timeout plus a quarter heartbeat. Driven sans-IO on a fake
clock, with an engine that records what it is asked (heartbeat 1 s, timeout 1.5 s)."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from msgbroker import Broker, BrokerConfig
from msgbroker import clusterwire as wire
from msgbroker.cluster import Cluster
from msgbroker.clusterliveness import MAX_TIMEOUTS, ReadLag
from msgbroker.message import Kind, Message
from tests.cluster.fake_engine import FakeEnginePlugin

PEER = wire.header("peer", "e1")


def _node() -> tuple[Cluster, Clock]:
    clock = Clock()
    config = BrokerConfig(auth=("open",), sections={"cluster": {"url": "fake://x"}})
    broker = Broker(config, clock, plugins=(FakeEnginePlugin(),))
    broker.started()
    cluster = broker.cluster
    assert cluster is not None
    cluster.engine_connected()
    cluster.announced(PEER + wire.body(wire.HEARTBEAT))  # the peer is known
    assert "peer" in cluster.view.nodes
    return cluster, clock


def _own_come_back(cluster: Cluster) -> None:
    """What this node announced comes back to it (it has read up to now)."""
    engine: Any = cluster.engine
    for data in engine.announced:
        cluster.announced(data)
    engine.announced.clear()


def _run(cluster: Cluster, clock: Clock, seconds: float, *, reading: bool) -> float:
    """Advance by quarter heartbeats for ``seconds``, this node reading its own
    announcements back each time (``reading``) or not; the time the peer was seen gone
    (-1: not)."""
    for step in range(1, round(seconds * 4) + 1):
        clock.advance(0.25)
        if reading:
            _own_come_back(cluster)
        if "peer" not in cluster.view.nodes:
            return step * 0.25
    return -1.0


def test_a_node_reading_in_time_sees_a_silent_peer_gone_within_the_timeout() -> None:
    cluster, clock = _node()
    gone_at = _run(cluster, clock, 5, reading=True)
    assert 1.5 < gone_at <= 1.75  # node timeout + a quarter heartbeat: under 2 heartbeats


def test_a_node_reading_behind_gives_its_peers_as_much_longer() -> None:
    cluster, clock = _node()
    # its own heartbeats stay unread for 4 s: the peer's (behind them) too
    assert _run(cluster, clock, 4, reading=False) == -1.0
    assert cluster.read_lag.behind(clock.seconds()) > 3
    # it catches up: its beats come back, the peer's did not: now the peer is gone
    _own_come_back(cluster)
    assert _run(cluster, clock, 0.5, reading=True) > 0


def test_a_node_whose_own_beats_never_come_back_still_sees_dead_peers_go() -> None:
    cluster, clock = _node()
    limit = 1.5 + MAX_TIMEOUTS * 1.5
    gone_at = _run(cluster, clock, limit + 2, reading=False)
    assert limit - 1 < gone_at <= limit + 0.25


def test_a_peers_publications_are_a_sign_of_life() -> None:
    cluster, clock = _node()
    item = wire.message_item(Message(Kind.MCAST, "alice", "ssmp", "t", b"x"))
    for _ in range(5 * 4):  # 5 s of data, no heartbeat
        clock.advance(0.25)
        _own_come_back(cluster)
        cluster.delivered(PEER + wire.body(wire.MESSAGES, [item]))
        assert "peer" in cluster.view.nodes
    # a restarted peer's (another epoch) data is no sign of the old one's life
    stale = wire.header("peer", "e2") + wire.body(wire.MESSAGES, [item])
    for _ in range(8):
        clock.advance(0.25)
        _own_come_back(cluster)
        cluster.delivered(stale)
    assert "peer" not in cluster.view.nodes


def test_read_lag_allows_nothing_in_time_and_is_bounded() -> None:
    lag = ReadLag(heartbeat=1.0, timeout=1.5)
    assert lag.allowance(10.0) == 0.0
    lag.sent(10.0)
    assert lag.allowance(10.2) == 0.0  # a beat normally comes back within a round trip
    assert lag.allowance(13.0) == 4.0  # 3 s behind, + the heartbeat it may lag more
    assert lag.allowance(100.0) == MAX_TIMEOUTS * 1.5
    lag.heard()
    assert lag.allowance(100.0) == 0.0
    lag.sent(100.0)
    lag.reset()
    assert lag.behind(200.0) == 0.0


def test_the_log_says_which_nodes_a_node_sees_and_who_joins() -> None:
    from twisted.logger import formatEvent, globalLogPublisher

    seen: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        cluster, _clock = _node()
        cluster.announced(wire.header("third", "e3") + wire.body(wire.JOIN))
    finally:
        globalLogPublisher.removeObserver(seen.append)
    lines = [formatEvent(event) for event in seen]
    assert "cluster: 0 other node(s): none" in lines  # the snapshot at connect: alone
    assert "cluster: node peer joined" in lines
    assert "cluster: node third joined" in lines
