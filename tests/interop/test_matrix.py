"""The protocol-by-protocol matrix: every protocol publishes, every protocol receives.

One broker for the whole module (one listener per protocol, ``--auth open``), real loopback
sockets, and the independent wire-level adapters of :mod:`tests.interop.peers`. Every test
uses its own topics and identities, so tests never see each other's traffic.

Absence ("no echo", "exactly once", "skipped") is proven without waiting for a silence:
:meth:`Peer.sync` has the peer unicast a marker to itself, and the broker handles a
connection's requests in order, so whatever it routed to that peer earlier arrives before
the marker.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from attrs import frozen

from tests.interop.peers import PEERS, VARIANTS, Event, Peer, Refused
from tests.ssmp.e2e_support import RunningBroker, running_broker

ALL = {**PEERS, **VARIANTS}
PAIRS = [(a, b) for a in PEERS for b in PEERS]
PAIR_IDS = [f"{a}->{b}" for a, b in PAIRS]

#: exact bytes every protocol carries: text, binary (NUL, LF, 0xFF), the STMP text
#: separator, UTF-8, invalid UTF-8, JSON-looking text, spaces, SSMP's largest payloads
PAYLOADS = [
    b"hello world",
    b"\x00\n\xffbinary\x00\nwith LF\n",
    b"a|b||c|",
    b"|",
    "café ☕ ünïcødé".encode(),
    b"\xc3\x28 not utf-8 \xff",
    b"\x00NUL and LF\n but valid UTF-8\r\n",
    b"\xed\xa0\x80 an encoded surrogate",
    b'{"data": "x", "data_b64": 1}',
    b" leading and trailing spaces ",
    b"\x01",
    b"x" * 1024,
    bytes(range(256)) * 4,
]
#: more than SSMP carries (1024 bytes): 5 KiB with NUL, LF and 0xFF in it
BIG = bytes(range(256)) * 20

_serial = itertools.count(1)


def unique(hint: str) -> str:
    """A name no other test uses (a valid SSMP id)."""
    return f"{re.sub(r'[^A-Za-z0-9]', '_', hint)}-{next(_serial)}"


@frozen(eq=False)
class Matrix:
    running: RunningBroker
    #: listener name -> where it is bound (``tcp:127.0.0.1:PORT``)
    addresses: dict[str, str]

    def skipped(self) -> int:
        """The hub's count of skipped recipients (read in the reactor thread)."""
        hub = self.running.service.broker.hub
        return int(self.running.call(lambda: hub.stats.skipped))


@pytest.fixture(scope="module")
def matrix() -> Iterator[Matrix]:
    endpoints = {cls.listener: cls.endpoint for cls in ALL.values()}
    listeners = tuple(f"{name}={endpoint}" for name, endpoint in sorted(endpoints.items()))
    with running_broker(listeners, auth=("open",)) as running:
        addresses = {
            listener.protocol: address for listener, address in running.service.broker.listening
        }
        assert set(addresses) == set(endpoints)
        yield Matrix(running, addresses)


class Connector:
    """Opens peers for one test and closes them after it."""

    def __init__(self, matrix: Matrix) -> None:
        self.matrix = matrix
        self.opened: list[Peer] = []

    def __call__(self, name: str, identity: str | None = None) -> Peer:
        """A peer of adapter ``name``, logged in as ``identity`` (default: a fresh one)."""
        cls = ALL[name]
        peer = cls(self.matrix.addresses[cls.listener])
        self.opened.append(peer)
        peer.login(identity or unique(name))
        return peer

    def close_all(self) -> None:
        for peer in self.opened:
            if not peer.closed:
                peer.close()


@pytest.fixture
def connect(matrix: Matrix) -> Iterator[Connector]:
    connector = Connector(matrix)
    yield connector
    connector.close_all()


# -- MCAST / publish ------------------------------------------------------------------------------


