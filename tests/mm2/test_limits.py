"""Micromessage2 and the subscription limits: a ``subscribe`` over ``max-subscriptions``
or ``max-topics`` gets the "not allowed" ERROR frame, then the close, and nobody else
notices (docs/mm2.md, "Limits and dead peers: why")."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig
from msgbroker.filters import Filter
from msgbroker.plugins.mm2.codec import ErrorFrame, MessageFrame
from msgbroker.testing import make_broker
from tests.mm2.test_e2e import RawClient
from tests.mm2.test_protocol import client
from tests.ssmp.e2e_support import parse_address, running_broker

# -- subscriptions over a limit -----------------------------------------------------------------


@pytest.fixture(scope="module")
def limited():
    with running_broker(("mm2=tcp:0:interface=127.0.0.1",), max_subscriptions=2) as broker:
        yield broker


def test_e2e_a_third_subscription_gets_the_not_allowed_error_and_others_go_on(limited):
    port = parse_address(limited.service.broker.listening[0][1])[1]
    bystander = RawClient(port, "bystander")
    bystander.subscribe("a")
    bystander.subscribe("b")
    assert bystander.sync("bystander") == []  # seq 1
    greedy = RawClient(port, "greedy")
    greedy.subscribe("a")
    greedy.subscribe("b")
    greedy.subscribe("c")
    assert greedy.next_frame() == ErrorFrame(
        "not allowed to subscribe to 'c': max-subscriptions reached: 2 held"
    )
    with pytest.raises(ConnectionError):  # then the broker closed it
        greedy.next_frame()
    greedy.close()
    # the bystander keeps its subscriptions, and a newcomer may hold two
    newcomer = RawClient(port, "newcomer")
    newcomer.subscribe("b")
    newcomer.subscribe("c")
    assert newcomer.sync("newcomer") == []
    publisher = RawClient(port, "publisher")
    publisher.publish("a", b"1")
    publisher.publish("b", b"2")
    publisher.publish("c", b"3")
    assert [bystander.next_frame(), bystander.next_frame()] == [
        MessageFrame(2, "a", b"1"),
        MessageFrame(3, "b", b"2"),
    ]
    assert [newcomer.next_frame(), newcomer.next_frame()] == [
        MessageFrame(2, "b", b"2"),
        MessageFrame(3, "c", b"3"),
    ]
    hub = limited.service.broker.hub
    assert limited.thread.call(lambda: (hub.stats.refused, sorted(hub.topics))) == (
        1,
        ["a", "b", "c"],
    )
    for raw in (bystander, newcomer, publisher):
        raw.close()


def test_subscribing_again_at_the_limit_replaces_and_is_not_refused():
    broker = make_broker(BrokerConfig(auth=("open",), max_subscriptions=2))
    sub = client(broker, "sub")
    sub.subscribe("a")
    sub.subscribe("b")
    sub.subscribe("a", filters=[Filter("n", ">", 1)])  # a replacement, not a third
    assert not sub.conn.closed
    pub = client(broker, "pub")
    pub.publish("a", b"small", n=1)
    pub.publish("a", b"big", n=2)
    assert sub.received() == [MessageFrame(1, "a", b"big", {"n": 2})]


def test_a_topic_over_max_topics_is_refused_the_same_way_and_existing_ones_stay_open():
    broker = make_broker(BrokerConfig(auth=("open",), max_topics=1))
    first = client(broker, "first")
    first.subscribe("x")
    second = client(broker, "second")
    second.subscribe("x")  # an existing topic: fine
    second.subscribe("y")
    assert second.received() == [
        ErrorFrame("not allowed to subscribe to 'y': max-topics reached: 1 topics")
    ]
    assert second.conn.closed
    assert not first.conn.closed
    assert list(broker.hub.topics) == ["x"]
