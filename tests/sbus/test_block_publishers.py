"""What sbus ``block`` does to a publisher of another protocol, on a broker driven by a Clock:
an SSMP publisher (in memory) feeding an sbus subscriber (a real seqpacket socket pair)
that never reads. The publisher is paused for at most ``block-timeout`` seconds, then the
subscriber's fallback applies and the publisher resumes at once; while paused, its
keepalive never closes it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.address import UNIXAddress

from msgbroker.config import BrokerConfig
from msgbroker.plugins.sbus.seqpacket import SeqpacketConnection, peer_credentials
from msgbroker.plugins.sbus.server import SbusFactory
from msgbroker.testing import FakeConnection, connect, make_broker
from tests.sbus.test_seqpacket import FakeReactor

KEEPALIVE = 5.0


class Bus:
    """A broker on a FakeReactor with an SSMP publisher and an sbus subscriber to ``news``
    that chose ``blocking/soft/block`` and does not read."""

    def __init__(self, **config: Any) -> None:
        self.reactor = FakeReactor()
        self.broker = make_broker(
            BrokerConfig(auth=("open",), keepalive=KEEPALIVE, **config), clock=self.reactor
        )
        self.server, self.client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.server.setblocking(False)
        self.client.setblocking(False)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        factory = SbusFactory(self.broker)
        self.sbus: Any = factory.buildProtocol(UNIXAddress(None))
        self.transport = SeqpacketConnection(
            self.server, self.sbus, self.reactor, peer_credentials(self.server)
        )
        self.sbus.makeConnection(self.transport)
        #: the broker's session of the sbus subscriber
        self.session = self.sbus.connection.session
        self.client.send(b"CMSG blocking/soft/block")
        self.client.send(b"SUB news")
        self.transport.doRead()
        self.publisher: FakeConnection = connect(self.broker, "ssmp")
        self.publisher.send(b"LOGIN pub open\n")
        assert self.publisher.received() == b"200\n"
        self.sent = 0

    @property
    def paused(self) -> bool:
        return bool(self.publisher.transport.producerState == "paused")

    def publish(self) -> None:
        self.publisher.send(b"MCAST news %06d%s\n" % (self.sent, b"x" * 500))
        self.sent += 1

    def publish_until_paused(self) -> None:
        while not self.paused:
            assert self.sent < 10_000, "the publisher was never paused"
            self.publish()
        assert self.publisher.session.reading_held

    def read_all(self) -> list[bytes]:
        got = []
        while True:
            try:
                got.append(self.client.recv(65536))
            except BlockingIOError:
                return got

    def drain(self) -> list[bytes]:
        """The subscriber reads until the broker has nothing left for it."""
        got = self.read_all()
        while self.transport.outbox.backlog:
            self.transport.doWrite()
            got += self.read_all()
        return got

    def close(self) -> None:
        self.server.close()
        self.client.close()


@pytest.fixture
def bus() -> Iterator[Any]:
    made: list[Bus] = []

    def make(**config: Any) -> Bus:
        made.append(Bus(**config))
        return made[-1]

    yield make
    for b in made:
        b.close()


def test_a_publisher_paused_by_block_is_never_closed_for_keepalive(bus):
    b = bus(block_timeout=10 * KEEPALIVE)
    b.publish_until_paused()
    b.publisher.received()
    for _ in range(int(8 * KEEPALIVE)):  # far past a keepalive's ping and close
        b.reactor.advance(1)
    assert not b.publisher.closed
    assert b"PING" not in b.publisher.received()
    assert b.paused
    # the subscriber reads: the publisher goes on, and its keepalive counts again
    assert len(b.drain()) == b.sent
    assert not b.paused and not b.publisher.session.reading_held
    b.reactor.advance(KEEPALIVE)
    assert b"000 . PING\n" in b.publisher.received()


def test_after_block_timeout_the_blocker_is_disconnected_and_the_publisher_resumes(bus):
    b = bus(block_timeout=1.0)  # --slow-consumer disconnect, the default
    b.publish_until_paused()
    b.reactor.advance(0.999)
    assert b.paused and b.session.close_reason is None
    b.reactor.advance(0.001)
    assert b.session.close_reason == "slow consumer"
    assert not b.paused and not b.publisher.session.reading_held
    b.reactor.advance(0)  # the abort completes
    assert b.session not in b.broker.sessions
    b.publisher.received()
    b.publish()
    assert b.publisher.received() == b"200\n" and not b.paused


def test_with_slow_consumer_drop_the_blocker_stays_and_is_discarded_for(bus):
    b = bus(block_timeout=1.0, slow_consumer="drop")
    b.publish_until_paused()
    paused_at = b.sent
    b.reactor.advance(1.0)
    assert not b.paused and b.session.close_reason is None
    b.publisher.received()
    for _ in range(20):  # the stall goes on: nothing pauses the publisher now
        b.publish()
        assert not b.paused
    assert b.publisher.received() == b"200\n" * 20
    assert b.session.dropped == 20
    # what it was sent before the timeout still arrives, in order; the rest is gone
    got = b.drain()
    assert [int(p[9:15]) for p in got] == list(range(paused_at))
    # the stall is over: block pauses the publisher again
    b.publish_until_paused()
    assert b.sent > paused_at + 20
