"""Micromessage2's acknowledgement window as an output (plugins/mm2/window.py), alone: it
numbers what it sends, holds what the window has no room for, lets it go as acks come,
takes queue messages only with room and gives back those never acknowledged, applies the
slow-consumer policy past ``max-backlog`` and is a member of the broker's output budget."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from msgbroker.errors import RemoteProtocolError
from msgbroker.hub import HubStats
from msgbroker.message import Kind, Message
from msgbroker.output import Batcher, OutputBudget, OutputPolicy, TransportOutput
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import ExtensionFrame, MessageFrame
from msgbroker.plugins.mm2.delivery import encode_delivery
from msgbroker.plugins.mm2.window import HELD_OVERHEAD, WindowOutput
from msgbroker.queues import QueueGroup
from msgbroker.reasons import CloseReason
from msgbroker.session import Session
from msgbroker.testing import MemoryWire, RecordingLink
from msgbroker.timers import Timers


class Recorder:
    """The wrapped output: what the window writes through."""

    def __init__(self):
        self.sent, self.replies, self.stopped = [], [], False

    def send(self, frame):
        self.sent.append(frame)

    def reply(self, frame):
        self.replies.append(frame)

    def flush(self):
        pass

    def stop(self):
        self.stopped = True

    def measure(self):
        return 0

    def cut(self):
        return False

    def frames(self):
        """Everything sent so far, decoded (and forgotten)."""
        data = b"".join(self.sent)
        self.sent.clear()
        return list(codec.FrameDecoder().feed(data))


class Window:
    """A window output on a session of its own, with a fake clock for its timers."""

    def __init__(self, size=None, max_backlog=16 << 20, drop=False, budget=None, dotnet_id=None):
        self.clock = Clock()
        self.timers = Timers(self.clock.seconds)
        self.link = RecordingLink()
        self.session = Session(protocol="mm2", encode=encode_delivery, stats=HubStats(),
                               link=self.link)  # fmt: skip
        self.out = Recorder()
        self.output = WindowOutput(self.session, self.out, OutputPolicy(max_backlog, drop), budget)
        self.session.attach(self.output)
        self.output.configure(self.timers, size, dotnet_id)

    def tick(self):
        self.clock.advance(0)
        self.timers.tick()


def delivery(payload, topic="t", encoding=None):
    """What the hub sends a Micromessage2 recipient for one MCAST: its frames, numbered 0."""
    return encode_delivery(Message(Kind.MCAST, "pub", "mm2", topic, payload, None, encoding))


def payloads(frames):
    return [f.payload for f in frames if isinstance(f, MessageFrame)]


# -- numbering -----------------------------------------------------------------------------------


def test_without_a_window_a_write_of_several_messages_is_numbered_in_one_pass():
    w = Window()
    w.session.send(delivery(b"a") + delivery(b"b") + delivery(b"c"))
    assert len(w.out.sent) == 1
    assert w.out.frames() == [MessageFrame(i, "t", p) for i, p in ((1, b"a"), (2, b"b"), (3, b"c"))]
    assert w.output.seq_out == 3
    assert not w.output.unacked  # nothing to wait for without acks


@pytest.mark.parametrize("size", [None, 10])
def test_deliveries_one_at_a_time_are_numbered_and_go_round(size):
    """One message per send (what a message to mixed topics gives): small, LARGE, with
    properties, each numbered whole, with or without a window."""
    w = Window(size=size)
    w.output.seq_out = 65534
    sent = [
        MessageFrame(0, "t", b"a"),
        MessageFrame(0, "t", b"x" * 300),
        MessageFrame(0, "u", b"c", {"n": 1}),
    ]
    for frame in sent:
        properties = dict(frame.properties) or None
        message = Message(Kind.MCAST, "p", "mm2", frame.destination, frame.payload, properties)
        w.session.send(encode_delivery(message))
    got = w.out.frames()
    assert [f.seq for f in got] == [65535, 1, 2]
    assert [(f.destination, f.payload, f.properties) for f in got] == [
        (f.destination, f.payload, f.properties) for f in sent
    ]
    assert w.output.wrapped
    assert len(w.output.unacked) == (0 if size is None else 3)


def test_numbers_go_round_from_65535_to_1():
    w = Window(size=10)
    w.output.seq_out = 65534
    w.session.send(delivery(b"a") + delivery(b"b") + delivery(b"c"))
    assert [f.seq for f in w.out.frames()] == [65535, 1, 2]
    assert w.output.wrapped
    assert w.output.acknowledge(1) == 2  # cumulative, across the wrap: 65535 and 1
    assert w.output.acknowledge(2) == 1


def test_a_fragmented_message_takes_one_number():
    w = Window(size=2)
    big = b"x" * (codec.FRAGMENT_SIZE + 10)
    w.session.send(delivery(big) + delivery(b"after"))
    frames = w.out.frames()
    assert [(f.seq, f.continued) for f in frames] == [(1, True), (1, False), (2, False)]
    assert [seq for seq, _ in w.output.unacked] == [1, 2]


def test_a_dotnet_type_frame_goes_before_a_message_whose_type_changed():
    w = Window(dotnet_id=7)
    for name in ("A", "A", "B"):
        w.session.send(delivery(b"{}", encoding="dotnet:" + name))
    assert w.out.frames() == [
        ExtensionFrame(7, b"A"),
        MessageFrame(1, "t", b"{}"),
        MessageFrame(2, "t", b"{}"),
        ExtensionFrame(7, b"B"),
        MessageFrame(3, "t", b"{}"),
    ]


def test_without_dotnet_the_type_marker_never_reaches_the_wire():
    w = Window(size=5)
    w.session.send(delivery(b"{}", encoding="dotnet:A"))
    assert w.out.frames() == [MessageFrame(1, "t", b"{}")]


def test_replies_go_straight_through():
    w = Window(size=1)
    w.session.send(delivery(b"1"))
    w.session.send(delivery(b"2"))  # held: the window is full
    w.output.reply(b"ack-frame")
    assert w.out.replies == [b"ack-frame"]


# -- holding and acks ----------------------------------------------------------------------------


def test_what_the_window_has_no_room_for_is_held_until_acks_open_it():
    w = Window(size=2)
    for i in range(5):
        w.session.send(delivery(b"%d" % i))
    assert [f.seq for f in w.out.frames()] == [1, 2]
    piece = len(delivery(b"0"))
    assert w.output.held_bytes == w.output.measure() == 3 * (piece + HELD_OVERHEAD)
    assert w.output.acknowledge(2) == 2
    assert len(w.out.sent) == 1  # the two that fit now: joined, numbered in one pass
    assert payloads(w.out.frames()) == [b"2", b"3"]
    assert w.output.acknowledge(1) == 0  # stale (1 is acknowledged already): nothing
    assert w.output.acknowledge(3) == 1
    assert payloads(w.out.frames()) == [b"4"]
    assert w.output.held_bytes == 0


@pytest.mark.parametrize("sent", [0, 3])
def test_an_ack_for_a_number_never_sent_is_the_clients_error(sent):
    w = Window(size=5)
    for i in range(sent):
        w.session.send(delivery(b"%d" % i))
    with pytest.raises(RemoteProtocolError, match="never sent"):
        w.output.acknowledge(sent + 1)


# -- queue groups ----------------------------------------------------------------------------------


def queue_message(payload=b"job"):
    return Message(Kind.MCAST, "pub", "mm2", "jobs", payload)


def test_a_queue_member_has_room_only_while_its_window_has():
    w = Window(size=1)
    group = QueueGroup("jobs", "g")
    assert w.session.ready()
    message = queue_message()
    w.session.deliver_queued(message.encoded(encode_delivery), message, group)
    assert payloads(w.out.frames()) == [b"job"]
    assert not w.session.ready()
    w.output.acknowledge(1)
    assert w.session.ready()


def test_queue_messages_never_acknowledged_are_given_back_oldest_first():
    w = Window(size=3)
    group = QueueGroup("jobs", "g")
    taken = [queue_message(b"%d" % i) for i in range(3)]
    for message in taken:
        w.session.deliver_queued(message.encoded(encode_delivery), message, group)
    w.session.send(delivery(b"plain"))  # held: not a queue message, nothing to give back
    w.output.acknowledge(1)  # "0" was acknowledged: it is done; "plain" goes out
    assert w.output.abandon() == [(taken[1], group), (taken[2], group)]
    assert not w.session.ready()  # gone: it takes nothing more
    assert w.output.abandon() == []


def test_without_acks_a_queue_message_is_sent_and_forgotten():
    w = Window()
    message = queue_message()
    w.session.deliver_queued(message.encoded(encode_delivery), message, QueueGroup("jobs", "g"))
    assert payloads(w.out.frames()) == [b"job"]
    assert w.output.abandon() == []


# -- past max-backlog ------------------------------------------------------------------------------

PIECE = len(delivery(b"000")) + HELD_OVERHEAD


def test_under_drop_the_newest_held_are_dropped_and_counted():
    w = Window(size=1, max_backlog=3 * PIECE, drop=True)
    dropped = []
    w.session.on_dropped = lambda session, count: dropped.append(count)
    for i in range(6):
        w.session.send(delivery(b"%03d" % i))
    assert w.output.held_bytes == 3 * PIECE  # one sent, three held, two dropped
    assert dropped == [1, 1]
    assert w.session.dropped == w.session.stats.dropped == 2
    for seq in range(1, 5):
        w.output.acknowledge(seq)
    assert payloads(w.out.frames()) == [b"000", b"001", b"002", b"003"]
    assert not w.link.closed


def test_under_disconnect_the_connection_is_cut_off_and_closed_on_the_next_turn():
    w = Window(size=1, max_backlog=2 * PIECE)
    group = QueueGroup("jobs", "g")
    job = queue_message()
    w.session.deliver_queued(job.encoded(encode_delivery), job, group)  # 1, unacknowledged
    for i in range(3):
        w.session.send(delivery(b"%03d" % i))
    assert w.output.cut_off
    assert w.session.dropped == 3  # what was held, and the one that outgrew the bound
    assert w.output.held_bytes == 0  # let go at once
    assert w.link.closed == []  # not during the fan-out that cut it off
    w.output.acknowledge(1)  # an ack changes nothing: it is sent nothing more
    w.session.send(delivery(b"late"))
    assert payloads(w.out.frames()) == [b"job"]
    assert w.session.dropped == 4
    assert not w.session.ready()
    w.tick()
    assert w.link.closed == [CloseReason.SLOW_CONSUMER]
    assert w.out.stopped  # Session.close stopped the output, and the one it wraps


def test_a_queue_message_still_unacknowledged_when_cut_off_is_given_back():
    w = Window(size=1, max_backlog=0)
    group = QueueGroup("jobs", "g")
    job = queue_message()
    w.session.deliver_queued(job.encoded(encode_delivery), job, group)
    w.session.send(delivery(b"m"))  # held past max-backlog 0: cut off
    w.tick()
    assert w.session.close_reason is CloseReason.SLOW_CONSUMER
    assert w.output.abandon() == [(job, group)]


# -- the broker's output budget --------------------------------------------------------------------


def test_what_the_window_holds_counts_in_the_budget_and_acks_give_it_back():
    budget = OutputBudget(limit=1 << 20)
    w = Window(size=1, budget=budget)
    for i in range(4):
        w.session.send(delivery(b"%03d" % i))
    assert budget.members == {w.output: 3 * PIECE}
    assert budget.total == 3 * PIECE
    for seq in range(1, 5):
        w.output.acknowledge(seq)
    assert budget.members == {}
    assert budget.total == 0


def test_a_window_that_keeps_up_never_joins_the_budget():
    budget = OutputBudget(limit=1)
    w = Window(size=2, budget=budget)
    for seq in range(1, 50):
        w.session.send(delivery(b"x"))
        w.output.acknowledge(seq)
    assert budget.members == {} and budget.cuts == 0


def test_past_the_budget_the_largest_window_is_cut_first():
    budget = OutputBudget(limit=5 * PIECE)
    big, small = Window(size=1, budget=budget), Window(size=1, budget=budget)
    for i in range(5):
        big.session.send(delivery(b"%03d" % i))  # 1 sent, 4 held
    small.session.send(delivery(b"000"))
    small.session.send(delivery(b"001"))  # held: the budget is full now
    assert not big.output.cut_off
    small.session.send(delivery(b"002"))  # past it: the larger backlog is cut, not this one
    assert big.output.cut_off and not small.output.cut_off
    assert budget.members == {small.output: 2 * PIECE}
    assert budget.cuts == 1
    big.tick()
    assert big.link.closed == [CloseReason.SLOW_CONSUMER]


def test_a_window_past_its_own_bound_cuts_nobody_else():
    budget = OutputBudget(limit=4 * PIECE)
    big = Window(size=1, budget=budget)
    for i in range(4):
        big.session.send(delivery(b"%03d" % i))  # 3 held: the budget's largest member
    own = Window(size=1, max_backlog=PIECE, budget=budget)
    for i in range(3):
        own.session.send(delivery(b"%03d" % i))  # past its own bound before the budget's
    assert own.output.cut_off and not big.output.cut_off
    assert budget.cuts == 0


def test_a_window_refused_by_the_budget_applies_its_own_policy():
    budget = OutputBudget(limit=2 * PIECE)
    dropping = Window(size=1, drop=True, budget=budget)
    for i in range(5):
        dropping.session.send(delivery(b"%03d" % i))
    assert dropping.output.held_bytes == 2 * PIECE  # what the budget admitted; the rest dropped
    assert dropping.session.dropped == 2
    cutting = Window(size=1, budget=OutputBudget(limit=2 * PIECE))
    for i in range(5):
        cutting.session.send(delivery(b"%03d" % i))
    assert cutting.output.cut_off
    cutting.tick()
    assert cutting.link.closed == [CloseReason.SLOW_CONSUMER]


def test_the_window_writes_through_the_framework_output_and_both_hold_their_own():
    clock = Clock()
    budget = OutputBudget(limit=0)
    link = RecordingLink()
    session = Session(protocol="mm2", encode=encode_delivery, stats=HubStats(), link=link)
    wire = MemoryWire()
    batcher = Batcher(clock)
    policy = OutputPolicy()
    out = TransportOutput(session, wire, policy, batcher, budget)
    window = WindowOutput(session, out, policy, budget)
    session.attach(window)
    window.configure(Timers(clock.seconds), 2, None)
    wire.fill()  # the peer stops reading: what the window sends is held by the transport output
    for i in range(3):
        session.send(delivery(b"%d" % i))
    batcher.flush()
    assert wire.data == b""
    assert budget.members == {out: out.held_bytes, window: window.held_bytes}
    assert window.held_bytes == len(delivery(b"2")) + HELD_OVERHEAD
    wire.drain()
    assert payloads(codec.FrameDecoder().feed(bytes(wire.data))) == [b"0", b"1"]
    window.stop()  # as the broker does when the session is gone
    assert budget.members == {}  # both let go of what they held
    assert out.stopped
