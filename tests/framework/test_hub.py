"""The hub on its own: pure routing, fake peers that record what they are sent."""

from __future__ import annotations

import pytest
from attrs import define, field

from msgbroker.errors import AlreadySubscribed, NoSuchIdentity, NotAllowed, NotSubscribed
from msgbroker.filters import Filter
from msgbroker.hub import Hub
from msgbroker.message import ANONYMOUS, Kind, Message, MessageRun


def encode_a(message: Message) -> bytes | None:
    return b"A:%s:%s:%s:%s" % (
        message.kind.value.encode(),
        message.sender.encode(),
        (message.topic or "").encode(),
        message.payload,
    )


def encode_b(message: Message) -> bytes | None:
    """Protocol B cannot carry payloads over 4 bytes (like SSMP and 1024)."""
    if len(message.payload) > 4:
        return None
    return b"B:" + message.payload


@define(eq=False)
class FakePeer:
    identity: str | None = None
    protocol: str = "a"
    encode: object = encode_a
    subscriptions: dict = field(factory=dict)
    sent: list = field(factory=list)
    kicked: list = field(factory=list)

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)

    def kick(self, reason: str) -> None:
        self.kicked.append(reason)


@define(eq=False)
class DroppingPeer(FakePeer):
    """A slow consumer whose policy drops: it counts the drop instead of sending."""

    drop: object = None

    def send(self, frame: bytes) -> None:
        self.drop()


def peer(hub: Hub, identity: str, encode=encode_a, protocol="a") -> FakePeer:
    p = FakePeer(protocol=protocol, encode=encode)
    hub.login(p, identity)
    return p


def mcast(sender: str, topic: str, payload: bytes = b"x") -> Message:
    return Message(Kind.MCAST, sender, "a", topic, payload)


def test_login_registers_identity_and_new_login_kicks_old_holder():
    hub = Hub()
    old = peer(hub, "alice")
    hub.subscribe(old, "t")
    watcher = peer(hub, "w")
    hub.subscribe(watcher, "t", presence=True)
    new = peer(hub, "alice", encode=encode_b, protocol="b")
    assert hub.lookup("alice") is new
    assert old.kicked == ["identity logged in elsewhere"]
    assert old.subscriptions == {}
    assert watcher.sent[-1] == b"A:unsubscribe:alice:t:"
    assert hub.stats.kicked == 1


def test_anonymous_is_never_registered_and_may_coexist():
    hub = Hub()
    a1, a2 = peer(hub, ANONYMOUS), peer(hub, ANONYMOUS)
    assert hub.lookup(ANONYMOUS) is None
    assert not a1.kicked and not a2.kicked
    with pytest.raises(NotAllowed):
        hub.subscribe(a1, "t")
    with pytest.raises(NotAllowed):
        hub.unsubscribe(a1, "t")
    with pytest.raises(NotAllowed):
        hub.broadcast(a1, Message(Kind.BCAST, ".", "a", None, b"x"))
    with pytest.raises(NoSuchIdentity):
        hub.unicast(Message(Kind.UCAST, "x", "a", ANONYMOUS, b"x"))


def test_second_login_on_one_peer_is_refused():
    hub = Hub()
    p = peer(hub, "alice")
    with pytest.raises(NotAllowed):
        hub.login(p, "bob")


def test_multicast_reaches_subscribers_but_never_the_sender():
    hub = Hub()
    a, b, c = peer(hub, "a"), peer(hub, "b"), peer(hub, "c")
    for p in (a, b):
        hub.subscribe(p, "t")
    assert hub.multicast(a, mcast("a", "t")) == 1
    assert a.sent == []
    assert b.sent == [b"A:mcast:a:t:x"]
    assert c.sent == []


def test_multicast_to_topic_without_subscribers_is_not_an_error():
    hub = Hub()
    a = peer(hub, "a")
    assert hub.multicast(a, mcast("a", "nobody")) == 0


