"""Micromessage2 clients that reconnect (``reconnect=``), against a real broker stopped and
started again on the same port: the handshake again, then every subscription as it was made
(filters and queue groups included) and a round trip to itself, so that they are in force
when ``on_restored`` is told. The waits are tests/clientkit/test_reconnect.py's."""

from __future__ import annotations

from typing import Any

import pytest

from msgbroker.plugins.mm2.client import (
    BlockingMM2Client,
    MM2ConnectionClosed,
    Reconnect,
    ReconnectingMM2Client,
    connect,
)
from tests.mm2.client_support import settle
from tests.ssmp.e2e_support import WAIT, Inbox, RestartableBroker, restartable_broker

LISTENERS = ("mm2=tcp:0:interface=127.0.0.1",)


def quick(news: Any = None) -> Reconnect:
    return Reconnect(initial=0.05, max_delay=0.5, on_lost=news, on_restored=news)


def client(broker: RestartableBroker, identity: str, **options: Any) -> BlockingMM2Client:
    return BlockingMM2Client("127.0.0.1", broker.port("mm2"), identity, timeout=WAIT, **options)


def test_blocking_client_subscribes_again_with_its_filters_after_a_restart():
    news: list[Any] = []
    with restartable_broker(LISTENERS) as broker:
        alice = client(broker, "alice", reconnect=quick(news.append))
        alice.subscribe("prices", filters=["price>=N10"])
        alice.subscribe("news")
        alice.unsubscribe("news")
        settle(alice)

        broker.stop()
        broker.start()
        assert alice.next_message(0.3) is None  # reconnected meanwhile
        assert [type(n).__name__ for n in news] == ["MM2ConnectionClosed", "Restored"]
        assert news[1].replayed == ("subscribe prices", "sync")
        with client(broker, "pub") as pub:
            pub.publish("prices", b"cheap", {"price": 5})
            pub.publish("prices", b"dear", {"price": 15})
            pub.wait_acked()
        message = alice.next_message(WAIT)
        assert message is not None and message.payload == b"dear"
        settle(alice)  # and nothing else came
        alice.close()


def test_blocking_client_joins_its_queue_group_again():
    with restartable_broker(LISTENERS) as broker:
        alice = client(broker, "alice", reconnect=quick())
        alice.subscribe("jobs", queue="workers")
        settle(alice)
        broker.stop()
        broker.start()
        assert alice.next_message(0.3) is None  # reconnected meanwhile
        with client(broker, "bob") as bob, client(broker, "boss") as boss:
            bob.subscribe("jobs", queue="workers")
            settle(bob)
            for n in range(6):  # within each member's window: none is held back
                boss.publish("jobs", b"job %d" % n)
            boss.wait_acked()
            got = [m.payload for m in _all(alice)] + [m.payload for m in _all(bob)]
        # one member of the group got each job: alice is in the group, not beside it
        assert sorted(got) == sorted(b"job %d" % n for n in range(6))
        alice.close()


def _all(reader: BlockingMM2Client) -> list[Any]:
    """What ``reader`` got, up to its own round trip."""
    identity = reader.session.hello.identity
    reader.unicast(identity, b"end")
    got = []
    while (message := reader.next_message(WAIT)) is not None:
        if message.destination == f"@{identity}":
            return got
        got.append(message)
    raise AssertionError("the round trip did not come back")


def test_a_publish_while_the_broker_is_away_fails_after_the_timeout():
    with restartable_broker(LISTENERS) as broker:
        alice = BlockingMM2Client(
            "127.0.0.1", broker.port("mm2"), "alice", timeout=0.3,
            reconnect=Reconnect(initial=0.05, max_delay=0.1),  # attempts well within 0.3 s
        )  # fmt: skip
        broker.stop()
        with pytest.raises(MM2ConnectionClosed, match=r"did not come back within 0\.3 s"):
            alice.publish("t", b"never sent")
        broker.start()
        assert alice.publish("t", b"sent") == 1  # the first of the new connection
        alice.close()


def test_twisted_client_subscribes_again_after_a_restart():
    with restartable_broker(LISTENERS) as broker:
        messages, events = Inbox(), Inbox()
        alice = broker.call(
            connect, broker.reactor, "127.0.0.1", broker.port("mm2"), identity="alice",
            reconnect=quick(events), on_message=messages,
        )  # fmt: skip
        assert isinstance(alice, ReconnectingMM2Client)
        broker.call(alice.subscribe, "prices", None, ["price>=N10"])

        broker.stop()
        assert isinstance(broker.call(events.get), MM2ConnectionClosed)
        with pytest.raises(MM2ConnectionClosed, match="not connected: reconnecting"):
            broker.call(alice.publish, "prices", b"while away")
        broker.start()
        assert broker.call(events.get).replayed == ("subscribe prices", "sync")
        with client(broker, "pub") as pub:
            pub.publish("prices", b"cheap", {"price": 5})
            pub.publish("prices", b"dear", {"price": 15})
            pub.wait_acked()
        assert broker.call(messages.get).payload == b"dear"
        # seq 2 on the new connection: 1 was the restore's round trip to itself
        assert broker.call(alice.publish, "prices", b"mine", {"price": 20}) == 2
        broker.call(alice.when_acked)
        broker.call(alice.close)
        assert alice.closed


def test_a_reconnecting_twisted_client_acknowledges_by_itself():
    with restartable_broker(LISTENERS) as broker, pytest.raises(ValueError, match="auto_ack"):
        connect(broker.reactor, "127.0.0.1", broker.port("mm2"), identity="x",
                reconnect=True, auto_ack=False)  # fmt: skip
