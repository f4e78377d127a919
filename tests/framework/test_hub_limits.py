"""The hub's limits: subscriptions per peer (topics and patterns together) and topics in
the broker; a refusal changes nothing and is reported."""

from __future__ import annotations

import pytest

from msgbroker.errors import LimitExceeded, NotAllowed
from msgbroker.hub import Hub, HubLimits
from tests.framework.test_hub import peer


def limited_hub(**limits):
    hub = Hub(HubLimits(**limits))
    refused = []
    hub.on_limit = lambda p, e: refused.append((p.identity, e.limit))
    return hub, refused


def test_subscriptions_per_peer_count_topics_and_patterns():
    hub, refused = limited_hub(max_subscriptions=3)
    alice = peer(hub, "alice")
    hub.subscribe(alice, "t1")
    hub.subscribe_pattern(alice, "a/*")
    hub.subscribe(alice, "t2")
    with pytest.raises(LimitExceeded) as raised:
        hub.subscribe(alice, "t3")
    assert raised.value.limit == "max-subscriptions"
    assert isinstance(raised.value, NotAllowed)  # protocols answer it as "not allowed"
    with pytest.raises(LimitExceeded):
        hub.subscribe_pattern(alice, "b/*")
    assert "t3" not in hub.topics and set(alice.subscriptions) == {"t1", "t2"}
    assert refused == [("alice", "max-subscriptions")] * 2
    assert hub.stats.refused == 2
    bob = peer(hub, "bob")  # the limit is per peer
    hub.subscribe(bob, "t3")
    hub.unsubscribe(alice, "t1")  # room again
    hub.subscribe(alice, "t4")


def test_topics_in_the_broker():
    hub, refused = limited_hub(max_topics=2)
    alice, bob = peer(hub, "alice"), peer(hub, "bob")
    hub.subscribe(alice, "t1")
    hub.subscribe(alice, "t2")
    hub.subscribe(bob, "t1")  # an existing topic is not a new one
    with pytest.raises(LimitExceeded) as raised:
        hub.subscribe(bob, "t3")
    assert raised.value.limit == "max-topics"
    assert refused == [("bob", "max-topics")]
    assert set(hub.topics) == {"t1", "t2"} and set(bob.subscriptions) == {"t1"}
    hub.close(alice)  # t2 goes away with its last member
    hub.subscribe(bob, "t3")


def test_zero_is_no_limit():
    hub, refused = limited_hub(max_subscriptions=0, max_topics=0)
    alice = peer(hub, "alice")
    for i in range(500):
        hub.subscribe(alice, f"t{i}")
    assert refused == []


def test_the_topic_table_is_rebuilt_once_a_flood_of_topics_is_gone():
    hub = Hub()
    alice, bob = peer(hub, "alice"), peer(hub, "bob")
    for i in range(10_000):
        hub.subscribe(alice, f"t{i}")
    hub.subscribe(bob, "keep")
    table = hub.topics
    hub.close(alice)
    assert hub.topics is not table  # a fresh, small dict: the big table's memory is freed
    assert set(hub.topics) == {"keep"}
    assert hub.subscribers("keep") == [bob]