def test_exact_topics_only():
    hub = Hub()
    a, b = peer(hub, "a"), peer(hub, "b")
    hub.subscribe(b, "t/1")
    hub.multicast(a, mcast("a", "t"))
    hub.multicast(a, mcast("a", "t/12"))
    assert b.sent == []


def test_duplicate_subscribe_and_unknown_unsubscribe_are_refused():
    hub = Hub()
    a = peer(hub, "a")
    hub.subscribe(a, "t")
    with pytest.raises(AlreadySubscribed):
        hub.subscribe(a, "t")
    hub.unsubscribe(a, "t")
    with pytest.raises(NotSubscribed):
        hub.unsubscribe(a, "t")
    assert hub.topics == {}


def test_unicast_including_to_oneself():
    hub = Hub()
    a, b = peer(hub, "a"), peer(hub, "b")
    assert hub.unicast(Message(Kind.UCAST, "a", "a", "b", b"hi")) == 1
    assert b.sent == [b"A:ucast:a:b:hi"]
    hub.unicast(Message(Kind.UCAST, "a", "a", "a", b"me"))
    assert a.sent == [b"A:ucast:a:a:me"]
    with pytest.raises(NoSuchIdentity):
        hub.unicast(Message(Kind.UCAST, "a", "a", "zed", b"x"))


def test_broadcast_is_deduplicated_across_shared_topics():
    hub = Hub()
    s, x, y, z = peer(hub, "s"), peer(hub, "x"), peer(hub, "y"), peer(hub, "z")
    for t in ("t1", "t2"):
        hub.subscribe(s, t)
        hub.subscribe(x, t)
    hub.subscribe(y, "t2")
    hub.subscribe(z, "other")
    n = hub.broadcast(s, Message(Kind.BCAST, "s", "a", None, b"hey"))
    assert n == 2
    assert x.sent == [b"A:bcast:s::hey"]
    assert y.sent == [b"A:bcast:s::hey"]
    assert z.sent == [] and s.sent == []


def test_presence_snapshot_then_join_and_leave_events_in_order():
    hub = Hub()
    m1, m2 = peer(hub, "m1"), peer(hub, "m2")
    hub.subscribe(m1, "t", presence=True)
    hub.subscribe(m2, "t")
    w = peer(hub, "w")
    snapshot = hub.subscribe(w, "t", presence=True)
    assert [(m.kind, m.sender, m.presence) for m in snapshot] == [
        (Kind.SUBSCRIBE, "m1", True),
        (Kind.SUBSCRIBE, "m2", False),
    ]
    # m1 watches presence: it saw m2 join, then w join (with the PRESENCE flag)
    assert m1.sent == [b"A:subscribe:m2:t:", b"A:subscribe:w:t:"]
    assert m2.sent == []  # not a watcher
    hub.unsubscribe(m2, "t")
    hub.close(m1)
    assert w.sent == [b"A:unsubscribe:m2:t:", b"A:unsubscribe:m1:t:"]


def test_close_leaves_every_topic_and_frees_identity():
    hub = Hub()
    a, w = peer(hub, "a"), peer(hub, "w")
    hub.subscribe(w, "t1", presence=True)
    hub.subscribe(w, "t2", presence=True)
    hub.subscribe(a, "t1")
    hub.subscribe(a, "t2")
    w.sent.clear()
    hub.close(a)
    assert sorted(w.sent) == [b"A:unsubscribe:a:t1:", b"A:unsubscribe:a:t2:"]
    assert hub.lookup("a") is None
    hub.close(a)  # idempotent
    assert len(w.sent) == 2


def test_message_encoded_once_per_protocol_per_fan_out():
    calls = []

    def counting(message: Message) -> bytes:
        calls.append(message)
        return b"frame"

    hub = Hub()
    sender = peer(hub, "s")
    receivers = [peer(hub, f"r{i}", encode=counting) for i in range(50)]
    for r in receivers:
        hub.subscribe(r, "t")
    hub.multicast(sender, mcast("s", "t"))
    assert len(calls) == 1
    assert all(r.sent == [b"frame"] for r in receivers)


