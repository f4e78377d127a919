"""sbus clients that reconnect (``reconnect=``), against a real broker stopped and started
again on the same socket path: the patterns (each copy) and the echo and flood choices again,
then a whoami round trip, so that they are in force when ``on_restored`` is told. The
waits are tests/clientkit/test_reconnect.py's, on a fake clock."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from msgbroker.plugins.sbus.client import (
    BlockingSbusClient,
    Publish,
    Reconnect,
    ReconnectingSbusClient,
    SbusConnectionClosed,
    connect,
)
from tests.ssmp.e2e_support import WAIT, Inbox, RestartableBroker, restartable_broker


def quick(news: Any = None) -> Reconnect:
    return Reconnect(initial=0.05, max_delay=0.5, on_lost=news, on_restored=news)


@pytest.fixture
def bus() -> Iterator[tuple[RestartableBroker, str]]:
    directory = tempfile.mkdtemp(prefix="sbus", dir="/tmp")
    path = os.path.join(directory, "bus")
    try:
        with restartable_broker((f"sbus=unix:{path}",)) as broker:
            yield broker, path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def publish(path: str, key: bytes, payload: bytes) -> None:
    with BlockingSbusClient(path, timeout=WAIT) as client:
        client.publish(key, payload)
        client.sync()


def test_blocking_client_subscribes_again_with_its_choices_after_a_restart(bus):
    broker, path = bus
    news: list[Any] = []
    client = BlockingSbusClient(path, timeout=WAIT, reconnect=quick(news.append))
    client.subscribe(b"news/*")
    client.subscribe(b"news/*")  # twice: one unsubscribe leaves one
    client.unsubscribe(b"news/*")
    client.echo(False)
    client.sync()

    broker.stop()
    broker.start()
    client.sync()  # finds the connection lost: reconnects first
    assert [type(n).__name__ for n in news] == ["SbusConnectionClosed", "Restored"]
    assert news[1].replayed == ("control echo/off", "subscribe news/*", "whoami")
    client.publish(b"news/mine", b"not echoed")
    publish(path, b"news/today", b"after")
    assert client.receive(WAIT) == Publish(b"news/today", b"after")
    client.sync()
    assert client.receive(0) is None
    client.close()


def test_blocking_client_on_an_inherited_socket_does_not_reconnect(bus):
    broker, path = bus
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    try:
        client = BlockingSbusClient(f"/dev/fd/{sock.fileno()}", timeout=WAIT, reconnect=True)
        client.subscribe(b"t")
        client.sync()
        broker.stop()
        broker.start()
        with pytest.raises(RuntimeError, match="an inherited socket cannot be opened again"):
            client.receive(WAIT)
        assert not client.reconnecting
    finally:
        sock.close()


def test_twisted_client_subscribes_again_after_a_restart(bus):
    broker, path = bus
    messages, events = Inbox(), Inbox()
    client = broker.call(
        connect, broker.reactor, path, reconnect=quick(events), on_message=messages
    )
    assert isinstance(client, ReconnectingSbusClient)
    broker.call(client.subscribe, b"news/")
    broker.call(client.sync)

    broker.stop()
    assert isinstance(broker.call(events.get), SbusConnectionClosed)
    with pytest.raises(SbusConnectionClosed, match="not connected: reconnecting"):
        broker.call(client.publish, b"news/x", b"while away")
    broker.start()
    assert broker.call(events.get).replayed == ("subscribe news/", "whoami")
    publish(path, b"news/a/b", b"after")
    assert broker.call(messages.get) == Publish(b"news/a/b", b"after")
    broker.call(client.close)
    assert client.closed


def test_twisted_connect_refuses_to_reconnect_an_inherited_socket(bus):
    broker, _ = bus
    with pytest.raises(ValueError, match="cannot be reconnected"):
        broker.call(connect, broker.reactor, "/dev/fd/0", reconnect=True)
