"""Both Micromessage2 clients on real loopback sockets, against :class:`FakeMM2Server` (in the
session-wide reactor thread), and in the ``# real broker:`` tests against a real broker too
(the ``target`` fixture): routing through topics, filters and unicasts, json, dotnet,
fragments over 1 MiB, acks both ways, the blocking publish behind the window (with a fake
clock for its timeout), refusals and ERROR frames, vendor extensions."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from decimal import Decimal

import pytest

from msgbroker.plugins.mm2.client import (
    MM2ConnectionClosed,
    MM2HandshakeRefused,
    MM2ServerError,
    MM2Timeout,
)
from msgbroker.plugins.mm2.codec import ErrorFrame, ExtensionFrame, Handshake, MessageFrame
from tests.mm2.client_support import (
    FakeMM2Server,
    Target,
    blocking_client,
    broker_connection,
    fake_or_broker,
    mm2_broker,
    settle,
    twisted_client,
)
from tests.ssmp.e2e_support import WAIT, RunningBroker, reactor_thread


@pytest.fixture
def server() -> Iterator[FakeMM2Server]:
    with FakeMM2Server(reactor_thread()) as running:
        yield running


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    """A broker of its own per test (identities and subscriptions do not carry over)."""
    with mm2_broker() as running:
        yield running


@pytest.fixture(params=["fake", "broker"])
def target(request) -> Iterator[Target]:
    """The fake server or the real broker."""
    with fake_or_broker(request, reactor_thread()) as chosen:
        yield chosen


# real broker: a topic publish reaches a subscriber with its typed properties
def test_blocking_publish_reaches_a_blocking_subscriber(target):
    with (
        blocking_client(target, identity="bob") as bob,
        blocking_client(target, identity="al") as al,
    ):
        bob.subscribe("news")
        settle(bob)
        al.publish("news", b"hello", {"n": 42, "d": Decimal("1.5"), "t": "a b"})
        message = bob.next_message(WAIT)
        assert message.destination == "news" and message.payload == b"hello"
        assert message.properties == {"n": 42, "d": Decimal("1.5"), "t": "a b"}


# real broker: only messages whose properties pass the subscription's filters arrive
def test_filters_select_what_arrives(target):
    with (
        blocking_client(target, identity="bob") as bob,
        blocking_client(target, identity="al") as al,
    ):
        bob.subscribe("prices", filters=["price>=N10"])
        settle(bob)
        al.publish("prices", b"cheap", {"price": 5})
        al.publish("prices", b"dear", {"price": 12})
        assert bob.next_message(WAIT).payload == b"dear"


# real broker: a unicast to @bob arrives with destination @<sender>
def test_unicast_arrives_from_the_sender(target):
    with (
        blocking_client(target, identity="bob") as bob,
        blocking_client(target, identity="al") as al,
    ):
        al.unicast("bob", b"psst")
        message = bob.next_message(WAIT)
        assert (message.destination, message.sender, message.payload) == ("@al", "al", b"psst")


# real broker: json values round-trip and the dotnet type travels with the message
def test_json_values_and_dotnet_types_round_trip(target):
    both = ("pubsub", "json", "dotnet")
    with blocking_client(target, identity="bob", required=both) as bob:
        with blocking_client(target, identity="al", required=both) as al:
            bob.subscribe("events")
            settle(bob)
            al.publish("events", {"id": 1}, type_name="Shop.Order, Shop")
            al.publish("events", [2])
            first, second = bob.next_message(WAIT), bob.next_message(WAIT)
            assert (first.value, first.type_name) == ({"id": 1}, "Shop.Order, Shop")
            assert (second.value, second.type_name) == ([2], "Shop.Order, Shop")


# real broker: a payload over 1 MiB is split and arrives whole
def test_a_payload_over_one_mib_arrives_whole(target):
    payload = bytes(range(256)) * 6000  # about 1.5 MiB
    with (
        blocking_client(target, identity="bob") as bob,
        blocking_client(target, identity="al") as al,
    ):
        bob.subscribe("big")
        settle(bob)
        al.publish("big", payload)
        assert bob.next_message(WAIT).payload == payload
        if isinstance(target, FakeMM2Server):
            assert len(target.logged(MessageFrame, conn=1)) == 2  # two fragments


# real broker: the Twisted client subscribes, receives and acknowledges within the window
def test_twisted_client_receives_and_acks_within_the_window(target):
    got: queue.Queue = queue.Queue()
    proto = twisted_client(target, identity="tw", on_message=got.put)
    target.call(proto.subscribe, "news")
    target.call(proto.unicast, "tw", b"settle")  # a round trip: the subscription holds
    assert got.get(timeout=WAIT).payload == b"settle"
    if isinstance(target, FakeMM2Server):
        assert target.wait(lambda: target.connections[0].window) == 10
    else:
        assert target.call(lambda: broker_connection(target, "tw").window) == 10
    with blocking_client(target, identity="al") as al:
        for i in range(25):
            al.publish("news", str(i).encode())
        payloads = [got.get(timeout=WAIT).payload for _ in range(25)]  # past the window
        assert payloads == [str(i).encode() for i in range(25)]
    if isinstance(target, FakeMM2Server):
        target.wait(lambda: target.connections[0].outstanding == 0)  # all acknowledged
    else:
        # another round trip: the ack up to 26 (the last message) was written before it
        target.call(proto.unicast, "tw", b"again")
        assert got.get(timeout=WAIT).payload == b"again"
        unacked = target.call(
            lambda: [seq for seq, _ in broker_connection(target, "tw").output.unacked]
        )
        assert unacked in ([], [27])  # at most the round trip's own message
    target.call(proto.close)


def test_twisted_publish_waits_for_the_servers_acks(server):
    server.hold_acks = True
    proto = twisted_client(server, identity="tw", optional=("ack",))
    written: queue.Queue = queue.Queue()

    def publish_two():
        for payload in (b"1", b"2"):
            proto.publish("t", payload).addCallback(written.put)
        return proto.queued

    assert server.call(publish_two) == 1  # the window of one holds the second back
    assert written.get(timeout=WAIT) == 1
    server.wait(lambda: server.logged(MessageFrame))
    server.call(server.connections[0].ack)
    assert written.get(timeout=WAIT) == 2
    server.wait(lambda: len(server.logged(MessageFrame)) == 2)
    server.call(proto.close)


def test_twisted_connect_fails_on_a_refused_handshake(server):
    server.reply = Handshake("fake", ("pubsub", "x-secret"), ())
    with pytest.raises(MM2HandshakeRefused, match="x-secret"):
        twisted_client(server, identity="tw")
    server.wait(lambda: server.logged(ErrorFrame) and server.ended(0))
    assert server.logged(ErrorFrame) == [ErrorFrame("unsupported extensions: x-secret")]


def test_blocking_acks_what_it_hands_out_cumulatively(server):
    with (
        blocking_client(server, identity="bob") as bob,
        blocking_client(server, identity="al") as al,
    ):
        bob.subscribe("news")
        server.wait(lambda: server.connections[0].subscriptions)
        for i in range(30):
            al.publish("news", b"%d" % i)
        assert [bob.next_message(WAIT).payload for _ in range(30)] == [b"%d" % i for i in range(30)]
        server.wait(lambda: server.connections[0].outstanding == 0)
        acks = server.logged(ExtensionFrame, conn=0)
        assert 3 <= len(acks) <= 30  # at least once per window of 10, at most once a message


class SteppingClock:
    """A fake clock that moves ``step`` seconds each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.step = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_blocking_publish_blocks_on_a_full_window_and_times_out_on_the_clock(server):
    server.hold_acks = True
    clock = SteppingClock()
    with blocking_client(
        server, identity="al", optional=("batch-ack:max-count=2",), clock=clock
    ) as al:
        al.publish("t", b"1")
        al.publish("t", b"2")
        clock.step = 10.0  # time passes between reading the clock twice: no real wait
        with pytest.raises(MM2Timeout, match="no room in the ack window within 5 s"):
            al.publish("t", b"3", timeout=5)
        clock.step = 0.0
        server.wait(lambda: len(server.logged(MessageFrame)) == 2)
        server.call(server.connections[0].ack, 1)
        assert al.publish("t", b"3", timeout=WAIT) == 3  # the ack made room
        server.wait(lambda: len(server.logged(MessageFrame)) == 3)  # else ack() covers only 2
        server.call(server.connections[0].ack)
        assert al.wait_acked(WAIT)


