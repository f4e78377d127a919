"""Micromessage2 in the protocol matrix: MM2 ↔ SSMP ↔ STMP (TCP and WebSocket), both ways,
over real sockets with the independent adapters (tests/interop/peers.py, mm2_peer.py).

What Micromessage2 has is tested against every other protocol: MCAST with exact bytes,
no echo, unicast both ways, the shared identity table (a kick), order of pipelined
messages, large payloads and skips, and what a message without properties means to a
filtered Micromessage2 subscriber (it never matches; a plain one gets it). What it has not
(presence, broadcast, anonymous logins, refusals) is left out: see mm2_peer.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from msgbroker.filters import Filter
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import MessageFrame, Subscribe
from tests.interop.mm2_peer import UNKNOWN, MM2Peer
from tests.interop.peers import PEERS, Event, Peer
from tests.interop.test_matrix import PAYLOADS, unique
from tests.ssmp.e2e_support import running_broker

ALL = {**PEERS, MM2Peer.name: MM2Peer}
#: every pair with Micromessage2 on at least one side
PAIRS = [(a, b) for a in ALL for b in ALL if "mm2" in (a, b)]
PAIR_IDS = [f"{a}->{b}" for a, b in PAIRS]


@pytest.fixture(scope="module")
def addresses() -> Iterator[dict[str, str]]:
    endpoints = {cls.listener: cls.endpoint for cls in ALL.values()}
    listeners = tuple(f"{name}={endpoint}" for name, endpoint in sorted(endpoints.items()))
    with running_broker(listeners, auth=("open",)) as running:
        yield {listener.protocol: address for listener, address in running.service.broker.listening}


@pytest.fixture
def connect(addresses) -> Iterator:
    opened: list[Peer] = []

    def open_peer(name: str, identity: str | None = None) -> Peer:
        cls = ALL[name]
        peer = cls(addresses[cls.listener])
        opened.append(peer)
        peer.login(identity or unique(name))
        return peer

    yield open_peer
    for peer in opened:
        if not peer.closed:
            peer.close()


def seen(receiver: Peer, event: Event) -> Event:
    """``event`` as ``receiver``'s protocol shows it (Micromessage2 names no MCAST sender)."""
    if isinstance(receiver, MM2Peer) and event.kind == "mcast":
        return Event(UNKNOWN, event.kind, event.topic, event.data)
    return event


@pytest.mark.parametrize(("pub", "sub"), PAIRS, ids=PAIR_IDS)
def test_publish_reaches_subscriber_with_exact_bytes(connect, pub, sub):
    topic = unique("t")
    publisher, subscriber = connect(pub), connect(sub)
    subscriber.subscribe(topic)
    for data in PAYLOADS:
        if not type(subscriber).carries(publisher.identity, topic, data):
            continue
        publisher.publish(topic, data)
        expected = seen(subscriber, Event(publisher.identity, "mcast", topic, data))
        assert subscriber.next_event() == expected, data
    assert subscriber.sync() == []
    assert publisher.sync() == []  # no echo


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=PAIR_IDS)
def test_unicast_reaches_the_target(connect, src, dst):
    sender, target = connect(src), connect(dst)
    for data in PAYLOADS:
        if not type(target).carries(sender.identity, None, data):
            continue
        sender.unicast(target.identity, data)
        assert target.next_event() == Event(sender.identity, "ucast", None, data), data
    assert target.sync() == []
    assert sender.sync() == []


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=PAIR_IDS)
def test_login_with_the_same_identity_kicks_the_other_connection(connect, old, new):
    identity = unique("who")
    first = connect(old, identity)
    second = connect(new, identity)
    first.wait_closed()
    third = connect(old)
    third.unicast(identity, b"to the new holder")
    assert second.next_event() == Event(third.identity, "ucast", None, b"to the new holder")


def _sequence(count: int) -> list[bytes]:
    return [b"\x00seq %03d\n" % i if i % 7 == 3 else b"seq %03d" % i for i in range(count)]


@pytest.mark.parametrize(("pub", "sub"), PAIRS, ids=PAIR_IDS)
def test_pipelined_messages_arrive_in_order(connect, pub, sub):
    topic = unique("o")
    publisher, subscriber = connect(pub), connect(sub)
    subscriber.subscribe(topic)
    items = _sequence(100)
    publisher.publish_many(topic, items)  # one write
    got = subscriber.events(len(items))
    assert got == [seen(subscriber, Event(publisher.identity, "mcast", topic, d)) for d in items]
    assert subscriber.sync() == []


#: over SSMP's 1,024 bytes and a 16-bit WebSocket length: Micromessage2 carries it
HUGE = bytes(range(256)) * 800


@pytest.mark.parametrize("other", list(PEERS))
def test_a_payload_ssmp_cannot_carry_reaches_mm2_and_skips_only_ssmp(connect, other):
    topic = unique("h")
    mm2, peer = connect("mm2"), connect(other)
    for subscriber in (mm2, peer):
        subscriber.subscribe(topic)
    publisher = connect("mm2")
    publisher.publish(topic, HUGE)
    assert mm2.next_event() == Event(UNKNOWN, "mcast", topic, HUGE)
    expected = (
        []
        if not type(peer).carries(publisher.identity, topic, HUGE)
        else [Event(publisher.identity, "mcast", topic, HUGE)]
    )
    assert peer.sync() == expected
    assert mm2.sync() == []


@pytest.mark.parametrize("pub", list(ALL))
def test_a_message_without_properties_never_matches_a_filtered_mm2_subscriber(
    connect, addresses, pub
):
    """SSMP and STMP messages carry no properties: a filtered Micromessage2 subscriber never
    gets them (even with ``!=``); a plain one does. A Micromessage2 publisher's properties
    are what its filters see."""
    topic = unique("f")
    plain, filtered = connect("mm2"), connect("mm2")
    plain.subscribe(topic)
    filtered._write(
        codec.encode_frame(codec.encode_pubsub(Subscribe(topic, None, (Filter("n", "!=", 0),))))
    )
    filtered._barrier()
    publisher = connect(pub)
    publisher.publish(topic, b"no properties")
    if isinstance(publisher, MM2Peer):
        publisher._seq = codec.next_seq(publisher._seq)
        publisher._write(
            codec.encode_message(MessageFrame(publisher._seq, topic, b"n is 5", {"n": 5}))
        )
        publisher._barrier()
    assert plain.next_event() == Event(UNKNOWN, "mcast", topic, b"no properties")
    expected = [Event(UNKNOWN, "mcast", topic, b"n is 5")] if pub == "mm2" else []
    assert filtered.sync() == expected
