"""The blocking sbus client against a real broker over real unix seqpacket sockets."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from msgbroker.plugins.sbus.client import (
    BlockingSbusClient,
    ControlMessage,
    Publish,
    SbusConnectionClosed,
    default_address,
)
from msgbroker.plugins.sbus.plugin import default_path
from tests.sbus.server_support import Bus, running_bus
from tests.sbus.test_client import FakeSbusServer
from tests.ssmp.e2e_support import WAIT, reactor_thread


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    with running_bus() as bus:
        yield bus


@pytest.fixture
def client(bus):
    """``client()``: a connected blocking client, closed after the test."""
    made: list[BlockingSbusClient] = []

    def make() -> BlockingSbusClient:
        made.append(BlockingSbusClient(bus.path, timeout=WAIT))
        return made[-1]

    yield make
    for c in made:
        c.close()


def me() -> bytes:
    return b"!/cred/%d/%d/%d" % (os.getgid(), os.getuid(), os.getpid())


def test_publish_reaches_a_subscriber(client):
    sub, pub = client(), client()
    sub.subscribe(b"b1/*")
    sub.sync()
    pub.publish(b"b1/x", b"hello")
    assert sub.receive(timeout=WAIT) == Publish(b"b1/x", b"hello")


def test_patterns_and_unsubscribe(client):
    sub, pub = client(), client()
    sub.subscribe(b"b2/*/c")
    sub.subscribe(b"b2/end")
    sub.sync()
    pub.publish(b"b2/a/c", b"matches")
    pub.publish(b"b2/a/c/d", b"too long for the pattern")
    pub.publish(b"b2/end", b"1")
    got = [sub.receive(timeout=WAIT), sub.receive(timeout=WAIT)]
    assert got == [Publish(b"b2/a/c", b"matches"), Publish(b"b2/end", b"1")]
    sub.unsubscribe(b"b2/*/c")
    sub.sync()
    pub.publish(b"b2/a/c", b"after unsubscribing")
    pub.publish(b"b2/end", b"2")  # after the other from the same publisher: proves absence
    assert sub.receive(timeout=WAIT) == Publish(b"b2/end", b"2")


def test_receive_with_timeout_0_returns_none_when_nothing_is_there(client):
    sub = client()
    sub.subscribe(b"b3/quiet")
    sub.sync()
    assert sub.receive(timeout=0) is None


def test_whoami_is_this_process_credentials(client):
    assert client().whoami() == me()


def test_whoami_keeps_earlier_messages_for_receive(client):
    sub = client()
    sub.subscribe(b"b4/self")
    sub.publish(b"b4/self", b"before")
    assert sub.whoami() == me()  # the message arrived first, and is kept
    assert sub.receive(timeout=0) == Publish(b"b4/self", b"before")


def test_echo_off_and_on(client):
    c = client()
    c.subscribe(b"b5/self")
    c.echo(False)
    c.publish(b"b5/self", b"unheard")
    c.sync()  # routed before the answer: it would be here now
    assert c.receive(timeout=0) is None
    c.echo(True)
    c.publish(b"b5/self", b"heard")
    assert c.receive(timeout=WAIT) == Publish(b"b5/self", b"heard")


def test_flood_choices_keep_the_connection_and_bad_ones_raise(client):
    c = client()
    c.flood(soft="block", hard="discard", order="random")
    assert c.whoami() == me()
    with pytest.raises(ValueError, match="order/sideways"):
        c.flood(order="sideways")


def test_ssmp_and_sbus_both_ways(bus, client):
    c = client()
    c.subscribe(b"b6/from-ssmp")
    c.sync()
    sock, reader = bus.ssmp("b6-peer")
    with sock, reader:
        sock.sendall(b"SUBSCRIBE b6/from-sbus\n")
        assert reader.readline() == b"200\n"
        sock.sendall(b"MCAST b6/from-ssmp hi sbus\n")
        assert reader.readline() == b"200\n"
        assert c.receive(timeout=WAIT) == Publish(b"b6/from-ssmp", b"hi sbus")
        c.publish(b"b6/from-sbus", b"hi ssmp")
        assert reader.readline() == b"000 sbus:%d:%d MCAST b6/from-sbus hi ssmp\n" % (
            os.getuid(),
            os.getpid(),
        )


def test_context_manager_closes_and_later_use_raises(bus):
    with BlockingSbusClient(bus.path) as c:
        assert c.whoami() == me()
    assert c.closed
    with pytest.raises(SbusConnectionClosed):
        c.publish(b"b7/x", b"late")
    c.close()  # again: nothing happens


def test_broker_closing_the_connection_raises_connection_closed(client):
    c = client()
    c.subscribe(b"!/cred/0/0/1/")  # not our credentials: the broker disconnects
    with pytest.raises(SbusConnectionClosed, match="the broker closed the connection"):
        c.whoami()
    assert c.closed


def test_missing_path_raises_file_not_found():
    missing = os.path.join(tempfile.gettempdir(), f"sbus-missing-{os.getpid()}")
    with pytest.raises(FileNotFoundError):
        BlockingSbusClient(missing)


def test_inherited_socket_by_dev_fd(bus):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with sock:
        sock.connect(bus.path)
        with BlockingSbusClient(f"/dev/fd/{sock.fileno()}") as c:
            assert c.whoami() == me()


def test_default_address_is_sbus_address_then_the_broker_default(bus, monkeypatch):
    monkeypatch.delenv("SBUS_ADDRESS", raising=False)
    assert default_address() == default_path()
    monkeypatch.setenv("SBUS_ADDRESS", bus.path)
    assert default_address() == bus.path
    with BlockingSbusClient() as c:
        assert c.whoami() == me()


def test_malformed_server_packet_raises_and_closes():
    with FakeSbusServer(reactor_thread(), b"CMSG hello\0there", b"SUB not-from-a-server") as server:
        c = BlockingSbusClient(server.path)
        assert c.receive(timeout=WAIT) == ControlMessage(b"hello", b"there")
        with pytest.raises(SbusConnectionClosed, match="protocol error"):
            c.receive(timeout=WAIT)
        assert c.closed
        assert server.wait(lambda: server.ended(0))