def test_blocking_handshake_refusal_raises_with_the_servers_list(server):
    server.reply = Handshake("fake", ("pubsub", "xml"), ())
    with pytest.raises(MM2HandshakeRefused, match="requires pubsub;xml") as info:
        blocking_client(server, identity="al")
    assert info.value.unsupported == ("xml",)
    server.wait(lambda: server.logged(ErrorFrame))


def test_blocking_error_frame_instead_of_step_2(server):
    server.refuse = "identity taken"
    with pytest.raises(MM2ServerError, match="identity taken"):
        blocking_client(server, identity="al")


def test_blocking_error_frame_later_ends_the_connection(server):
    with blocking_client(server, identity="al") as al:
        server.call(server.connections[0].error, "shutting down")
        with pytest.raises(MM2ServerError, match="shutting down"):
            al.next_message(WAIT)
        with pytest.raises(MM2ConnectionClosed, match="shutting down"):
            al.publish("t", b"x")


def test_vendor_extensions_are_negotiated_when_supported(server):
    server.reply = Handshake("fake", ("x-trace",), ("x-zip",))
    server.supported = server.supported | {"x-trace", "x-zip"}
    with blocking_client(server, identity="al", optional=("x-zip",), supported=("x-trace",)) as al:
        assert al.active.names == ("pubsub", "x-trace", "x-zip")
        confirm = server.wait(lambda: server.logged(Handshake)[1:])
        assert [e.name for e in confirm[0].optional] == ["x-zip"]
        al.send_extension("x-trace", b"on")
        frame = server.wait(lambda: server.logged(ExtensionFrame))
        assert frame == [ExtensionFrame(2, b"on")]
