"""sbus in the protocol matrix: sbus ↔ SSMP, STMP (TCP), STMP over WebSocket and
Micromessage2, both ways, over real sockets with the independent adapters
(tests/interop/peers.py, mm2_peer.py, sbus_peer.py) and one broker for the module.

What sbus has is tested against every other protocol (docs/architecture.md, "Cross-protocol
decisions", and docs/sbus.md, "Decisions"): MCAST with exact bytes; sbus patterns over what
the others publish; the name the others show for an sbus publisher; keys that are not UTF-8;
payloads SSMP cannot carry; echo (sbus only); secret ``!/cred/`` keys; order. What it has
not (login, presence, unicast, broadcast) is left out: see sbus_peer.py.

Absence is proven with sync markers, never by waiting for a silence: every peer's
``sync()`` round-trips a marker through the broker, which handles one connection's input in
order, so whatever it routed to that peer earlier arrives first.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest
from attrs import evolve

from msgbroker.plugins.stmp import payloads as stmp_payloads
from msgbroker.plugins.stmp.codec import Encoding, Request, Status
from tests.interop.mm2_peer import UNKNOWN as MM2_UNKNOWN
from tests.interop.mm2_peer import MM2Peer
from tests.interop.peers import PEERS, WAIT, Closed, Event, Peer, Refused, SSMPPeer, STMPPeer
from tests.interop.sbus_peer import UNKNOWN, SbusPeer, key_of
from tests.interop.test_matrix import BIG, PAYLOADS, unique
from tests.ssmp.e2e_support import RunningBroker, running_broker

OTHERS: dict[str, type[Peer]] = {**PEERS, MM2Peer.name: MM2Peer}
ALL: dict[str, type[Peer]] = {**OTHERS, SbusPeer.name: SbusPeer}
#: every pair with sbus on at least one side
PAIRS = [(a, b) for a in ALL for b in ALL if "sbus" in (a, b)]
PAIR_IDS = [f"{a}->{b}" for a, b in PAIRS]
#: the protocols whose subscribers are told who sent an MCAST
NAMING = list(PEERS)
#: what the matrix payloads lack: an empty payload (sbus, STMP and MM2 carry it)
EXACT = [*PAYLOADS, b""]

Connect = Callable[..., Peer]


class Broker:
    def __init__(self, running: RunningBroker, addresses: dict[str, str]) -> None:
        self.running = running
        self.addresses = addresses

    def skipped(self) -> int:
        """The hub's count of skipped recipients (read in the reactor thread)."""
        hub = self.running.service.broker.hub
        return int(self.running.call(lambda: hub.stats.skipped))


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    folder = tempfile.mkdtemp(prefix="sb", dir="/tmp")  # AF_UNIX paths are short
    listeners = tuple(f"{cls.listener}={cls.endpoint}" for cls in OTHERS.values())
    try:
        # the first listener is TCP (running_broker reads its address)
        with running_broker((*listeners, f"sbus=unix:{folder}/bus"), auth=("open",)) as running:
            addresses = {
                listener.protocol: address for listener, address in running.service.broker.listening
            }
            assert set(addresses) == {cls.listener for cls in ALL.values()}
            yield Broker(running, addresses)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def connect(broker: Broker) -> Iterator[Connect]:
    opened: list[Peer] = []

    def open_peer(name: str, identity: str | None = None) -> Peer:
        cls = ALL[name]
        peer = cls(broker.addresses[cls.listener])
        opened.append(peer)
        if cls is not SbusPeer:  # sbus has no login: the broker names the connection
            peer.login(identity or unique(name))
        return peer

    yield open_peer
    for peer in opened:
        if not peer.closed:
            peer.close()


def seen(receiver: Peer, event: Event) -> Event:
    """``event`` as ``receiver``'s protocol shows it: Micromessage2 and sbus name no MCAST
    sender."""
    if isinstance(receiver, MM2Peer) and event.kind == "mcast":
        return evolve(event, sender=MM2_UNKNOWN)
    if isinstance(receiver, SbusPeer) and event.kind == "mcast":
        return evolve(event, sender=UNKNOWN)
    return event


def our_sbus_identity() -> str:
    """What the broker calls an sbus connection of this process (SO_PEERCRED)."""
    return f"sbus:{os.geteuid()}:{os.getpid()}"


# -- MCAST with exact bytes -----------------------------------------------------------------------


