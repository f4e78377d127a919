"""The sbus server session alone, sans-IO (msgbroker.testing.drive): packets in, packets
out, flood control on a wire the test fills and drains, its block deadline on a fake clock.
The remembered routes (msgbroker.routecache) never change what anyone receives, and how a
transport groups packets into read slices does not either."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig, hookimpl, per_topic
from msgbroker.connection import Connection
from msgbroker.plugins.sbus.addresses import Credentials
from msgbroker.plugins.sbus.protocol import SbusServerSession
from msgbroker.reasons import CloseReason
from msgbroker.testing import MemoryWire, RecordingTransportLink, SessionDriver, drive, make_broker

ALICE = Credentials(pid=100, uid=1000, gid=1000)
BOB = Credentials(pid=200, uid=1001, gid=1001)


def client(broker: Any, credentials: Credentials = ALICE, **options: Any) -> SessionDriver:
    return drive(broker, "sbus", host="", credentials=credentials, **options)


def subscribed(broker: Any, *packets: bytes, credentials: Credentials = BOB) -> SessionDriver:
    driver = client(broker, credentials)
    for packet in packets:
        driver.feed(packet)
    return driver


def test_a_client_is_known_by_its_credentials_from_the_start():
    driver = client(make_broker())
    assert driver.session.identity == "sbus:1000:100"
    assert driver.session.data["sbus.credentials"] == ALICE
    driver.feed(b"CMSG !/cred/whoami")
    assert driver.received_packets() == [b"CMSG !/cred/whoami\0!/cred/1000/1000/100"]


def test_no_login_timeout_and_no_keepalive():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=1, keepalive=1))
    driver = client(broker)
    driver.advance(3600)
    assert not driver.closed and driver.received_packets() == []
    assert driver.timers.deadline is None


def test_a_publish_reaches_matching_patterns_as_the_very_packet():
    broker = make_broker()
    news, everything, other = (
        subscribed(broker, b"SUB news/*"),
        subscribed(broker, b"SUB "),
        subscribed(broker, b"SUB sport"),
    )
    publisher = client(broker)
    publisher.feed(b"MSG news/today\0\x00\xffbytes")
    assert (
        news.received_packets()
        == everything.received_packets()
        == [b"MSG news/today\0\x00\xffbytes"]
    )
    assert other.received_packets() == [] and publisher.received_packets() == []


def test_the_second_publish_on_a_key_goes_by_the_remembered_route_and_a_change_shows():
    broker = make_broker()
    first = subscribed(broker, b"SUB k")
    publisher = client(broker)
    publisher.feed(b"MSG k\0one")
    assert b"k" in publisher.server.routes.routes  # remembered
    routed = broker.hub.stats.routed
    publisher.feed(b"MSG k\0two")
    assert broker.hub.stats.routed == routed + 1
    late = subscribed(broker, b"SUB k")
    publisher.feed(b"MSG k\0three")
    assert first.received_packets() == [b"MSG k\0one", b"MSG k\0two", b"MSG k\0three"]
    assert late.received_packets() == [b"MSG k\0three"]


def test_a_subscribed_publisher_gets_its_own_messages_until_echo_off():
    driver = subscribed(make_broker(), b"SUB k", credentials=ALICE)
    driver.feed(b"MSG k\0one")
    driver.feed(b"MSG k\0two")  # remembered, the publisher among the recipients
    driver.feed(b"CMSG echo/off")
    driver.feed(b"MSG k\0three")
    driver.feed(b"CMSG echo/on")
    driver.feed(b"MSG k\0four")
    assert driver.received_packets() == [b"MSG k\0one", b"MSG k\0two", b"MSG k\0four"]


@pytest.mark.parametrize(
    ("packet", "detail"),
    [
        (b"MSG no-nul", "MSG without a NUL after its routing key"),
        (b"HELLO", None),
        (b"", None),
        (b"SUB !/cred/1/2/3/x", "may not subscribe to b'!/cred/1/2/3/x': not its credentials"),
    ],
)
def test_a_bad_packet_aborts_that_client_for_a_protocol_error(packet, detail):
    broker = make_broker()
    bystander = subscribed(broker, b"SUB k")
    driver = client(broker)
    driver.feed(packet)
    assert driver.closed_by == "abort"
    assert driver.session.close_reason is CloseReason.PROTOCOL_ERROR
    if detail is not None:
        assert driver.session.close_detail == detail
    assert not bystander.closed


def test_a_packet_over_the_listeners_maximum_is_a_protocol_error_even_on_a_remembered_key():
    broker = make_broker()
    subscriber = subscribed(broker, b"SUB k")
    driver = client(broker, max_packet=16)
    driver.feed(b"MSG k\0" + b"x" * 10)  # 16 bytes: the largest allowed, and remembered
    driver.feed(b"MSG k\0" + b"x" * 11)
    assert subscriber.received_packets() == [b"MSG k\0" + b"x" * 10]
    assert driver.session.close_text == "protocol error: packet of more than 16 bytes"


def test_a_refused_publish_or_subscribe_closes_as_not_authorized():
    class Refuses:
        @hookimpl
        def msgbroker_authorize(self, session, action, topic):
            return not topic.startswith("secret")

    broker = make_broker(plugins=[Refuses()])
    subscriber = subscribed(broker, b"SUB k")
    publisher = client(broker)
    publisher.feed(b"MSG k\0allowed")
    publisher.feed(b"MSG k\0allowed again")  # never remembered: the hook is asked each time
    publisher.feed(b"MSG secret\0no")
    assert subscriber.received_packets() == [b"MSG k\0allowed", b"MSG k\0allowed again"]
    assert publisher.session.close_text == "not authorized: publish 'secret'"
    refused = subscribed(broker, b"SUB secret/*")
    assert refused.session.close_reason is CloseReason.NOT_AUTHORIZED


def test_a_sub_over_max_subscriptions_closes_that_client():
    broker = make_broker(BrokerConfig(auth=("open",), max_subscriptions=1))
    driver = subscribed(broker, b"SUB a", b"SUB b")
    assert driver.session.close_text == "limit exceeded: max-subscriptions"


def test_a_shutdown_sends_what_waits_and_a_lost_client_leaves_the_hub():
    broker = make_broker()
    driver = subscribed(broker, b"SUB k")
    driver.session.close(CloseReason.SHUTDOWN)
    assert driver.closed_by == "close"  # not aborted: its outbox is sent first
    gone = subscribed(broker, b"SUB k")
    gone.lose()
    assert gone.session not in broker.sessions and not broker.hub.patterns


# -- flood control, on a wire that stops taking packets ---------------------------------


def test_soft_queue_keeps_what_the_client_does_not_take_and_sends_it_in_order():
    broker = make_broker()
    slow = subscribed(broker, b"SUB k", b"CMSG order/stack")
    publisher = client(broker)
    slow.wire.fill()
    for n in range(3):
        publisher.feed(b"MSG k\0%d" % n)
    assert slow.received_packets() == [] and slow.session.output.measure() > 0
    slow.wire.drain()
    assert slow.received_packets() == [b"MSG k\x002", b"MSG k\x001", b"MSG k\x000"]


def test_soft_error_is_the_clients_own_choice_and_closes_it_as_flood_control():
    broker = make_broker()
    slow = subscribed(broker, b"SUB k", b"CMSG blocking/soft/error")
    slow.wire.fill()
    client(broker).feed(b"MSG k\0x")
    assert slow.session.close_reason is CloseReason.FLOOD_CONTROL
    assert slow.session.close_detail == "could not take a message (blocking/soft/error)"
    assert slow.closed_by == "abort" and slow.session.dropped == 1


def test_the_bound_closes_a_slow_consumer_by_default_and_discards_with_drop():
    for policy, closed in (("disconnect", True), ("drop", False)):
        broker = make_broker(BrokerConfig(auth=("open",), max_backlog=1000, slow_consumer=policy))
        slow = subscribed(broker, b"SUB k")
        slow.wire.fill()
        publisher = client(broker)
        for _ in range(20):
            publisher.feed(b"MSG k\0" + b"x" * 100)
        assert slow.closed == closed
        if closed:
            assert slow.session.close_reason is CloseReason.SLOW_CONSUMER
        else:
            assert 0 < slow.session.output.measure() <= 1000 and slow.session.dropped > 0


@pytest.mark.parametrize("policy", ["disconnect", "drop"])
def test_block_pauses_the_publisher_for_at_most_the_block_timeout(policy):
    broker = make_broker(BrokerConfig(auth=("open",), block_timeout=2.0, slow_consumer=policy))
    slow = subscribed(broker, b"SUB k", b"CMSG blocking/soft/block")
    healthy = subscribed(broker, b"SUB k")
    publisher = client(broker)
    slow.wire.fill()
    publisher.feed(b"MSG k\0first")
    assert publisher.reading_paused and publisher.session.reading_held
    assert healthy.received_packets() == [b"MSG k\0first"]
    slow.advance(1.999)
    assert publisher.reading_paused and not slow.closed
    slow.advance(0.001)
    assert not publisher.reading_paused  # the deadline ran on the slow client's timers
    if policy == "disconnect":
        assert slow.session.close_text == (
            "slow consumer: paused its publishers for 2 s (blocking/*/block)"
        )
    else:
        assert not slow.closed
        publisher.feed(b"MSG k\0second")  # the stall goes on: dropped, nobody paused
        assert not publisher.reading_paused and slow.session.dropped == 1
        slow.wire.drain()
        assert slow.received_packets() == [b"MSG k\0first"]


def test_a_stall_that_ends_in_time_releases_the_publisher_and_cancels_the_deadline():
    broker = make_broker(BrokerConfig(auth=("open",), block_timeout=2.0))
    slow = subscribed(broker, b"SUB k", b"CMSG blocking/soft/block")
    publisher = client(broker)
    slow.wire.fill()
    publisher.feed(b"MSG k\0one")
    assert publisher.reading_paused and slow.timers.deadline is not None
    slow.wire.drain()
    assert not publisher.reading_paused and slow.timers.deadline is None
    slow.advance(10)
    assert not slow.closed and slow.received_packets() == [b"MSG k\0one"]


# -- the route cache and read slices never change the outcome ---------------------------


class Abstains:
    """Implements msgbroker_authorize and never decides: the broker asks it each time,
    so no route is ever remembered."""

    @hookimpl
    def msgbroker_authorize(self, session, action, topic):
        return None


class PerTopicAbstains:
    """Decides per topic (msgbroker.per_topic) and never refuses: routes are remembered,
    and what is delivered is what the hub would deliver."""

    def __init__(self):
        self.asked = 0

    @hookimpl
    @per_topic
    def msgbroker_authorize(self, session, action, topic):
        self.asked += 1
        return None


KEYS = st.sampled_from([b"a", b"a/b", b"b"])
PATTERNS = st.sampled_from([b"a", b"a/", b"*/b", b""])
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("SUB "), st.integers(0, 2), PATTERNS),
        st.tuples(st.just("UNSUB "), st.integers(0, 2), PATTERNS),
        st.tuples(st.just("MSG "), st.integers(0, 2), KEYS),
        st.tuples(st.just("CMSG "), st.integers(0, 2), st.sampled_from([b"echo/off", b"echo/on"])),
    ),
    max_size=40,
)


def run(operations: list[tuple[str, int, bytes]], plugins: list[Any]) -> list[list[bytes]]:
    broker = make_broker(plugins=plugins)
    clients = [client(broker, Credentials(i, 1000 + i, 1000 + i)) for i in range(3)]
    for n, (verb, who, what) in enumerate(operations):
        packet = verb.encode() + what + (b"\0%d" % n if verb == "MSG " else b"")
        clients[who].feed(packet)
    return [c.received_packets() for c in clients]


@settings(max_examples=150, deadline=None)
@given(OPERATIONS)
def test_remembered_routes_deliver_exactly_what_the_hub_would(operations):
    assert run(operations, []) == run(operations, [Abstains()])
    assert run(operations, []) == run(operations, [PerTopicAbstains()])


def test_a_per_topic_hook_lets_a_key_be_remembered_until_the_hooks_change():
    hook = PerTopicAbstains()
    broker = make_broker(plugins=[hook])
    subscriber = subscribed(broker, b"SUB k")
    publisher = client(broker)
    asked = hook.asked  # the SUB was asked about
    for n in range(3):
        publisher.feed(b"MSG k\0%d" % n)
    assert hook.asked == asked + 1  # the first publish; then the route is remembered
    broker.add_plugin(object(), name="another")  # the hooks change: asked again
    publisher.feed(b"MSG k\0again")
    assert hook.asked == asked + 2
    assert subscriber.received_packets() == [b"MSG k\0" + m for m in (b"0", b"1", b"2", b"again")]


CONVERSATION = [
    b"SUB k/",
    b"CMSG !/cred/whoami",
    b"MSG k/a\0one",
    b"MSG k/a\0two",
    b"CMSG echo/off",
    b"MSG k/a\0three",
    b"UNSUB k/",
    b"CMSG echo/on",
    b"MSG k/a\0four",
    b"SUB k/a",
    b"MSG k/a\0five",
]
EXPECTED = [
    b"CMSG !/cred/whoami\0!/cred/1000/1000/100",
    b"MSG k/a\0one",
    b"MSG k/a\0two",
    b"MSG k/a\0five",
]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 4), max_size=12))
def test_any_grouping_into_read_slices_gives_the_same_conversation(sizes):
    broker = make_broker()
    wire = MemoryWire()
    options = {"credentials": ALICE, "max_packet": 1000}
    link = RecordingTransportLink()
    connection = Connection(broker, SbusServerSession, link, wire, options=options)
    other = subscribed(broker, b"SUB k/a")
    at = 0
    for size in [*sizes, len(CONVERSATION)]:
        connection.packets_received(iter(CONVERSATION[at : at + size]))
        at += size
    assert wire.writes == EXPECTED
    assert [p.split(b"\0")[1] for p in other.received_packets()] == [
        b"one",
        b"two",
        b"three",
        b"four",
        b"five",
    ]


def test_nothing_in_a_slice_after_a_close_is_routed_even_on_a_remembered_key():
    broker = make_broker()
    subscriber = subscribed(broker, b"SUB k")
    link = RecordingTransportLink()
    options = {"credentials": ALICE, "max_packet": 1000}
    connection = Connection(broker, SbusServerSession, link, MemoryWire(), options=options)
    connection.packets_received(iter([b"MSG k\0one"]))  # now remembered
    connection.packets_received(iter([b"MSG k\0two", b"BAD", b"MSG k\0three", b"SUB x"]))
    assert [reason for reason, _ in link.ended] == [CloseReason.PROTOCOL_ERROR]
    assert subscriber.received_packets() == [b"MSG k\0one", b"MSG k\0two"]
    connection.packets_received(iter([b"MSG k\0four"]))  # closed: nothing more is taken
    assert subscriber.received_packets() == []
