"""TransportOutput: batched writes, and what happens when the peer stops reading."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from msgbroker.hub import HubStats
from msgbroker.output import Batcher, OutputBudget, OutputPolicy, TransportOutput
from msgbroker.reasons import CloseReason
from msgbroker.session import Session
from msgbroker.testing import MemoryWire, RecordingLink


def make_output(max_backlog=10, drop=False, budget=None):
    clock = Clock()
    link = RecordingLink()
    session = Session(protocol="test", encode=lambda m: b"", stats=HubStats(), link=link)
    wire = MemoryWire()
    batcher = Batcher(clock)
    output = TransportOutput(session, wire, OutputPolicy(max_backlog, drop), batcher, budget)
    session.attach(output)
    return session, output, wire, link, batcher


def test_deliveries_are_written_once_per_batch():
    session, output, wire, _, batcher = make_output()
    writes = []
    wire.write = writes.append
    session.send(b"a")
    session.send(b"b")
    assert writes == []
    batcher.flush()
    assert writes == [b"ab"]


def test_a_reply_is_batched_after_what_was_sent_before_it():
    session, output, wire, _, batcher = make_output()
    session.send(b"event\n")
    output.reply(b"200\n")
    session.send(b"later\n")
    assert wire.writes == []
    batcher.flush()
    assert wire.writes == [b"event\n200\nlater\n"]  # one write, in the order produced
    assert (session.frames_out, session.bytes_out) == (2, 16)  # replies are not deliveries


def test_replies_alone_are_one_write():
    session, output, wire, _, batcher = make_output()
    for _ in range(3):
        output.reply(b"200\n")
    batcher.flush()
    assert wire.writes == [b"200\n200\n200\n"]
    assert session.frames_out == 0


def test_while_the_peer_does_not_read_output_is_held_and_comes_out_in_order():
    session, output, wire, _, batcher = make_output(max_backlog=100)
    wire.fill()
    session.send(b"1234")
    batcher.flush()
    output.reply(b"200\n")
    batcher.flush()
    assert bytes(wire.data) == b""
    assert output.held_bytes == 8
    wire.drain()
    assert bytes(wire.data) == b"1234200\n"
    assert output.held_bytes == 0


def test_under_the_drop_policy_an_event_is_dropped_but_a_reply_disconnects():
    session, output, wire, link, batcher = make_output(drop=True)
    wire.fill()
    session.send(b"12345678")
    batcher.flush()
    session.send(b"12345678")  # over 10 bytes: dropped, connection kept
    batcher.flush()
    assert (session.dropped, link.closed) == (1, [])
    output.reply(b"200\n")  # 8 + 4 > 10: a reply is never dropped, so the peer goes
    batcher.flush()
    assert link.closed == [CloseReason.SLOW_CONSUMER]


def test_in_one_held_batch_deliveries_are_dropped_and_replies_kept_in_order():
    session, output, wire, link, batcher = make_output(drop=True)
    wire.fill()
    session.send(b"x" * 11)  # over 10 bytes: dropped
    output.reply(b"200\n")  # held
    session.send(b"abc")  # held, after the reply
    batcher.flush()
    assert (session.dropped, output.held_bytes, link.closed) == (1, 7, [])
    output.reply(b"201\n")  # 7 + 4 > 10: a reply is never dropped, so the peer goes
    batcher.flush()
    assert link.closed == [CloseReason.SLOW_CONSUMER]
    wire.drain()
    assert bytes(wire.data) == b""  # its backlog was let go with it


def test_held_deliveries_and_replies_come_out_in_the_order_produced():
    session, output, wire, link, batcher = make_output(drop=True)
    wire.fill()
    session.send(b"x" * 11)  # over 10 bytes: dropped
    output.reply(b"200\n")
    session.send(b"abc")
    batcher.flush()
    wire.drain()
    assert bytes(wire.data) == b"200\nabc"


def test_replies_within_the_budget_are_kept():
    session, output, wire, link, batcher = make_output(drop=True)
    wire.fill()
    output.reply(b"200\n")
    output.reply(b"200\n")
    batcher.flush()
    assert (output.held_bytes, link.closed) == (8, [])
    wire.drain()
    assert bytes(wire.data) == b"200\n200\n"


def test_under_the_disconnect_policy_a_delivery_over_budget_closes_the_peer():
    session, output, wire, link, batcher = make_output()
    wire.fill()
    session.send(b"x" * 11)
    batcher.flush()
    assert link.closed == [CloseReason.SLOW_CONSUMER]
    assert session.stats.dropped == 1
    session.send(b"more")
    batcher.flush()
    assert bytes(wire.data) == b""  # nothing after the cut


def test_held_output_is_a_member_of_the_broker_budget_until_it_drains():
    budget = OutputBudget(limit=1000)
    session, output, wire, _, batcher = make_output(max_backlog=100, budget=budget)
    wire.fill()
    session.send(b"x" * 40)
    batcher.flush()
    assert budget.members == {output: 40}
    wire.drain()
    assert budget.members == {}
    assert budget.total == 0


def test_the_largest_backlog_is_cut_when_the_budget_is_spent():
    budget = OutputBudget(limit=60)
    big, big_out, big_wire, big_link, batcher = make_output(max_backlog=100, budget=budget)
    small, small_out, small_wire, small_link, _ = make_output(max_backlog=100, budget=budget)
    small_out.batcher = batcher
    big_wire.fill()
    small_wire.fill()
    big.send(b"x" * 50)
    batcher.flush()
    small.send(b"y" * 20)  # 50 + 20 > 60: the larger backlog goes
    batcher.flush()
    assert big_link.closed == [CloseReason.SLOW_CONSUMER]
    assert small_link.closed == []
    assert budget.members == {small_out: 20}


@pytest.mark.parametrize("how", ["stop", "kick"])
def test_a_stopped_output_writes_nothing_and_leaves_the_budget(how):
    budget = OutputBudget(limit=1000)
    session, output, wire, _, batcher = make_output(max_backlog=100, budget=budget)
    wire.fill()
    session.send(b"x" * 40)
    batcher.flush()
    if how == "stop":
        output.stop()
    else:
        session.kick("identity logged in elsewhere")
    wire.drain()
    session.send(b"after")
    batcher.flush()
    assert bytes(wire.data) == b""
    assert budget.members == {}


class TwistedLikeTransport:
    """What :func:`write_through` reads of a Twisted TCP transport, over a real socket."""

    def __init__(self, sock) -> None:
        self.socket = sock
        self.dataBuffer = b""
        self._tempDataLen = 0
        self.TLS = False
        self.disconnecting = False
        self._writeDisconnecting = False
        self.connected = True
        self.queued: list[bytes] = []  # what went through Twisted's write

    def write(self, data: bytes) -> None:
        self.queued.append(bytes(data))


def socket_pair():
    import socket

    ours, peer = socket.socketpair()
    ours.setblocking(False)
    return ours, peer


def test_write_through_sends_at_once_when_twisted_holds_nothing():
    from msgbroker.output import write_through

    ours, peer = socket_pair()
    with ours, peer:
        transport = TwistedLikeTransport(ours)
        write_through(transport, b"200\n")
        assert transport.queued == []
        assert peer.recv(100) == b"200\n"


@pytest.mark.parametrize(
    "state",
    ["dataBuffer", "_tempDataLen", "TLS", "disconnecting", "_writeDisconnecting", "connected"],
)
def test_write_through_leaves_it_to_twisted_when_it_must_keep_the_order_or_the_close(state):
    from msgbroker.output import write_through

    ours, peer = socket_pair()
    with ours, peer:
        transport = TwistedLikeTransport(ours)
        busy = {"dataBuffer": b"x", "_tempDataLen": 1, "connected": False}.get(state, True)
        setattr(transport, state, busy)
        write_through(transport, b"200\n")
        assert transport.queued == [b"200\n"]
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(100)  # nothing went past Twisted's buffer


def test_write_through_hands_twisted_what_the_socket_did_not_take():
    from msgbroker.output import write_through

    ours, peer = socket_pair()
    with ours, peer:
        transport = TwistedLikeTransport(ours)
        data = bytes(range(256)) * 40_000  # more than any socket buffer
        write_through(transport, data)
        assert len(transport.queued) == 1
        rest = transport.queued[0]
        assert 0 < len(rest) < len(data)
        peer.setblocking(False)
        received = bytearray()
        while True:
            try:
                chunk = peer.recv(1 << 20)
            except BlockingIOError:
                break
            received += chunk
        assert bytes(received) + rest == data  # sent, then the rest: nothing lost or twice


def test_an_early_flush_cancels_the_turn_it_made_needless_and_a_mark_schedules_again():
    session, output, wire, _, batcher = make_output()
    clock = batcher._clock
    session.send(b"a")
    assert len(clock.getDelayedCalls()) == 1  # the end of the turn
    batcher.flush()  # written early (a close, say)
    assert clock.getDelayedCalls() == [] and wire.writes == [b"a"]
    session.send(b"b")
    clock.advance(0)
    assert wire.writes == [b"a", b"b"]
