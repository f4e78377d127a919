"""What Micromessage2 holds for consumers that do not keep up: a queue group whose member
never acks holds at most ``mm2-queue-backlog`` bytes (counted as the memory its messages
take)."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.codec import ExtensionFrame, MessageFrame
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
    assert member.conn.protocol._held_bytes == 0  # the connection itself holds none
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