@pytest.mark.parametrize(("pub", "sub"), PAIRS, ids=PAIR_IDS)
def test_publish_reaches_subscriber_with_exact_bytes(
    connect: Connector, pub: str, sub: str
) -> None:
    topic = unique("t")
    publisher, subscriber = connect(pub), connect(sub)
    subscriber.subscribe(topic)
    for data in PAYLOADS:
        publisher.publish(topic, data)
        assert subscriber.next_event() == Event(publisher.identity, "mcast", topic, data), data
    assert subscriber.sync() == []


@pytest.mark.parametrize(("pub", "sub"), PAIRS, ids=PAIR_IDS)
def test_publish_never_echoes_to_the_sender(connect: Connector, pub: str, sub: str) -> None:
    topic = unique("t")
    publisher, subscriber = connect(pub), connect(sub)
    publisher.subscribe(topic)
    subscriber.subscribe(topic)
    publisher.publish(topic, b"not for me")
    assert subscriber.next_event() == Event(publisher.identity, "mcast", topic, b"not for me")
    assert publisher.sync() == []


VARIANT_PAIRS = [(v, p) for v in VARIANTS for p in PEERS] + [
    (p, v) for v in VARIANTS for p in PEERS
]


@pytest.mark.parametrize(("src", "dst"), VARIANT_PAIRS, ids=[f"{a}->{b}" for a, b in VARIANT_PAIRS])
def test_variants_carry_every_kind_of_delivery(connect: Connector, src: str, dst: str) -> None:
    """The STMP adapters with msgpack payloads (data as msgpack bin), and over WebSocket in
    binary frames, send and receive presence, MCAST, UCAST and BCAST with any protocol."""
    topic = unique("v")
    sender, receiver = connect(src), connect(dst)
    receiver.subscribe(topic, presence=True)
    sender.subscribe(topic)
    assert receiver.next_event() == Event(sender.identity, "subscribe", topic)
    for data in PAYLOADS:
        sender.publish(topic, data)
        assert receiver.next_event() == Event(sender.identity, "mcast", topic, data), data
    sender.unicast(receiver.identity, b"\x00\xff|u")
    assert receiver.next_event() == Event(sender.identity, "ucast", None, b"\x00\xff|u")
    sender.broadcast(b"b|\n\x00")
    assert receiver.next_event() == Event(sender.identity, "bcast", None, b"b|\n\x00")
    sender.unsubscribe(topic)
    assert receiver.next_event() == Event(sender.identity, "unsubscribe", topic)
    assert receiver.sync() == []
    assert sender.sync() == []


# -- UCAST / unicast ------------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=PAIR_IDS)
def test_unicast_reaches_the_target(connect: Connector, src: str, dst: str) -> None:
    sender, target = connect(src), connect(dst)
    for data in PAYLOADS:
        sender.unicast(target.identity, data)
        assert target.next_event() == Event(sender.identity, "ucast", None, data), data
    assert target.sync() == []
    assert sender.sync() == []


# -- BCAST / broadcast ----------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=PAIR_IDS)
def test_broadcast_reaches_each_peer_sharing_a_topic_once(
    connect: Connector, src: str, dst: str
) -> None:
    first, second, elsewhere = unique("b1"), unique("b2"), unique("b3")
    sender = connect(src)
    both = connect(dst)  # shares two topics with the sender: one copy
    one = connect(dst)  # shares one
    outsider = connect(dst)  # shares none
    for topic in (first, second):
        sender.subscribe(topic)
        both.subscribe(topic)
    one.subscribe(second)
    outsider.subscribe(elsewhere)
    data = b"\x00bcast\n|\xff"
    sender.broadcast(data)
    expected = Event(sender.identity, "bcast", None, data)
    assert both.next_event() == expected
    assert both.sync() == []  # not a second copy
    assert one.next_event() == expected
    assert one.sync() == []
    assert outsider.sync() == []
    assert sender.sync() == []  # no echo