def test_recipient_whose_protocol_cannot_carry_is_skipped_and_counted():
    hub = Hub()
    skips = []
    hub.on_skip = lambda p, m: skips.append(p.identity)
    s = peer(hub, "s")
    a = peer(hub, "a")
    b = peer(hub, "b", encode=encode_b, protocol="b")
    for p in (a, b):
        hub.subscribe(p, "t")
    assert hub.multicast(s, mcast("s", "t", b"too long")) == 1
    assert a.sent == [b"A:mcast:s:t:too long"]
    assert b.sent == []
    assert skips == ["b"]
    assert hub.stats.skipped == 1
    assert hub.multicast(s, mcast("s", "t", b"ok")) == 2
    assert b.sent == [b"B:ok"]


def test_observer_sees_per_protocol_counts_skips_and_drops():
    hub = Hub()
    seen = []
    hub.observer = lambda m, r: seen.append((m.payload, dict(r.recipients), r.skipped, r.dropped))
    s = peer(hub, "s")
    a = peer(hub, "a")
    b = peer(hub, "b", encode=encode_b, protocol="b")

    c = DroppingPeer(encode=encode_a)
    c.drop = lambda: setattr(hub.stats, "dropped", hub.stats.dropped + 1)
    hub.login(c, "c")
    for p in (a, b, c):
        hub.subscribe(p, "t")
    hub.multicast(s, mcast("s", "t", b"12345"))
    assert seen == [(b"12345", {"a": 2}, 1, 1)]
    hub.multicast(s, mcast("s", "nobody"))
    assert seen[-1] == (b"x", {}, 0, 0)


def run_of(sender: str, topic: str, payloads: list[bytes]) -> MessageRun:
    return MessageRun(
        Kind.MCAST,
        sender,
        "a",
        topic,
        len(payloads),
        lambda: payloads,
    )


def test_multicast_run_sends_one_frame_per_recipient_with_every_message():
    hub = Hub()
    s, a = peer(hub, "s"), peer(hub, "a")
    b = peer(hub, "b", encode=encode_b, protocol="b")
    for p in (s, a, b):
        hub.subscribe(p, "t")
    assert hub.multicast_run(s, run_of("s", "t", [b"1", b"22", b"too long"])) == 5
    assert a.sent == [b"A:mcast:s:t:1A:mcast:s:t:22A:mcast:s:t:too long"]
    assert b.sent == [b"B:1B:22"]  # protocol b cannot carry the third: skipped
    assert s.sent == []
    assert hub.stats.skipped == 1
    assert hub.stats.routed == 3
    assert hub.stats.delivered == 5


def test_multicast_run_uses_a_preencoded_frame():
    hub = Hub()
    s, a = peer(hub, "s"), peer(hub, "a")
    hub.subscribe(a, "t")
    run = run_of("s", "t", [b"1", b"2"])
    run.preencode(encode_a, b"<both>")
    hub.multicast_run(s, run)
    assert a.sent == [b"<both>"]


def test_multicast_run_with_observer_routes_message_by_message():
    hub = Hub()
    seen = []
    hub.observer = lambda m, r: seen.append((m.payload, dict(r.recipients)))
    s, a = peer(hub, "s"), peer(hub, "a")
    hub.subscribe(a, "t")
    assert hub.multicast_run(s, run_of("s", "t", [b"1", b"2"])) == 2
    assert seen == [(b"1", {"a": 1}), (b"2", {"a": 1})]
    assert a.sent == [b"A:mcast:s:t:1", b"A:mcast:s:t:2"]


def test_multicast_run_uses_an_encoders_run_encoding():
    """An encoder with ``encode_run`` encodes the run in one call, never per message."""
    hub = Hub()
    calls = []

    def encode_c(message):
        raise AssertionError("the run encoding should have been used")

    def encode_run(run):
        calls.append(list(run.payloads()))
        return b"C:" + b"+".join(run.payloads()), run.count

    encode_c.encode_run = encode_run
    s, c = peer(hub, "s"), peer(hub, "c", encode=encode_c, protocol="c")
    hub.subscribe(c, "t")
    assert hub.multicast_run(s, run_of("s", "t", [b"1", b"2", b"3"])) == 3
    assert c.sent == [b"C:1+2+3"]
    assert calls == [[b"1", b"2", b"3"]]
    assert hub.stats.delivered == 3


