"""SSMP clients that reconnect (``reconnect=``), against a real broker stopped and started
again on the same port: logged in and subscribed again (presence included), told through
the policy's ``on_lost`` and ``on_restored``; a refused login ends it. The waits themselves
are tests/clientkit/test_reconnect.py's, on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.error import ConnectError

from msgbroker.plugins.ssmp.client import (
    BlockingSSMPClient,
    Delivery,
    Presence,
    Reconnect,
    ReconnectingSSMPClient,
    SSMPConnectionClosed,
    SSMPError,
    connect,
)
from tests.ssmp.e2e_support import WAIT, Inbox, RestartableBroker, restartable_broker

SECRET = b"s3cret"


def quick(news: list[Any] | None = None, **settings: Any) -> Reconnect:
    """A policy with short waits, telling ``news`` what happens."""
    told = news.append if news is not None else None
    return Reconnect(initial=0.05, max_delay=0.5, on_lost=told, on_restored=told, **settings)


def publish(broker: RestartableBroker, topic: str, payload: bytes) -> None:
    with BlockingSSMPClient("127.0.0.1", broker.port(), "pub", timeout=WAIT) as client:
        client.mcast(topic, payload)


def test_blocking_client_logs_in_and_subscribes_again_after_a_restart():
    news: list[Any] = []
    with restartable_broker() as broker:
        client = BlockingSSMPClient(
            "127.0.0.1", broker.port(), "alice", timeout=WAIT, reconnect=quick(news)
        )
        client.subscribe("news")
        client.subscribe("hall", presence=True)
        client.unsubscribe("news")
        client.subscribe("news")
        publish(broker, "news", b"before")
        assert client.next_event(WAIT) == Delivery("pub", "MCAST", "news", b"before")

        broker.stop()
        broker.start()
        client.ping()  # reconnects first: logged in and subscribed again
        assert not client.reconnecting
        assert [type(n).__name__ for n in news] == ["SSMPConnectionClosed", "Restored"]
        assert news[1].replayed == ("login alice", "subscribe hall", "subscribe news")
        publish(broker, "news", b"after")
        assert client.next_event(WAIT) == Delivery("pub", "MCAST", "news", b"after")
        with BlockingSSMPClient("127.0.0.1", broker.port(), "bob", timeout=WAIT) as bob:
            bob.subscribe("hall")  # presence was asked for again
        assert client.next_event(WAIT) == Presence("bob", "hall", True, False)
        client.close()


def test_blocking_next_event_reconnects_and_goes_on_waiting():
    with restartable_broker() as broker:
        client = BlockingSSMPClient(
            "127.0.0.1", broker.port(), "carol", timeout=WAIT, reconnect=quick()
        )
        client.subscribe("t")
        broker.stop()
        assert client.next_event(0) is None  # finds it lost; the broker is not back
        assert client.reconnecting
        broker.start()
        assert client.next_event(0.3) is None  # reconnected meanwhile, nothing came
        assert not client.reconnecting
        publish(broker, "t", b"x")
        assert client.next_event(WAIT) == Delivery("pub", "MCAST", "t", b"x")
        client.close()


def test_blocking_request_while_the_broker_is_away_fails_after_its_timeout():
    with restartable_broker() as broker:
        client = BlockingSSMPClient(
            "127.0.0.1", broker.port(), "dave", timeout=0.3,
            reconnect=Reconnect(initial=0.05, max_delay=0.1),  # attempts well within 0.3 s
        )  # fmt: skip
        broker.stop()
        with pytest.raises(SSMPConnectionClosed):
            client.mcast("t", b"lost")  # in flight, or its connection found lost
        with pytest.raises(SSMPConnectionClosed, match=r"did not come back within 0\.3 s"):
            client.mcast("t", b"later")
        broker.start()
        client.mcast("t", b"now")  # reconnects first, then sends
        client.close()


def test_blocking_client_gives_up_when_the_broker_refuses_the_login_again(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    with restartable_broker() as broker:
        client = BlockingSSMPClient(
            "127.0.0.1", broker.port(), "erin", timeout=WAIT, reconnect=quick()
        )
        broker.stop()
        broker.config = {"auth": ("secret",), "secret_file": str(secret)}
        broker.start()
        with pytest.raises(SSMPError) as refused:
            client.ping()
        assert refused.value.code == 401
        assert not client.reconnecting
        with pytest.raises(SSMPConnectionClosed):
            client.ping()


def test_twisted_client_logs_in_and_subscribes_again_after_a_restart():
    with restartable_broker() as broker:
        messages, events = Inbox(), Inbox()
        policy = Reconnect(initial=0.05, max_delay=0.5, on_lost=events, on_restored=events)
        client = broker.call(
            connect, broker.reactor, "127.0.0.1", broker.port(), identity="frank",
            reconnect=policy, on_message=messages,
        )  # fmt: skip
        assert isinstance(client, ReconnectingSSMPClient)
        broker.call(client.subscribe, "news")
        publish(broker, "news", b"before")
        assert broker.call(messages.get).payload == b"before"

        broker.stop()
        assert isinstance(broker.call(events.get), SSMPConnectionClosed)
        with pytest.raises(SSMPConnectionClosed, match="not connected: reconnecting"):
            broker.call(client.mcast, "news", b"while away")
        broker.start()
        restored = broker.call(events.get)
        assert restored.replayed == ("subscribe news",)  # the login is connect's own
        assert client.identity == "frank"
        publish(broker, "news", b"after")
        assert broker.call(messages.get).payload == b"after"
        assert broker.call(client.mcast, "news", b"mine") is None  # on the new connection
        broker.call(client.close)
        assert client.closed


def test_twisted_connect_with_reconnect_fails_like_connect_on_the_first_attempt(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    with restartable_broker(auth=("secret",), secret_file=str(secret)) as broker:
        with pytest.raises(SSMPError) as refused:  # a refused login is not tried again
            broker.call(connect, broker.reactor, "127.0.0.1", broker.port(), identity="x",
                        reconnect=True)  # fmt: skip
        assert refused.value.code == 401
        port = broker.port()
    with pytest.raises(ConnectError):  # nor is a broker that is not there
        broker.call(connect, broker.reactor, "127.0.0.1", port, identity="x", reconnect=True)
