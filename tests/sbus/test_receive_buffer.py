"""The seqpacket transport's receive buffer (plugins/sbus/seqpacket.py) is one per reactor,
not one per connection: an idle connection costs no 212,961-byte buffer, and sharing it
never mixes up packets, nor lets a connection read past its own maximum."""

from __future__ import annotations

import socket
import tracemalloc
from collections.abc import Iterator

import pytest

from msgbroker.plugins.sbus.seqpacket import SeqpacketConnection
from tests.sbus.test_seqpacket import FakeReactor, Recorder

DEFAULT_MAX_PACKET = 212_960


@pytest.fixture
def connect() -> Iterator[object]:
    sockets: list[socket.socket] = []

    def make(
        reactor: FakeReactor, max_packet: int = DEFAULT_MAX_PACKET
    ) -> tuple[SeqpacketConnection, Recorder, socket.socket]:
        server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sockets.extend((server, client))
        server.setblocking(False)
        protocol = Recorder()
        connection = SeqpacketConnection(server, protocol, reactor, max_packet=max_packet)
        protocol.makeConnection(connection)
        connection.startReading()
        return connection, protocol, client

    yield make
    for sock in sockets:
        sock.close()


def test_idle_connections_hold_no_receive_buffer(connect):
    reactor = FakeReactor()
    first, _, client = connect(reactor)
    client.send(b"warm up")  # the reactor's buffer exists before the measurement
    first.doRead()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        connections = [connect(reactor) for _ in range(40)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(connections) == 40
    # a buffer each would be 40 x 212,961 bytes; what a connection does hold is far less
    assert grown < 40 * 20_000


def test_packets_read_through_the_shared_buffer_stay_intact(connect):
    reactor = FakeReactor()
    a, a_protocol, a_client = connect(reactor)
    b, b_protocol, b_client = connect(reactor)
    a_client.send(b"a" * 5000)
    b_client.send(b"b" * 100)
    a_client.send(b"A")
    a.doRead()
    b.doRead()
    assert a_protocol.packets == [b"a" * 5000, b"A"]
    assert b_protocol.packets == [b"b" * 100]


def test_each_connection_keeps_its_own_maximum_in_a_larger_shared_buffer(connect):
    reactor = FakeReactor()
    large, large_protocol, large_client = connect(reactor, max_packet=1000)
    small, small_protocol, small_client = connect(reactor, max_packet=100)
    large_client.send(b"x" * 900)
    small_client.send(b"y" * 900)
    large.doRead()
    small.doRead()
    assert large_protocol.packets == [b"x" * 900]
    assert small_protocol.packets == [b"y" * 101]  # one byte over its maximum: refused


def test_a_connection_with_a_larger_maximum_grows_the_shared_buffer(connect):
    reactor = FakeReactor()
    small, small_protocol, small_client = connect(reactor, max_packet=100)
    small_client.send(b"y" * 50)
    small.doRead()
    large, large_protocol, large_client = connect(reactor, max_packet=5000)
    large_client.send(b"x" * 4000)
    large.doRead()
    assert small_protocol.packets == [b"y" * 50]
    assert large_protocol.packets == [b"x" * 4000]