def test_watch_turns_presence_on_for_a_member_and_returns_the_snapshot():
    hub = Hub()
    a, b, c = peer(hub, "a"), peer(hub, "b"), peer(hub, "c")
    hub.subscribe(a, "t", presence=True)
    hub.subscribe(b, "t")
    snapshot = hub.watch(b, "t")
    assert [(m.kind, m.sender, m.presence) for m in snapshot] == [(Kind.SUBSCRIBE, "a", True)]
    assert hub.watch(b, "t") == []  # watching already
    a.sent.clear()
    hub.subscribe(c, "t")
    assert b.sent == [b"A:subscribe:c:t:"] == a.sent
    with pytest.raises(NotSubscribed):
        hub.watch(c, "other")


# -- filtered subscriptions ---------------------------------------------------------------------


def props_mcast(payload: bytes, **properties) -> Message:
    return Message(Kind.MCAST, "s", "a", "t", payload, properties=properties)


def test_a_filtered_subscriber_gets_only_the_mcasts_that_match_its_filters():
    hub = Hub()
    s, plain, big = peer(hub, "s"), peer(hub, "plain"), peer(hub, "big")
    other = peer(hub, "other", encode=encode_b, protocol="b")
    hub.subscribe(plain, "t")
    hub.subscribe(big, "t", filters=[Filter("n", ">", 10)])
    hub.subscribe(other, "t", filters=[Filter("n", ">", 10), Filter("tag", "=", "x")])
    assert hub.multicast(s, props_mcast(b"1", n=5)) == 1
    assert hub.multicast(s, props_mcast(b"2", n=50)) == 2
    assert hub.multicast(s, props_mcast(b"3", n=50, tag="x")) == 3
    assert hub.multicast(s, props_mcast(b"4")) == 1  # no properties: no filter matches
    assert plain.sent == [b"A:mcast:s:t:%d" % i for i in (1, 2, 3, 4)]
    assert big.sent == [b"A:mcast:s:t:2", b"A:mcast:s:t:3"]
    assert other.sent == [b"B:3"]
    assert hub.topics["t"].by_encoder == {encode_a: {plain: None}}  # groups left intact


def test_a_filtered_sender_never_gets_its_own_mcast():
    hub = Hub()
    s = peer(hub, "s")
    hub.subscribe(s, "t", filters=[Filter("n", "=", 1)])
    assert hub.multicast(s, props_mcast(b"x", n=1)) == 0
    assert s.sent == []


def test_runs_to_a_topic_with_filtered_subscribers_are_filtered_message_by_message():
    hub = Hub()
    s, f = peer(hub, "s"), peer(hub, "f")
    hub.subscribe(f, "t", filters=[Filter("n", "=", 1)])
    assert hub.multicast_run(s, run_of("s", "t", [b"1", b"2"])) == 0  # runs carry none
    assert f.sent == []


def test_filtered_members_leave_share_topics_for_broadcast_and_see_presence():
    hub = Hub()
    s, f, w = peer(hub, "s"), peer(hub, "f"), peer(hub, "w")
    hub.subscribe(w, "t", presence=True)
    hub.subscribe(s, "t")
    hub.subscribe(f, "t", filters=[Filter("n", "=", 1)])
    assert w.sent[-1] == b"A:subscribe:f:t:"  # presence ignores filters
    assert hub.broadcast(s, Message(Kind.BCAST, "s", "a", None, b"b")) == 2  # w and f
    assert f.sent == [b"A:bcast:s::b"]
    hub.unsubscribe(f, "t")
    assert not hub.topics["t"].filtered
    assert w.sent[-1] == b"A:unsubscribe:f:t:"
    assert hub.multicast(s, props_mcast(b"x", n=1)) == 1  # only w now
    hub.close(s)
    hub.close(w)
    assert "t" not in hub.topics