# -- presence -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("watch", "member"), PAIRS, ids=PAIR_IDS)
def test_presence_watcher_sees_members_of_other_protocols(
    connect: Connector, watch: str, member: str
) -> None:
    topic = unique("p")
    early = connect(member)
    early.subscribe(topic)
    watcher = connect(watch)
    watcher.subscribe(topic, presence=True)
    assert watcher.next_event() == Event(early.identity, "subscribe", topic)  # the snapshot
    late = connect(member)
    late.subscribe(topic)
    assert watcher.next_event() == Event(late.identity, "subscribe", topic)
    early.unsubscribe(topic)
    assert watcher.next_event() == Event(early.identity, "unsubscribe", topic)
    late.close()  # the connection drops
    assert watcher.next_event() == Event(late.identity, "unsubscribe", topic)
    assert watcher.sync() == []


@pytest.mark.parametrize("watch", list(ALL))
def test_presence_snapshot_lists_members_of_every_protocol_in_order(
    connect: Connector, watch: str
) -> None:
    topic = unique("m")
    members = [connect(name) for name in ALL for _ in range(2)]
    for index, member in enumerate(members):
        member.subscribe(topic, presence=index % 2 == 1)
    watcher = connect(watch)
    watcher.subscribe(topic, presence=True)
    expected = [Event(m.identity, "subscribe", topic) for m in members]
    assert watcher.events(len(members)) == expected
    assert watcher.sync() == []


@pytest.mark.parametrize(("watch", "member"), PAIRS, ids=PAIR_IDS)
def test_presence_events_and_messages_keep_their_order(
    connect: Connector, watch: str, member: str
) -> None:
    """A member's SUBSCRIBE event comes before its first message, and a message it sent just
    before its connection dropped still arrives, before its UNSUBSCRIBE event."""
    topic = unique("q")
    watcher = connect(watch)
    watcher.subscribe(topic, presence=True)
    joiner = connect(member)
    joiner.subscribe(topic)
    joiner.publish(topic, b"first words")
    joiner.publish_and_close(topic, b"last words")  # no waiting for the answer
    assert watcher.events(4) == [
        Event(joiner.identity, "subscribe", topic),
        Event(joiner.identity, "mcast", topic, b"first words"),
        Event(joiner.identity, "mcast", topic, b"last words"),
        Event(joiner.identity, "unsubscribe", topic),
    ]
    assert watcher.sync() == []


# -- one identity table ---------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=PAIR_IDS)
def test_login_with_the_same_identity_kicks_the_other_connection(
    connect: Connector, old: str, new: str
) -> None:
    identity, topic = unique("who"), unique("k")
    first = connect(old, identity)
    first.subscribe(topic)
    watcher = connect(new)
    watcher.subscribe(topic, presence=True)
    assert watcher.next_event() == Event(identity, "subscribe", topic)
    second = connect(new, identity)
    first.wait_closed()
    assert watcher.next_event() == Event(identity, "unsubscribe", topic)  # the kick is a close
    third = connect(old)
    third.unicast(identity, b"to the new holder")
    assert second.next_event() == Event(third.identity, "ucast", None, b"to the new holder")
    assert watcher.sync() == []


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=PAIR_IDS)
def test_anonymous_peers_coexist_across_protocols(
    connect: Connector, first: str, second: str
) -> None:
    """``.`` is never registered: anonymous logins on two protocols do not kick each other,
    both may publish (subscribers see the sender ``.``), neither is a unicast target."""
    topic = unique("a")
    subscriber = connect(second)
    subscriber.subscribe(topic)
    one = connect(first, ".")
    other = connect(second, ".")
    one.publish(topic, b"from one")
    other.publish(topic, b"from other")
    one.publish(topic, b"one still here")
    assert subscriber.events(3) == [
        Event(".", "mcast", topic, b"from one"),
        Event(".", "mcast", topic, b"from other"),
        Event(".", "mcast", topic, b"one still here"),
    ]
    with pytest.raises(Refused) as refused:
        subscriber.unicast(".", b"to nobody")
    assert refused.value.code == type(subscriber).NOT_FOUND
    assert subscriber.sync() == []


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=PAIR_IDS)
def test_unicast_to_an_identity_whose_connection_dropped_is_refused(
    connect: Connector, src: str, dst: str
) -> None:
    topic = unique("g")
    sender, target = connect(src), connect(dst)
    target.subscribe(topic)
    sender.subscribe(topic, presence=True)
    assert sender.next_event() == Event(target.identity, "subscribe", topic)
    target.close()
    # the broker has handled the drop once the watcher hears of it
    assert sender.next_event() == Event(target.identity, "unsubscribe", topic)
    with pytest.raises(Refused) as refused:
        sender.unicast(target.identity, b"too late")
    assert refused.value.code == type(sender).NOT_FOUND
    assert sender.sync() == []


