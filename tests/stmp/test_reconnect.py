"""STMP clients that reconnect (``reconnect=``), over TCP and WebSocket, against a real broker
stopped and started again on the same ports: the version check, the login and the
subscriptions (presence included) again, told through the policy's ``on_lost`` and
``on_restored``. The waits are tests/clientkit/test_reconnect.py's, on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from msgbroker.plugins.stmp.client import (
    BlockingSTMPClient,
    Delivery,
    Reconnect,
    ReconnectingSTMPClient,
    STMPConnectionClosed,
    STMPError,
    connect,
)
from tests.ssmp.e2e_support import WAIT, Inbox, RestartableBroker, restartable_broker

LISTENERS = ("stmp=tcp:0:interface=127.0.0.1", "stmp-ws=tcp:0:interface=127.0.0.1")


@pytest.fixture(params=["tcp", "ws"])
def ws(request: Any) -> bool:
    return bool(request.param == "ws")


def port(broker: RestartableBroker, ws: bool) -> int:
    return broker.port("stmp-ws" if ws else "stmp")


def quick(news: Any = None) -> Reconnect:
    return Reconnect(initial=0.05, max_delay=0.5, on_lost=news, on_restored=news)


def publish(broker: RestartableBroker, topic: str, data: bytes) -> None:
    with BlockingSTMPClient("127.0.0.1", broker.port("stmp"), "pub", timeout=WAIT) as client:
        client.publish(topic, data)


def test_blocking_client_logs_in_and_subscribes_again_after_a_restart(ws):
    news: list[Any] = []
    with restartable_broker(LISTENERS) as broker:
        client = BlockingSTMPClient(
            "127.0.0.1", port(broker, ws), "alice", ws=ws, timeout=WAIT,
            reconnect=quick(news.append),
        )  # fmt: skip
        client.subscribe("news")
        client.subscribe("hall", presence=True)
        publish(broker, "news", b"before")
        assert client.next_delivery(WAIT) == Delivery("pub", "mcast", "news", b"before")

        broker.stop()
        broker.start()
        client.ping()  # finds the connection lost: reconnects first
        assert [type(n).__name__ for n in news] == ["STMPConnectionClosed", "Restored"]
        assert news[1].replayed == ("login alice", "subscribe news", "subscribe hall")
        assert client.identity == "alice" and client.stmp_version == (0, 1)
        publish(broker, "news", b"after")
        assert client.next_delivery(WAIT) == Delivery("pub", "mcast", "news", b"after")
        with BlockingSTMPClient("127.0.0.1", broker.port("stmp"), "bob", timeout=WAIT) as bob:
            bob.subscribe("hall")
        assert client.next_delivery(WAIT) == Delivery("bob", "subscribe", "hall", b"")
        client.close()


def test_blocking_request_while_the_broker_is_away_waits_up_to_its_timeout(ws):
    with restartable_broker(LISTENERS) as broker:
        client = BlockingSTMPClient(
            "127.0.0.1", port(broker, ws), "carol", ws=ws, timeout=0.5,
            reconnect=Reconnect(initial=0.05, max_delay=0.1),  # attempts well within 0.5 s
        )  # fmt: skip
        broker.stop()
        with pytest.raises(STMPConnectionClosed, match=r"did not come back within 0\.5 s"):
            client.publish("t", b"never sent")  # the loss is seen before it is sent
        broker.start()
        assert client.publish("t", b"sent") is None
        client.close()


def test_blocking_client_gives_up_when_a_subscription_is_refused_again():
    with restartable_broker(LISTENERS) as broker:
        client = BlockingSTMPClient(
            "127.0.0.1", broker.port("stmp"), "dave", timeout=WAIT, reconnect=quick()
        )
        client.subscribe("room")
        client.subscribe("hall")
        broker.stop()
        broker.config = {**broker.config, "max_subscriptions": 1}  # the restarted broker's
        broker.start()
        with pytest.raises(STMPError) as refused:
            client.ping()
        assert refused.value.status == 0x23  # Forbidden: the second one is over the limit
        assert not client.reconnecting
        with pytest.raises(STMPConnectionClosed):
            client.ping()


def test_twisted_client_logs_in_and_subscribes_again_after_a_restart(ws):
    with restartable_broker(LISTENERS) as broker:
        deliveries, events = Inbox(), Inbox()
        client = broker.call(
            connect, broker.reactor, "127.0.0.1", port(broker, ws), ws=ws, identity="erin",
            reconnect=quick(events), on_delivery=deliveries,
        )  # fmt: skip
        assert isinstance(client, ReconnectingSTMPClient)
        broker.call(client.subscribe, "news")
        publish(broker, "news", b"before")
        assert broker.call(deliveries.get).data == b"before"

        broker.stop()
        assert isinstance(broker.call(events.get), STMPConnectionClosed)
        with pytest.raises(STMPConnectionClosed, match="not connected: reconnecting"):
            broker.call(client.publish, "news", b"while away")
        broker.start()
        restored = broker.call(events.get)
        assert restored.replayed == ("subscribe news",)  # the login is connect's own
        publish(broker, "news", b"after")
        assert broker.call(deliveries.get).data == b"after"
        assert client.identity == "erin"
        broker.call(client.close)


def test_twisted_first_login_refused_is_not_tried_again(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret")
    with restartable_broker(LISTENERS, auth=("secret",), secret_file=str(secret)) as broker:
        with pytest.raises(STMPError) as refused:
            broker.call(connect, broker.reactor, "127.0.0.1", broker.port("stmp"),
                        identity="x", reconnect=True)  # fmt: skip
        assert refused.value.status == 0x21