@pytest.mark.parametrize(("pub", "sub"), PAIRS, ids=PAIR_IDS)
def test_publish_reaches_subscriber_with_exact_bytes(connect: Connect, pub: str, sub: str) -> None:
    topic = unique("t")
    publisher, subscriber = connect(pub), connect(sub)
    subscriber.subscribe(topic)
    sent = 0
    for data in EXACT:
        if not all(
            type(p).carries(publisher.identity, topic, data) for p in (publisher, subscriber)
        ):
            continue
        publisher.publish(topic, data)
        sent += 1
        expected = seen(subscriber, Event(publisher.identity, "mcast", topic, data))
        assert subscriber.next_event() == expected, data
    assert sent >= len(PAYLOADS)  # binary with NUL/LF/0xFF and UTF-8 among them
    assert subscriber.sync() == []


# -- sbus patterns over what every protocol publishes ---------------------------------------------


@pytest.mark.parametrize("pub", list(ALL))
def test_sbus_patterns_receive_matching_topics_only(connect: Connect, pub: str) -> None:
    """``*`` up to the next ``/``, a trailing ``/`` (that ``/`` and anything after) and the
    empty pattern (everything) select among topics another protocol publishes on."""
    prefix = unique("pat")
    patterns = {"star": "*", "mid": f"{prefix}/*/c", "trailing": f"{prefix}/b/", "empty": ""}
    subscribers = {name: connect("sbus") for name in patterns}
    for name, pattern in patterns.items():
        subscribers[name].subscribe(pattern)
    publisher = connect(pub)
    matching = {
        prefix: {"star", "empty"},
        f"{prefix}/b/c": {"mid", "trailing", "empty"},
        f"{prefix}/b/c/d": {"trailing", "empty"},
        f"{prefix}/xyz/c": {"mid", "empty"},
        f"{prefix}//c": {"mid", "empty"},
        f"{prefix}/b/": {"trailing", "empty"},
        f"{prefix}/b": {"empty"},
        f"{prefix}/c": {"empty"},
        f"{prefix}/b/cd": {"trailing", "empty"},
        f"{prefix}x/b/c": {"empty"},
    }
    for topic in matching:
        publisher.publish(topic, b"on " + topic.encode())
    for name, subscriber in subscribers.items():
        expected = [
            Event(UNKNOWN, "mcast", topic, b"on " + topic.encode())
            for topic, names in matching.items()
            if name in names
        ]
        assert subscriber.sync() == expected, name


# -- the name of an sbus publisher ----------------------------------------------------------------


@pytest.mark.parametrize("sub", NAMING)
def test_sbus_publisher_is_known_by_uid_and_pid(connect: Connect, sub: str) -> None:
    topic = unique("who")
    subscriber = connect(sub)
    subscriber.subscribe(topic)
    publisher = connect("sbus")
    assert isinstance(publisher, SbusPeer)
    assert publisher.credentials == b"!/cred/%d/%d/%d" % (os.getegid(), os.geteuid(), os.getpid())
    publisher.publish(topic, b"who am i")
    assert subscriber.next_event() == Event(our_sbus_identity(), "mcast", topic, b"who am i")
    assert subscriber.sync() == []


# -- keys that are not UTF-8 ----------------------------------------------------------------------


def test_key_that_is_not_utf8_round_trips_sbus_to_sbus_and_no_other_protocol_can_name_it(
    connect: Connect,
) -> None:
    """``prefix/\\xff\\xfe\\x80odd`` maps to a topic with lone surrogates: sbus subscribers
    (exact and by pattern) get the very key back; SSMP (ids are ASCII) and Micromessage2
    (printable ASCII destinations) cannot name it, so they cannot subscribe to it, and
    their subscriptions to neighbouring names get nothing."""
    prefix = unique("odd")
    key = prefix.encode() + b"/\xff\xfe\x80odd"
    topic = key.decode("utf-8", "surrogateescape")
    assert not SSMPPeer.carries("s", topic, b"x")
    assert not MM2Peer.carries("s", topic, b"x")
    exact, by_pattern = connect("sbus"), connect("sbus")
    exact.subscribe(key)
    by_pattern.subscribe(prefix.encode() + b"/*")
    neighbours = [connect("ssmp"), connect("mm2")]
    for neighbour in neighbours:
        neighbour.subscribe(prefix)
        neighbour.subscribe(f"{prefix}/odd")
    publisher = connect("sbus")
    publisher.publish(key, b"\x00\xffnot utf-8 either\n")
    for subscriber in (exact, by_pattern):
        event = subscriber.next_event()
        assert event == Event(UNKNOWN, "mcast", topic, b"\x00\xffnot utf-8 either\n")
        assert key_of(event.topic or "") == key
        assert subscriber.sync() == []
    for neighbour in neighbours:
        assert neighbour.sync() == []