#: larger than a 16-bit WebSocket length, to every protocol that carries it
HUGE = bytes(range(256)) * 800
HUGE_PAIRS = [
    (a, b)
    for a, ca in PEERS.items()
    for b, cb in ALL.items()
    if ca.carries("s", "t", HUGE) and cb.carries("s", "t", HUGE)
]


@pytest.mark.parametrize(("src", "dst"), HUGE_PAIRS, ids=[f"{a}->{b}" for a, b in HUGE_PAIRS])
def test_large_payload_reaches_every_protocol_that_carries_it(
    connect: Connector, src: str, dst: str
) -> None:
    topic = unique("h")
    sender, receiver = connect(src), connect(dst)
    receiver.subscribe(topic)
    sender.publish(topic, HUGE)
    assert receiver.next_event() == Event(sender.identity, "mcast", topic, HUGE)
    sender.unicast(receiver.identity, HUGE[::-1])
    assert receiver.next_event() == Event(sender.identity, "ucast", None, HUGE[::-1])
    assert receiver.sync() == []


# -- per-recipient skips (docs/architecture.md, "Cross-protocol decisions") -----------------------

SKIP_CASES = [
    (name, data)
    for data in (BIG, b"")
    for name, cls in PEERS.items()
    if cls.carries("sender", "topic", data)
]


@pytest.mark.parametrize(("pub", "data"), SKIP_CASES, ids=[f"{n}-{len(d)}B" for n, d in SKIP_CASES])
def test_payload_a_protocol_cannot_carry_skips_only_its_recipients(
    matrix: Matrix, connect: Connector, pub: str, data: bytes
) -> None:
    """A 5 KiB or empty payload from STMP: SSMP (1..1024 bytes) recipients are skipped and
    counted, by MCAST, UCAST and BCAST alike; every other recipient gets it; the skipped
    connections stay open and get the next message."""
    topic = unique("s")
    publisher = connect(pub)
    publisher.subscribe(topic)
    recipients = [connect(name) for name in PEERS for _ in range(2)]
    for recipient in recipients:
        recipient.subscribe(topic)
    unable = [r for r in recipients if not type(r).carries(publisher.identity, topic, data)]
    assert unable, "the matrix should have a protocol that cannot carry this payload"
    skipped_before = matrix.skipped()
    publisher.publish(topic, data)
    for recipient in recipients:
        publisher.unicast(recipient.identity, data)
    publisher.broadcast(data)
    for recipient in recipients:
        got = recipient.sync()
        if recipient in unable:
            assert got == [], recipient.name
        else:
            assert got == [
                Event(publisher.identity, "mcast", topic, data),
                Event(publisher.identity, "ucast", None, data),
                Event(publisher.identity, "bcast", None, data),
            ], recipient.name
    assert matrix.skipped() - skipped_before == 3 * len(unable)
    publisher.publish(topic, b"after the skip")
    for recipient in recipients:
        assert recipient.next_event() == Event(
            publisher.identity, "mcast", topic, b"after the skip"
        )
    assert publisher.sync() == []


