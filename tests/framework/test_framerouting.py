"""Hub.multicast_frame(s): MCASTs given as the sender's own frames reach exactly whom, and
count exactly what, Hub.multicast of the same messages does; the Message is built only when
something needs it (msgbroker.framerouting)."""

from __future__ import annotations

import pytest

from msgbroker.errors import NoSuchIdentity
from msgbroker.filters import Filter
from msgbroker.hub import Hub
from msgbroker.message import Kind, Message
from tests.framework.test_hub import encode_a, encode_b, peer

TOPICS = ["t1", "t2", "t1", "t3", "t2"]
PAYLOADS = [b"p0", b"p1", b"p2", b"p3", b"p4"]


def frames(sender: str = "pub") -> list[bytes]:
    return [
        encode_a(Message(Kind.MCAST, sender, "a", topic, payload))  # type: ignore[misc]
        for topic, payload in zip(TOPICS, PAYLOADS, strict=True)
    ]


def plain(hub: Hub, pub, subs) -> None:
    for s, topic in zip(subs, ["t1", "t2", "t1"], strict=True):
        hub.subscribe(s, topic)
    hub.subscribe(pub, "t2")  # the sender itself never gets its MCAST


def other_protocol(hub: Hub, pub, subs) -> None:
    plain(hub, pub, subs)
    hub.subscribe(peer(hub, "b1", encode=encode_b, protocol="b"), "t1")


def filtered(hub: Hub, pub, subs) -> None:
    plain(hub, pub, subs)
    hub.subscribe(peer(hub, "f1"), "t2", filters=[Filter("n", ">", 1)])


def queue_group(hub: Hub, pub, subs) -> None:
    plain(hub, pub, subs)
    hub.subscribe(peer(hub, "q1"), "t3", queue="workers")


def pattern(hub: Hub, pub, subs) -> None:
    plain(hub, pub, subs)
    hub.subscribe_pattern(peer(hub, "pat"), "t*")


def observed(hub: Hub, pub, subs) -> None:
    plain(hub, pub, subs)
    hub.observer = lambda message, result: hub.seen.append((message.topic, result))  # type: ignore[attr-defined]


SETUPS = [plain, other_protocol, filtered, queue_group, pattern, observed]


def build(setup):
    hub = Hub()
    hub.seen = []  # type: ignore[attr-defined]
    pub = peer(hub, "pub")
    subs = [peer(hub, f"s{i}") for i in range(3)]
    setup(hub, pub, subs)
    return hub, pub


def outcome(hub: Hub) -> tuple:
    every = sorted(hub.identities.items())
    sent = {name: list(p.sent) for name, p in every}
    published = {name: topic.published for name, topic in sorted(hub.topics.items())}
    stats = (hub.stats.routed, hub.stats.delivered, hub.stats.skipped)
    return sent, published, stats, hub.seen  # type: ignore[attr-defined]


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.__name__)
def test_multicast_frames_does_what_multicast_of_the_messages_does(setup):
    by_message, pub = build(setup)
    expected = []
    for topic, payload, frame in zip(TOPICS, PAYLOADS, frames(), strict=True):
        message = Message(Kind.MCAST, "pub", "a", topic, payload)
        message.preencode(encode_a, frame)
        expected.append(by_message.multicast(pub, message))

    by_frame, pub = build(setup)
    total = by_frame.multicast_frames(pub, encode_a, TOPICS, frames(), lambda: PAYLOADS)
    assert total == sum(expected)
    assert outcome(by_frame) == outcome(by_message)

    one_by_one, pub = build(setup)
    got = [
        one_by_one.multicast_frame(pub, topic, payload, encode_a, frame)
        for topic, payload, frame in zip(TOPICS, PAYLOADS, frames(), strict=True)
    ]
    assert got == expected
    assert outcome(one_by_one) == outcome(by_message)


def test_no_message_is_built_when_every_member_takes_the_frame():
    hub, pub = build(plain)

    def payloads():
        raise AssertionError("nothing needed the payloads")

    assert hub.multicast_frames(pub, encode_a, TOPICS, frames(), payloads) == 6
    assert hub.identities["s0"].sent == [frames()[0], frames()[2]]


def test_the_payloads_are_built_once_for_the_messages_that_need_them():
    hub, pub = build(other_protocol)
    calls = []

    def payloads():
        calls.append(1)
        return PAYLOADS

    hub.multicast_frames(pub, encode_a, TOPICS, frames(), payloads)
    assert calls == [1]
    assert hub.identities["b1"].sent == [b"B:p0", b"B:p2"]


def unicast_setup(case: str):
    hub = Hub()
    hub.seen = []  # type: ignore[attr-defined]
    pub = peer(hub, "pub")
    if case == "other protocol":
        peer(hub, "dst", encode=encode_b, protocol="b")
    elif case != "absent":
        peer(hub, "dst")
    if case == "observed":
        hub.observer = lambda message, result: hub.seen.append((message.topic, result))  # type: ignore[attr-defined]
    return hub, pub


@pytest.mark.parametrize("payload", [b"hi", b"too long for b"])
@pytest.mark.parametrize("case", ["same protocol", "other protocol", "observed", "absent"])
def test_unicast_frame_does_what_unicast_of_the_message_does(case, payload):
    frame = encode_a(Message(Kind.UCAST, "pub", "a", "dst", payload))
    results = []
    for how in ("message", "frame"):
        hub, pub = unicast_setup(case)
        try:
            if how == "message":
                message = Message(Kind.UCAST, "pub", "a", "dst", payload)
                message.preencode(encode_a, frame)
                got: object = hub.unicast(message)
            else:
                got = hub.unicast_frame(pub, "dst", payload, encode_a, frame)
        except NoSuchIdentity as e:
            got = e
        results.append((repr(got), outcome(hub)))
    assert results[0] == results[1]
    if case == "absent":
        assert "NoSuchIdentity" in results[0][0]