def subscribe_escaped(peer: STMPPeer, topic: str) -> None:
    """Subscribe an STMP JSON peer to ``topic`` written with ``\\uXXXX`` escapes: the one
    way STMP can name a topic with lone surrogates (UTF-8 cannot encode them; msgpack str
    must be UTF-8)."""
    token = next(peer._ids)
    payload = json.dumps({"topic": topic}, ensure_ascii=True).encode("ascii")
    peer._write(peer._frames(Request(token, stmp_payloads.SUBSCRIBE, Encoding.JSON, payload)))
    deadline = time.monotonic() + WAIT
    while token not in peer._replies:
        peer._read(deadline, "the answer to subscribe")
    status = peer._replies.pop(token)
    if status != Status.OK:
        raise Refused(status, "subscribe")


def test_key_that_is_not_utf8_skips_stmp_subscribers_whose_codec_cannot_carry_it(
    broker: Broker, connect: Connect
) -> None:
    """STMP JSON subscribers can name the topic (``\\udcff`` escapes), but STMP deliveries are
    UTF-8 JSON, which cannot carry a lone surrogate (``encode_payload`` refuses it): they are
    skipped and counted (docs/sbus.md, Decisions), the publisher and the other recipients
    unaffected."""
    prefix = unique("odd")
    key = prefix.encode() + b"/\xff"
    topic = key.decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match="cannot encode as JSON"):
        stmp_payloads.encode_payload({"topic": topic}, Encoding.JSON)
    stmps = [connect("stmp"), connect("stmp-ws")]
    for peer in stmps:
        assert isinstance(peer, STMPPeer)
        subscribe_escaped(peer, topic)
        peer.subscribe(prefix)
    witness = connect("sbus")
    witness.subscribe(key)
    publisher = connect("sbus")
    skipped_before = broker.skipped()
    publisher.publish(key, b"odd")  # the publisher's barrier comes back: still connected
    assert witness.next_event() == Event(UNKNOWN, "mcast", topic, b"odd")
    for peer in stmps:
        assert peer.sync() == []
    assert broker.skipped() - skipped_before == len(stmps)
    publisher.publish(prefix, b"after the skip")
    for peer in stmps:
        assert peer.next_event() == Event(our_sbus_identity(), "mcast", prefix, b"after the skip")


# -- what SSMP cannot carry ------------------------------------------------------------------------


def test_payload_over_1024_bytes_from_sbus_skips_only_ssmp(
    broker: Broker, connect: Connect
) -> None:
    topic = unique("big")
    recipients = [connect(name) for name in ALL]
    for recipient in recipients:
        recipient.subscribe(topic)
    publisher = connect("sbus")
    assert not SSMPPeer.carries(publisher.identity, topic, BIG)
    skipped_before = broker.skipped()
    publisher.publish(topic, BIG)
    for recipient in recipients:
        expected = (
            []
            if isinstance(recipient, SSMPPeer)
            else [Event(publisher.identity, "mcast", topic, BIG)]
        )
        assert recipient.sync() == [seen(recipient, e) for e in expected], recipient.name
    assert broker.skipped() - skipped_before == 1
    publisher.publish(topic, b"after the skip")
    for recipient in recipients:
        expected_event = Event(publisher.identity, "mcast", topic, b"after the skip")
        assert recipient.next_event() == seen(recipient, expected_event), recipient.name


# -- echo ------------------------------------------------------------------------------------------


def test_subscribed_sbus_publisher_receives_its_own_message_once(connect: Connect) -> None:
    prefix = unique("echo")
    topic = f"{prefix}/me"
    publisher, other = connect("sbus"), connect("sbus")
    for pattern in (topic, topic, f"{prefix}/*", ""):  # four matching subscriptions
        publisher.subscribe(pattern)
    other.subscribe(topic)
    publisher.publish(topic, b"to myself too")
    expected = Event(UNKNOWN, "mcast", topic, b"to myself too")
    assert publisher.sync() == [expected]
    assert other.sync() == [expected]