#: what makes a topic one SSMP cannot name: a space, non-ASCII, ``|``, over 64 characters
ODD_SUFFIX = " with spaces/ünïcødé|" + "x" * 64


@pytest.mark.parametrize(
    "pub", [n for n, c in PEERS.items() if c.carries("s", "room" + ODD_SUFFIX, b"x")]
)
def test_topic_that_is_not_an_ssmp_id_reaches_the_protocols_that_can_name_it(
    connect: Connector, pub: str
) -> None:
    prefix = unique("room")
    topic = prefix + ODD_SUFFIX
    names = [n for n, c in PEERS.items() if c.carries("s", topic, b"x")]
    assert set(names) != set(PEERS), "the matrix should have a protocol that cannot name it"
    publisher = connect(pub)
    subscribers = [connect(name) for name in names]
    for subscriber in subscribers:
        subscriber.subscribe(topic)
    # the others subscribe to the topic's first word, which they can name: nothing for them
    others = [connect(name) for name in PEERS if name not in names]
    for other in others:
        other.subscribe(prefix)
    publisher.publish(topic, b"spaced out")
    for subscriber in subscribers:
        assert subscriber.next_event() == Event(publisher.identity, "mcast", topic, b"spaced out")
        assert subscriber.sync() == []
    for other in others:
        assert other.sync() == []


@pytest.mark.parametrize(
    "src", [n for n, c in PEERS.items() if c.carries("carol smith", "t", b"x")]
)
def test_sender_that_is_not_an_ssmp_id_skips_ssmp_recipients(
    matrix: Matrix, connect: Connector, src: str
) -> None:
    """An STMP identity with a space: SSMP cannot name the sender, so its SSMP recipients
    (MCAST, UCAST, presence) are skipped and counted; the rest get everything."""
    topic = unique("n")
    identity = f"carol smith {unique('id')}"
    recipients = [connect(name) for name in PEERS]
    for recipient in recipients:
        recipient.subscribe(topic, presence=True)
    for recipient in recipients:
        recipient.sync()  # past the presence events of one another
    unable = [r for r in recipients if not type(r).carries(identity, topic, b"x")]
    assert unable, "the matrix should have a protocol that cannot name this sender"
    skipped_before = matrix.skipped()
    sender = connect(src, identity)
    sender.subscribe(topic)
    sender.publish(topic, b"from carol")
    for recipient in recipients:
        sender.unicast(recipient.identity, b"to you")
    for recipient in recipients:
        got = recipient.sync()
        if recipient in unable:
            assert got == [], recipient.name
        else:
            assert got == [
                Event(identity, "subscribe", topic),
                Event(identity, "mcast", topic, b"from carol"),
                Event(identity, "ucast", None, b"to you"),
            ], recipient.name
    assert matrix.skipped() - skipped_before == 3 * len(unable)


# -- order ----------------------------------------------------------------------------------------


def _sequence(count: int) -> list[bytes]:
    """Mostly text (SSMP routes consecutive text MCASTs as one run), some binary."""
    return [b"\x00seq %03d\n" % i if i % 7 == 3 else b"seq %03d" % i for i in range(count)]


@pytest.mark.parametrize("pub", list(PEERS))
def test_messages_from_one_sender_arrive_in_order_everywhere(connect: Connector, pub: str) -> None:
    topic = unique("o")
    publisher = connect(pub)
    publisher.subscribe(topic)
    subscribers = [connect(name) for name in ALL]
    for subscriber in subscribers:
        subscriber.subscribe(topic)
    items = _sequence(100)
    publisher.publish_many(topic, items)  # pipelined: 100 requests in one write
    assert publisher.sync() == []  # no echo
    for subscriber in subscribers:
        got = subscriber.events(len(items))
        assert got == [Event(publisher.identity, "mcast", topic, data) for data in items], (
            subscriber.name
        )
        assert subscriber.sync() == []
