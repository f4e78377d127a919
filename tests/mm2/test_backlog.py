"""What Micromessage2 holds for consumers that do not keep up: a queue group whose member
never acks holds at most ``mm2-queue-backlog`` bytes (counted as the memory its messages
take), and what waits for one connection's full ack window is bounded by ``max-backlog``
as the memory it takes, under either slow-consumer policy."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.codec import ExtensionFrame, MessageFrame
from msgbroker.plugins.mm2.window import HELD_OVERHEAD
from msgbroker.queues import MESSAGE_OVERHEAD
from msgbroker.testing import make_broker
from tests.mm2.test_protocol import client
from tests.ssmp.e2e_support import WAIT, parse_address, running_broker

ACK_ID = 2  # "ack" after "pubsub" in the step-3 lists of these clients


def ack(consumer, seq):
    consumer.send(ExtensionFrame(ACK_ID, seq.to_bytes(2, "big")))


# -- a queue group whose member never acks ------------------------------------------------------

PAYLOAD = b"q" * (64 << 10)
#: what a kept message costs: its payload, and its Micromessage2 frame memoized beside it
ONE = len(PAYLOAD) + len(codec.encode_message(MessageFrame(1, "jobs", PAYLOAD))) + MESSAGE_OVERHEAD
BOUND = 1 << 20


def test_a_never_acking_member_holds_its_window_and_the_group_at_most_its_bound():
    broker = make_broker(BrokerConfig(auth=("open",), mm2_queue_backlog=BOUND))
    member = client(broker, "member", optional=("pubsub", "ack"))
    member.subscribe("jobs", queue="workers")
    pub = client(broker, "pub")
    group = broker.hub.topics["jobs"].queues["workers"]
    for _ in range(100):  # 6.4 MB published
        pub.publish("jobs", PAYLOAD)
        assert group.backlog_bytes <= BOUND + ONE
    kept = BOUND // ONE
    assert len(group.backlog) == kept
    assert group.backlog_bytes == kept * ONE
    assert broker.hub.stats.dropped == 100 - 1 - kept  # the oldest went, counted
    assert member.received() == [MessageFrame(1, "jobs", PAYLOAD)]  # its window of one
    assert member.conn.session.output.measure() == 0  # the connection itself holds none
    ack(member, 1)  # it takes the oldest still kept: message 100 - kept + 1
    assert member.received() == [MessageFrame(2, "jobs", PAYLOAD)]
    assert group.backlog_bytes == (kept - 1) * ONE
    member.conn.drop()  # the last member leaves: nothing is kept for nobody
    assert group.backlog_bytes == 0
    assert broker.hub.stats.dropped == 100 - 2 + 1  # and its unacknowledged one too


@pytest.fixture(scope="module")
def queued():
    with running_broker(("mm2=tcp:0:interface=127.0.0.1",), mm2_queue_backlog=BOUND) as broker:
        yield broker


def test_e2e_a_never_acking_member_over_real_sockets(queued):
    port = parse_address(queued.service.broker.listening[0][1])[1]
    member = BlockingMM2Client(
        "127.0.0.1", port, "member", ("pubsub", "ack"), (), auto_ack=False, timeout=WAIT
    )
    member.subscribe("jobs", queue="workers")
    member.publish("@nobody", b"")  # acked by the broker: the subscription is in force
    assert member.wait_acked()
    with BlockingMM2Client("127.0.0.1", port, "pub", timeout=WAIT) as pub:
        for _ in range(100):
            pub.publish("jobs", PAYLOAD)
        assert pub.wait_acked()  # the broker has routed all of them
    hub = queued.service.broker.hub

    def state():
        group = hub.topics["jobs"].queues["workers"]
        return group.backlog_bytes, len(group.backlog), hub.stats.dropped

    kept = BOUND // ONE
    assert queued.thread.call(state) == (kept * ONE, kept, 100 - 1 - kept)
    message = member.next_message(timeout=WAIT)
    assert (message.destination, message.payload) == ("jobs", PAYLOAD)
    member.close()


# -- what waits for a full ack window -----------------------------------------------------------

PIECE = len(codec.encode_message(MessageFrame(1, "t", b"000"))) + HELD_OVERHEAD
MAX_BACKLOG = 10_000
FITS = MAX_BACKLOG // PIECE  # messages held for a window of one before the bound


def slow_pair(slow_consumer):
    broker = make_broker(
        BrokerConfig(auth=("open",), max_backlog=MAX_BACKLOG, slow_consumer=slow_consumer)
    )
    sub = client(broker, "sub", optional=("pubsub", "ack"))
    sub.subscribe("t")
    return broker, sub, client(broker, "pub")


def test_held_messages_count_what_they_take_so_a_tiny_flood_is_cut_early():
    broker, sub, pub = slow_pair("disconnect")
    for index in range(1, 200):
        pub.publish("t", b"%03d" % index)
        broker.reactor.advance(0)  # the close is made on the next turn
        if sub.conn.closed:
            break
    # one sent, FITS held, and the next one is past the bound (counting 8 bytes a message
    # would have held over a thousand)
    assert index == 1 + FITS + 1
    assert sub.conn.session.close_reason == "slow consumer"
    assert broker.hub.stats.dropped == FITS + 1


def test_under_the_drop_policy_the_newest_are_dropped_and_the_connection_stays():
    broker, sub, pub = slow_pair("drop")
    for index in range(1, 201):
        pub.publish("t", b"%03d" % index)
    broker.reactor.advance(0)
    assert not sub.conn.closed
    assert broker.hub.stats.dropped == sub.conn.session.dropped == 200 - 1 - FITS
    got = []
    for seq in range(1, FITS + 2):
        got += sub.received()
        ack(sub, seq)
    assert got == [MessageFrame(i, "t", b"%03d" % i) for i in range(1, FITS + 2)]
    assert sub.received() == []  # the rest were dropped
    pub.publish("t", b"new")  # and it goes on
    assert sub.received() == [MessageFrame(FITS + 2, "t", b"new")]


def test_a_consumer_being_cut_off_gets_nothing_more_and_its_queue_work_waits_for_another():
    broker = make_broker(BrokerConfig(auth=("open",), max_backlog=0))
    slow = client(broker, "slow", optional=("pubsub", "ack"))
    slow.subscribe("x")
    slow.subscribe("jobs", queue="g")
    busy = client(broker, "busy", optional=("pubsub", "ack"))
    busy.subscribe("jobs", queue="g")
    pub = client(broker, "pub")
    pub.publish("jobs", b"j0")  # to slow (round-robin starts with it)
    pub.publish("jobs", b"j1")  # to busy
    pub.publish("jobs", b"j2")  # both windows full: it waits in the group
    assert slow.received() == [MessageFrame(1, "jobs", b"j0")]
    assert busy.received() == [MessageFrame(1, "jobs", b"j1")]
    pub.publish("x", b"m")  # slow's window is full: held past max-backlog 0, cut off
    ack(slow, 1)  # before the close: it must not be sent "m", nor take j2 and lose it
    assert slow.received() == []
    broker.reactor.advance(0)
    assert slow.conn.closed
    ack(busy, 1)
    assert busy.received() == [MessageFrame(2, "jobs", b"j2")]
    assert broker.hub.stats.dropped == 1  # "m"
