"""Flood control through the real broker: a client that does not read never delays the
others, and its own choice (``blocking/*``, ``order/*``) decides what happens to its
backlog."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.sbus.server_support import Bus, RawClient, running_bus
from tests.ssmp.e2e_support import WAIT

PAYLOAD = b"p" * 1000
BOUND = 64 * 1024


@pytest.fixture
def bus() -> Iterator[Bus]:
    # block pauses here last until the slow client reads (what these tests are about),
    # however busy the machine; test_server_block_timeout.py checks the bound on it
    with running_bus(max_backlog=BOUND, block_timeout=3600) as bus:
        yield bus


def session_of(bus: Bus, pattern: str) -> Any:
    """The broker's session of the client that subscribed to ``pattern`` (reactor thread)."""

    def find() -> Any:
        broker = bus.broker.service.broker
        [session] = [s for s in broker.sessions if pattern in bus.hub.patterns.patterns_of(s)]
        return session

    return bus.broker.call(find)


def send_until_blocked(sock: socket.socket, packet: Callable[[int], bytes]) -> int:
    """Send ``packet(0)``, ``packet(1)``... without blocking until the kernel refuses one;
    how many were sent (failing if a million went through: nobody paused)."""
    sock.setblocking(False)
    for sent in range(1_000_000):
        try:
            sock.send(packet(sent))
        except BlockingIOError:
            sock.setblocking(True)
            return sent
    raise AssertionError("the publisher was never paused")


def numbers_of(packets: list[bytes]) -> list[int]:
    return [int(p[p.index(b"\0") + 1 :][:6]) for p in packets]


def stalled(bus: Bus, key: bytes, *control: bytes) -> RawClient:
    """A subscriber with a tiny receive buffer that never reads (until a test says so)."""
    client = bus.client(rcvbuf=4096)
    for packet in control:
        client.send(packet)
    client.send(b"SUB slow-" + key)  # for session_of
    client.send(b"SUB " + key)
    client.sync()
    return client


def keeping_up(bus: Bus) -> RawClient:
    """A reader that must get everything even when this machine is busy and it lags (it
    holds its publisher back then, rather than be cut off at the small bound)."""
    client = bus.client()
    client.send(b"CMSG blocking/hard/block")
    return client


def publish(publisher: RawClient, key: bytes, count: int, payload: bytes = PAYLOAD) -> None:
    for i in range(count):
        publisher.send(b"MSG %s\0%06d%s" % (key, i, payload))


@contextlib.contextmanager
def publishing(publisher: RawClient, key: bytes, count: int) -> Iterator[None]:
    """Publish from another thread while the test reads (a reader that waited for the
    whole burst would be a slow consumer itself)."""
    thread = threading.Thread(target=publish, args=(publisher, key, count))
    thread.start()
    try:
        yield
    finally:
        thread.join(WAIT)
    assert not thread.is_alive()


def test_a_stalled_subscriber_is_cut_off_by_default_and_the_others_get_everything(bus):
    slow = stalled(bus, b"f1")
    healthy, publisher = keeping_up(bus), bus.client()
    healthy.send(b"SUB f1")
    healthy.sync()
    with publishing(publisher, b"f1", 2000):  # ~2 MB: past the kernel's buffers and the bound
        for i in range(2000):
            healthy.expect(b"MSG f1\0%06d%s" % (i, PAYLOAD))
    assert slow.closed_by_server()


def test_hard_discard_keeps_a_stalled_subscriber_with_its_backlog_within_the_bound(bus):
    slow = stalled(bus, b"f2", b"CMSG blocking/hard/discard")
    healthy, publisher = keeping_up(bus), bus.client()
    healthy.send(b"SUB f2")
    healthy.sync()
    with publishing(publisher, b"f2", 2000):
        for i in range(2000):
            healthy.expect(b"MSG f2\0%06d%s" % (i, PAYLOAD))
    outbox = outbox_of(session_of(bus, "slow-f2"))
    assert 0 < bus.broker.call(lambda: outbox.backlog) <= BOUND
    assert bus.broker.call(lambda: outbox.dropped) > 0
    # it is still connected; what it gets is in order, the discarded ones missing
    numbers = numbers_of(slow.sync())
    assert numbers == sorted(numbers) and numbers[0] == 0 and len(numbers) < 2000


