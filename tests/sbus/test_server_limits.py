"""The broker's limits on the sbus listener, on real seqpacket sockets: the accept queue is
``--listen-backlog`` long, a connection over ``--max-connections`` is closed at once, and a
``SUB`` over ``--max-subscriptions`` closes that client and no other (docs/sbus.md,
"Decisions")."""

from __future__ import annotations

import os
import socket
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from msgbroker.config import BrokerConfig
from msgbroker.plugins.sbus.seqpacket import parse_address, parse_endpoint
from msgbroker.plugins.sbus.server import SbusFactory
from tests.sbus.server_support import Bus, RawClient, running_bus
from tests.sbus.test_seqpacket import FakeReactor
from tests.ssmp.e2e_support import WAIT

# -- the accept queue ---------------------------------------------------------------------


def queued(path: str) -> int:
    """How many clients can connect to the listener at ``path``, which accepts nobody,
    before the kernel says its accept queue is full (Linux queues the backlog plus one)."""
    socks: list[socket.socket] = []
    try:
        while len(socks) < 5000:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
            socks.append(sock)
            try:
                sock.connect(path)
            except BlockingIOError:
                return len(socks) - 1
        raise AssertionError("the accept queue never filled")
    finally:
        for sock in socks:
            sock.close()


def listening(tmp_path, factory, endpoint_options=""):
    path = os.path.join(tmp_path, "bus")
    # a reactor that never runs: the port accepts nobody, so its queue fills
    endpoint = parse_endpoint(FakeReactor(), f"unix:{path}{endpoint_options}")
    ports = []
    endpoint.listen(factory).addCallback(ports.append)
    return path, ports[0]


def factory_of(**config) -> SbusFactory:
    return SbusFactory(SimpleNamespace(config=BrokerConfig(**config)))


@pytest.mark.parametrize("backlog", [300, BrokerConfig().listen_backlog])
def test_the_listener_queues_the_brokers_listen_backlog(tmp_path, backlog):
    config = {} if backlog == BrokerConfig().listen_backlog else {"listen_backlog": backlog}
    path, port = listening(tmp_path, factory_of(**config))
    try:
        assert queued(path) in (backlog, backlog + 1)
    finally:
        port.connectionLost(None)


def test_a_backlog_in_the_endpoint_wins_over_the_brokers(tmp_path):
    path, port = listening(tmp_path, factory_of(listen_backlog=300), ":backlog=20")
    try:
        assert queued(path) in (20, 21)
    finally:
        port.connectionLost(None)


@pytest.mark.parametrize("text", ["unix:/tmp/x:backlog=0", "unix:/tmp/x:backlog=many"])
def test_a_bad_backlog_in_the_endpoint_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse_endpoint(None, text)


def test_parse_endpoint_keeps_the_address_with_a_backlog():
    endpoint = parse_endpoint(None, "unix:/tmp/x:backlog=7:mode=0750")
    assert (endpoint.address, endpoint.backlog, endpoint.mode) == (
        parse_address("/tmp/x"),
        7,
        0o750,
    )


# -- connections and subscriptions --------------------------------------------------------


def closed_unanswered(client: RawClient) -> list[bytes]:
    """What ``client`` received before the server closed it (reset or end of stream)."""
    got = []
    try:
        while packet := client.recv():
            got.append(packet)
    except ConnectionResetError:  # closed with packets of ours still unread
        pass
    return got


def on_close_of(bus: Bus, pattern: str) -> tuple[threading.Event, Any]:
    """The session of the client subscribed to ``pattern``, and an event set once it is
    gone."""
    gone = threading.Event()

    def watch() -> Any:
        broker = bus.broker.service.broker
        [session] = [s for s in broker.sessions if pattern in bus.hub.patterns.patterns_of(s)]
        session.on_lost.append(gone.set)
        return session

    return gone, bus.broker.call(watch)


def test_a_client_over_max_connections_is_closed_at_once_and_the_first_stays():
    with running_bus(max_connections=1) as bus:
        first = bus.client()
        first.send(b"SUB l1")
        first.sync()  # accepted, and its session open
        second = bus.client()
        assert closed_unanswered(second) == []  # before it sent anything
        first.send(b"MSG l1\0still here")
        assert first.sync() == [b"MSG l1\0still here"]
        gone, _ = on_close_of(bus, "l1")
        first.close()
        assert gone.wait(WAIT)
        # its place is free again once it is gone
        third = bus.client()
        third.send(b"SUB l1")
        third.send(b"MSG l1\0third")
        assert third.sync() == [b"MSG l1\0third"]


def test_a_sub_over_max_subscriptions_closes_that_client_only():
    with running_bus(max_subscriptions=2) as bus:
        greedy, other, publisher = bus.client(), bus.client(), bus.client()
        other.send(b"SUB l2/a")
        other.send(b"SUB l2/b")
        other.sync()
        greedy.send(b"SUB l2/a")
        greedy.send(b"SUB l2/greedy")
        greedy.sync()
        gone, session = on_close_of(bus, "l2/greedy")
        greedy.send(b"SUB l2/c")  # the third: refused
        greedy.send(b"CMSG !/cred/whoami")  # never answered: it is closed before
        assert closed_unanswered(greedy) == []
        assert gone.wait(WAIT)
        # closed by the broker for the limit, not by an exception that escaped
        assert bus.broker.call(lambda: session.close_reason) == "limit exceeded"
        publisher.send(b"MSG l2/a\0one")
        publisher.send(b"MSG l2/b\0two")
        publisher.send(b"MSG l2/c\0three")
        publisher.sync()
        assert other.sync() == [b"MSG l2/a\0one", b"MSG l2/b\0two"]
        assert bus.broker.call(lambda: bus.hub.stats.refused) == 1
