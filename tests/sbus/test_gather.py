"""Gathered delivery (plugins/sbus/flood.py, plugins/sbus/mmsg.py): what the hub offers an
idle outbox during one input goes out in one ``sendmmsg`` when the batcher flushes it; what
the socket does not take then meets the policy in order, as if sent one by one. Real
seqpacket socket pairs; the peer reads only when told."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from msgbroker.plugins.sbus import mmsg
from msgbroker.plugins.sbus.flood import FEW, FloodPolicy, Outbox
from msgbroker.reasons import CloseReason
from tests.sbus.test_flood import Sockets

send_packets = mmsg.sender()
pytestmark = pytest.mark.skipif(send_packets is None, reason="no sendmmsg here")


class Gathering(Sockets):
    """An outbox that gathers (``send_many``: sendmmsg on the socket) and a batcher that
    flushes only when told."""

    def __init__(self, max_bytes: int = 1 << 20, **policy: str) -> None:
        super().__init__()
        self.calls: list[int] = []  # the size of each send_many call
        self.marked: list[Outbox] = []
        self.errors: list[CloseReason] = []
        fd = self.server.fileno()

        def send_many(packets: list[bytes]) -> int:
            self.calls.append(len(packets))
            return send_packets(fd, packets)  # type: ignore[misc]

        self.outbox = Outbox(
            self.server.send,
            lambda want: None,
            lambda reason, detail: self.errors.append(reason),
            max_bytes,
            policy=FloodPolicy(**policy),
            send_many=send_many,
            defer=self.marked.append,
        )


@pytest.fixture
def pair() -> Iterator[Gathering]:
    p = Gathering()
    yield p
    p.close()


def test_offers_wait_for_the_flush_then_go_in_one_call_in_order(pair):
    packets = [b"p%03d" % i for i in range(10)]
    for packet in packets:
        pair.outbox.offer(packet)
    assert pair.read_all() == []  # nothing sent before the end of the input
    assert pair.marked == [pair.outbox]  # marked once, on the first
    pair.outbox.flush()
    assert pair.calls == [10]
    assert pair.read_all() == packets


def test_a_few_packets_go_one_send_each(pair):
    for i in range(FEW - 1):
        pair.outbox.offer(b"few %d" % i)
    pair.outbox.flush()
    assert pair.calls == []
    assert pair.read_all() == [b"few %d" % i for i in range(FEW - 1)]


def test_what_the_socket_does_not_take_is_queued_in_order_and_drained(pair):
    packets = [b"q%05d" % i + b"x" * 200 for i in range(200)]  # far over a 4 KiB buffer
    for packet in packets:
        pair.outbox.offer(packet)
    pair.outbox.flush()
    first = pair.read_all()
    assert 0 < len(first) < len(packets)
    assert pair.outbox.backlog > 0  # the rest is kept (blocking/soft/queue)
    assert pair.calls == [200]
    went = len(first)
    received = first
    while pair.outbox.backlog:
        pair.outbox.drain()
        received += pair.read_all()
    assert received == packets
    assert len(pair.calls) > 1  # the backlog went out many per call too
    assert pair.calls[1] == len(packets) - went
    # once drained, offers are gathered again
    pair.outbox.offer(b"again")
    assert pair.read_all() == []
    pair.outbox.flush()
    assert pair.read_all() == [b"again"]


def test_discard_drops_only_what_did_not_fit():
    p = Gathering(soft="discard")
    try:
        packets = [b"d%05d" % i + b"x" * 200 for i in range(200)]
        for packet in packets:
            p.outbox.offer(packet)
        p.outbox.flush()
        got = p.read_all()
        assert got == packets[: len(got)]
        assert p.outbox.dropped == len(packets) - len(got) > 0
        assert p.outbox.backlog == 0
    finally:
        p.close()


def test_soft_error_disconnects_when_the_gathered_packets_do_not_fit():
    p = Gathering(soft="error")
    try:
        for i in range(200):
            p.outbox.offer(b"e%05d" % i + b"x" * 200)
        p.outbox.flush()
        assert p.errors == [CloseReason.FLOOD_CONTROL]
    finally:
        p.close()


@pytest.mark.parametrize("control", [b"blocking/soft/block", b"blocking/hard/block"])
def test_block_policies_send_each_packet_at_once(pair, control):
    # a publisher must be paused at the very packet that filled the socket
    pair.outbox.offer(b"gathered")
    pair.outbox.policy.apply(control)
    pair.outbox.policy_changed()
    assert pair.read_all() == [b"gathered"]  # what was gathered went first
    pair.outbox.offer(b"at once")
    assert pair.read_all() == [b"at once"]
    assert pair.marked == [pair.outbox]  # only the first was ever gathered
    pair.outbox.policy.apply(b"blocking/soft/queue")
    pair.outbox.policy.apply(b"blocking/hard/error")
    pair.outbox.policy_changed()
    pair.outbox.offer(b"gathered again")
    assert pair.read_all() == []
    pair.outbox.flush()
    assert pair.read_all() == [b"gathered again"]


def test_a_reply_goes_after_what_was_gathered_before_it(pair):
    pair.outbox.offer(b"one")
    pair.outbox.offer(b"two")
    pair.outbox.reply(b"CMSG !/cred/whoami\0answer")
    assert pair.read_all() == [b"one", b"two", b"CMSG !/cred/whoami\0answer"]


def test_close_drops_what_was_gathered_and_a_later_flush_sends_nothing(pair):
    pair.outbox.offer(b"lost")
    pair.outbox.close()
    pair.outbox.flush()
    assert pair.read_all() == []


def test_when_drained_sends_what_was_gathered_first(pair):
    pair.outbox.offer(b"before the close")
    done: list[bool] = []
    pair.outbox.when_drained(lambda: done.append(True))
    assert done == [True]
    assert pair.read_all() == [b"before the close"]


def test_sendmmsg_sends_in_order_returns_how_many_fit_and_reports_errors():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        a.setblocking(False)
        b.setblocking(False)
        assert send_packets(a.fileno(), [b"a", b"bb", b"ccc"]) == 3  # type: ignore[misc]
        assert [b.recv(10) for _ in range(3)] == [b"a", b"bb", b"ccc"]
        many = [b"%04d" % i + b"y" * 300 for i in range(mmsg.BATCH + 50)]
        sent = send_packets(a.fileno(), many)  # type: ignore[misc]
        assert 0 < sent < len(many)
        with pytest.raises(BlockingIOError):
            send_packets(a.fileno(), many[sent:])  # type: ignore[misc]
        got = []
        while True:
            try:
                got.append(b.recv(1000))
            except BlockingIOError:
                break
        assert got == many[:sent]
        # more than one call's worth, in order
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        small = [b"%05d" % i for i in range(mmsg.BATCH * 2 + 3)]
        assert send_packets(a.fileno(), small) == len(small)  # type: ignore[misc]
        assert [b.recv(10) for _ in small] == small
        b.close()
        with pytest.raises(OSError):
            send_packets(a.fileno(), [b"gone", b"gone"])  # type: ignore[misc]