def test_soft_discard_drops_rather_than_queue(bus):
    slow = stalled(bus, b"f3", b"CMSG blocking/soft/discard")
    publisher = bus.client()
    publish(publisher, b"f3", 500)
    publisher.sync()
    outbox = outbox_of(session_of(bus, "slow-f3"))
    assert bus.broker.call(lambda: (outbox.backlog, outbox.dropped > 0)) == (0, True)
    numbers = numbers_of(slow.sync())
    assert numbers == sorted(numbers) and len(numbers) < 500


def test_order_stack_sends_the_backlog_newest_first(bus):
    slow = stalled(bus, b"f4", b"CMSG order/stack", b"CMSG blocking/hard/discard")
    publisher = bus.client()
    # more packets than the kernel queues for the client, fewer bytes than the bound
    publish(publisher, b"f4", 1000, b"")
    publisher.sync()
    numbers = numbers_of([slow.recv() for _ in range(1000)])
    assert sorted(numbers) == list(range(1000))
    sent_at_once = next(i for i, n in enumerate(numbers) if n != i)
    assert numbers[sent_at_once:] == sorted(numbers[sent_at_once:], reverse=True)


def test_block_pauses_only_the_publisher_feeding_the_slow_client(bus):
    slow = stalled(bus, b"f5", b"CMSG blocking/soft/block")
    fed, other, reader = bus.client(), bus.client(), keeping_up(bus)
    reader.send(b"SUB f5-other")
    reader.sync()
    # the broker stops reading it: the kernel's queue fills and its sends would block
    sent = send_until_blocked(fed.sock, lambda i: b"MSG f5\0%06d%s" % (i, PAYLOAD))
    # the bus goes on for everyone else
    with publishing(other, b"f5-other", 1000):
        for i in range(1000):
            reader.expect(b"MSG f5-other\0%06d%s" % (i, PAYLOAD))
    # the slow client reads at last: everything the paused publisher sent, in order
    for i in range(sent):
        slow.expect(b"MSG f5\0%06d%s" % (i, PAYLOAD))
    fed.sock.setblocking(True)
    fed.send(b"MSG f5\0after")
    slow.expect(b"MSG f5\0after")
    outbox = outbox_of(session_of(bus, "slow-f5"))
    assert bus.broker.call(lambda: outbox.dropped) == 0


def test_a_publisher_that_closes_while_paused_loses_nothing(bus):
    slow = stalled(bus, b"f6", b"CMSG blocking/soft/block")
    fed = bus.client()
    sent = send_until_blocked(fed.sock, lambda i: b"MSG f6\0%06d" % i)
    fed.close()
    for i in range(sent):
        slow.expect(b"MSG f6\0%06d" % i)


def test_block_pauses_a_tcp_publisher_too(bus):
    # a TCP publisher is paused between the chunks it is read in: the rest of the chunk
    # (up to 64 KiB) still arrives, which a bound this small cannot take, so keep it
    slow = stalled(bus, b"f7", b"CMSG blocking/soft/block", b"CMSG blocking/hard/block")
    sock, reader = bus.ssmp("f7-ssmp")
    sock.setblocking(False)
    line = b"MCAST f7 " + b"q" * 1000 + b"\n"
    written, rest = 0, b""
    while written < 200_000:  # until the broker stops reading and TCP's window fills
        try:
            sent = sock.send(line)
        except BlockingIOError:
            break
        written += 1
        if sent < len(line):
            rest = line[sent:]
            break
    assert written < 200_000
    # nothing was lost on the way: the slow client gets every one once it reads
    sock.setblocking(True)
    sock.settimeout(WAIT)
    finish = threading.Thread(target=sock.sendall, args=(rest + b"MCAST f7 end\n",))
    finish.start()
    count = 0
    while (packet := slow.recv()) != b"MSG f7\0end":
        assert packet == b"MSG f7\0" + b"q" * 1000
        count += 1
    finish.join(WAIT)
    assert count == written
    sock.close()


def outbox_of(session):
    """The client's flood-control outbox: its session's output."""
    return getattr(session.output, "outbox", session.output)