def test_sbus_publisher_after_echo_off_does_not_receive_its_own_message(connect: Connect) -> None:
    topic = unique("quiet")
    publisher, other, ssmp = connect("sbus"), connect("sbus"), connect("ssmp")
    assert isinstance(publisher, SbusPeer)
    for subscriber in (publisher, other, ssmp):
        subscriber.subscribe(topic)
    publisher.control(b"echo/off")
    publisher.send(b"MSG " + topic.encode() + b"\0not to myself")  # no barrier: echo is off
    publisher.control(b"echo/on")  # handled after the MSG; its barrier needs echo
    assert publisher.sync() == []
    assert other.next_event() == Event(UNKNOWN, "mcast", topic, b"not to myself")
    assert ssmp.next_event() == Event(publisher.identity, "mcast", topic, b"not to myself")
    publisher.publish(topic, b"echo is back")
    assert publisher.sync() == [Event(UNKNOWN, "mcast", topic, b"echo is back")]


@pytest.mark.parametrize("pub", list(OTHERS))
def test_other_protocols_never_echo(connect: Connect, pub: str) -> None:
    topic = unique("noecho")
    publisher, witness = connect(pub), connect("sbus")
    publisher.subscribe(topic)
    witness.subscribe(topic)
    publisher.publish(topic, b"not for me")
    assert witness.next_event() == Event(UNKNOWN, "mcast", topic, b"not for me")
    assert publisher.sync() == []


# -- secret keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pub", [n for n, c in OTHERS.items() if c.carries("s", "!/cred/1/2/3/x", b"x")]
)
def test_secret_key_reaches_only_sbus_subscribers_with_those_credentials(
    connect: Connect, pub: str
) -> None:
    """STMP and Micromessage2 can publish on ``!/cred/<gid>/<uid>/<pid>/x`` (SSMP cannot
    name it: ``!`` is no SSMP id character); an sbus subscriber with those credentials gets
    it (whether it wrote them or left the fields empty), an empty pattern never does."""
    assert not SSMPPeer.carries("s", "!/cred/1/2/3/x", b"x")
    exact, by_empty_fields, everything = connect("sbus"), connect("sbus"), connect("sbus")
    assert isinstance(exact, SbusPeer)
    rest = unique("x")
    key = exact.credentials + b"/" + rest.encode()
    exact.subscribe(key)
    by_empty_fields.subscribe(b"!/cred////" + rest.encode())
    everything.subscribe(b"")
    publisher = connect(pub)
    publisher.publish(key.decode(), b"\x00secret\xff")
    expected = Event(UNKNOWN, "mcast", key.decode(), b"\x00secret\xff")
    assert exact.sync() == [expected]
    assert by_empty_fields.sync() == [expected]
    assert everything.sync() == []


@pytest.mark.parametrize("sub", ["stmp", "stmp-ws"])
def test_stmp_subscription_to_a_secret_topic_is_refused_like_an_anonymous_one(
    connect: Connect, sub: str
) -> None:
    anonymous = connect(sub, ".")
    with pytest.raises(Refused) as anonymous_refused:
        anonymous.subscribe(unique("anon"))
    subscriber = connect(sub)
    secret = f"!/cred/{os.getegid()}/{os.geteuid()}/{os.getpid()}/{unique('x')}"
    with pytest.raises(Refused) as refused:
        subscriber.subscribe(secret)
    assert refused.value.code == anonymous_refused.value.code == Status.FORBIDDEN
    connect("sbus").publish(secret, b"not for STMP")
    assert subscriber.sync() == []  # still connected, and not subscribed


def test_mm2_subscription_to_a_secret_topic_is_an_error_frame_and_a_close(
    connect: Connect,
) -> None:
    subscriber = connect("mm2")
    secret = f"!/cred/{os.getegid()}/{os.geteuid()}/{os.getpid()}/{unique('x')}"
    with pytest.raises(
        Closed, match=r"ERROR frame: not allowed to subscribe to .*: secret topics are for sbus"
    ):
        subscriber.subscribe(secret)
    subscriber.wait_closed()
    assert subscriber.closed


# -- order -----------------------------------------------------------------------------------------


def _sequence(count: int) -> list[bytes]:
    return [b"\x00seq %03d\n" % i if i % 7 == 3 else b"seq %03d" % i for i in range(count)]


@pytest.mark.parametrize("sub", list(ALL))
def test_messages_from_one_sbus_publisher_arrive_in_order(connect: Connect, sub: str) -> None:
    topic = unique("o")
    subscriber = connect(sub)
    subscriber.subscribe(topic)
    publisher = connect("sbus")
    items = _sequence(100)
    publisher.publish_many(topic, items)  # back to back, one barrier
    got = subscriber.events(len(items))
    assert got == [seen(subscriber, Event(publisher.identity, "mcast", topic, d)) for d in items]
    assert subscriber.sync() == []
