"""Two nodes claiming one identity at once, on an engine whose announcements keep only each
sender's order (``EngineSpec(ordered=False)``: NATS): one holder stays, decided by node
name; on an ordered engine (Redis) the claim that came first in the one order still loses.
And an engine that cannot carry queue groups has queue subscriptions refused. Driven
sans-IO on a fake clock, with an engine that records what it is asked."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock

from msgbroker import Broker, BrokerConfig
from msgbroker import clusterwire as wire
from msgbroker.clusterview import RemoteNode, RemoteView
from msgbroker.errors import NotAllowed
from msgbroker.testing import SessionDriver, drive
from tests.cluster.fake_engine import FakeEnginePlugin


def _broker(ordered: bool, node: str, no_queue_groups: str = "") -> Broker:
    config = BrokerConfig(auth=("open",), sections={"cluster": {"url": "fake://x"}})
    broker = Broker(config, Clock(), plugins=(FakeEnginePlugin(ordered, no_queue_groups),))
    broker.node_name = node  # type: ignore[attr-defined]
    broker.started()
    assert broker.cluster is not None
    broker.cluster.engine_connected()
    return broker


def _login(broker: Broker, identity: str) -> SessionDriver:
    session = drive(broker, "ssmp")
    session.feed(b"LOGIN %s open\n" % identity.encode())
    assert session.received() == b"200\n"
    return session


def _claim_from(broker: Broker, node: str, identity: str) -> None:
    """``node`` announces that it holds ``identity`` (after joining, as a node does)."""
    cluster = broker.cluster
    assert cluster is not None
    head = wire.header(node, "epoch-" + node)
    cluster.announced(head + wire.body(wire.HEARTBEAT))  # known, and its state read
    cluster.announced(head + wire.body(wire.CHANGES, [[wire.identity_field(identity), b""]]))


def _own_claims_come_back(broker: Broker) -> None:
    cluster = broker.cluster
    assert cluster is not None
    cluster.flush()
    engine: Any = cluster.engine
    for data in engine.announced:
        cluster.announced(data)
    engine.announced.clear()


@pytest.mark.parametrize(
    ("ordered", "other", "kicked"),
    [
        (False, "node-z", True),  # unordered: the greater name wins
        (False, "node-a", False),
        (True, "node-z", False),  # ordered: their claim came before ours, which wins
        (True, "node-a", False),
    ],
)
def test_claims_crossing_before_ours_came_back(ordered: bool, other: str, kicked: bool) -> None:
    broker = _broker(ordered, "node-m")
    dora = _login(broker, "dora")  # our claim: announced, not yet come back
    _claim_from(broker, other, "dora")
    assert dora.closed is kicked
    assert ("dora" in broker.hub.identities) is not kicked


@pytest.mark.parametrize("ordered", [False, True])
def test_a_claim_after_ours_came_back_always_wins(ordered: bool) -> None:
    broker = _broker(ordered, "node-m")
    dora = _login(broker, "dora")
    _own_claims_come_back(broker)
    _claim_from(broker, "node-a", "dora")
    assert dora.closed and "dora" not in broker.hub.identities


def test_the_view_knows_the_other_holder_when_one_of_two_releases() -> None:
    view = RemoteView()
    a = view.nodes["a"] = RemoteNode("a", "e", 0.0)
    b = view.nodes["b"] = RemoteNode("b", "e", 0.0)
    field = wire.identity_field("dora")
    view.apply(a, [(field, b"")])
    view.apply(b, [(field, b"")])  # crossing claims: both hold it for a moment
    assert view.identities["dora"] == "b"
    view.apply(b, [(field, None)])  # b gave way: a still holds it
    assert view.identities["dora"] == "a"
    view.apply(a, [(field, None)])
    assert "dora" not in view.identities


def test_an_engine_without_queue_groups_refuses_queue_subscriptions() -> None:
    broker = _broker(False, "node-m", no_queue_groups="queue groups need the Redis engine")
    worker = _login(broker, "worker")
    hub = broker.hub
    with pytest.raises(NotAllowed, match="queue groups need the Redis engine"):
        hub.subscribe(worker.session, "jobs", queue="workers")
    hub.subscribe(worker.session, "jobs")  # plain subscriptions are fine
    assert "jobs" in hub.topics
