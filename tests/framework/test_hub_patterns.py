"""The hub's pattern subscriptions (sbus): routed beside exact topics, from every
protocol, once per peer, with echo on request, and secret topics kept for them."""

from __future__ import annotations

import pytest

from msgbroker.errors import NotAllowed
from msgbroker.hub import Hub
from msgbroker.message import Kind, Message, MessageRun
from tests.framework.test_hub import FakePeer, encode_b, mcast, peer


def pattern_peer(hub: Hub, *patterns: str, identity: str = "sbus:1:2") -> FakePeer:
    """Like an sbus session: an identity that is not in the identity table."""
    p = FakePeer(identity=identity, protocol="b", encode=encode_b)
    for pattern in patterns:
        hub.subscribe_pattern(p, pattern)
    return p


def test_a_pattern_subscriber_gets_matching_mcasts_beside_the_topics_members():
    hub = Hub()
    exact = peer(hub, "exact")
    hub.subscribe(exact, "a/b")
    star, trailing, miss = pattern_peer(hub, "a/*"), pattern_peer(hub, "a/"), pattern_peer(hub, "b")
    assert hub.multicast(None, mcast("pub", "a/b", b"m")) == 3
    assert exact.sent == [b"A:mcast:pub:a/b:m"]
    assert star.sent == trailing.sent == [b"B:m"] and miss.sent == []
    assert hub.multicast(None, mcast("pub", "a/c", b"n")) == 2  # nobody subscribes a/c
    assert star.sent[-1] == trailing.sent[-1] == b"B:n"


def test_several_matching_patterns_and_duplicates_deliver_once():
    hub = Hub()
    p = pattern_peer(hub, "a/b", "a/b", "a/*", "")
    assert hub.multicast(None, mcast("pub", "a/b")) == 1
    assert p.sent == [b"B:x"]


def test_the_sender_gets_its_own_message_only_with_echo():
    hub = Hub()
    p = pattern_peer(hub, "t")
    hub.multicast(p, mcast("sbus:1:2", "t", b"1"))
    assert p.sent == []
    hub.multicast(p, mcast("sbus:1:2", "t", b"2"), echo=True)
    assert p.sent == [b"B:2"]


def test_the_source_is_the_publisher_while_its_message_is_routed():
    hub = Hub()
    seen = []

    class Watching(FakePeer):
        def send(self, frame: bytes) -> None:
            seen.append(hub.source)

    hub.subscribe_pattern(Watching(identity="sbus:1:2", encode=encode_b), "t")
    publisher = peer(hub, "pub")
    hub.multicast(publisher, mcast("pub", "t"))
    run = MessageRun(Kind.MCAST, "pub", "a", "t", 1, lambda: [b"r"])
    other = peer(hub, "other")
    hub.multicast_run(other, run)
    assert seen == [publisher, other]


def test_unsubscribe_removes_one_copy_and_close_removes_all():
    hub = Hub()
    p = pattern_peer(hub, "t", "t", "u/*")
    assert hub.unsubscribe_pattern(p, "t")
    hub.multicast(None, mcast("pub", "t"))
    assert p.sent == [b"B:x"]
    assert hub.unsubscribe_pattern(p, "t")
    assert not hub.unsubscribe_pattern(p, "t")  # none left: nothing happens
    hub.multicast(None, mcast("pub", "t"))
    assert p.sent == [b"B:x"]
    hub.close(p)
    assert len(hub.patterns) == 0
    hub.multicast(None, mcast("pub", "u/v"))
    assert p.sent == [b"B:x"]


def test_a_pattern_subscriber_whose_protocol_cannot_carry_it_is_skipped():
    hub = Hub()
    p = pattern_peer(hub, "t")
    assert hub.multicast(None, mcast("pub", "t", b"too long")) == 0
    assert hub.stats.skipped == 1 and p.sent == []


def test_patterns_see_no_presence_events_and_no_broadcasts():
    hub = Hub()
    watcher = peer(hub, "w")
    hub.subscribe(watcher, "t", presence=True)
    p = pattern_peer(hub, "t", "")
    member = peer(hub, "m")
    hub.subscribe(member, "t")
    hub.broadcast(member, Message(Kind.BCAST, "m", "a", None, b"x"))
    assert p.sent == []


def test_secret_topics_are_refused_to_exact_subscribers():
    hub = Hub()
    p = peer(hub, "someone")
    with pytest.raises(NotAllowed):
        hub.subscribe(p, "!/cred/1/2/3/x")
    assert "!/cred/1/2/3/x" not in hub.topics


def test_a_secret_topic_reaches_only_full_credential_patterns():
    hub = Hub()
    right = pattern_peer(hub, "!/cred/1/2/3/x")
    others = pattern_peer(hub, "", "*/*/*/*/*/*", "!/*/", identity="sbus:9:9")
    assert hub.multicast(None, mcast("pub", "!/cred/1/2/3/x", b"s")) == 1
    assert right.sent == [b"B:s"] and others.sent == []


def test_observer_counts_pattern_deliveries():
    hub = Hub()
    results = []
    hub.observer = lambda message, result: results.append(dict(result.recipients))
    exact = peer(hub, "exact")
    hub.subscribe(exact, "t")
    pattern_peer(hub, "t")
    hub.multicast(None, mcast("pub", "t"))
    assert results == [{"a": 1, "b": 1}]


def test_a_run_reaches_pattern_subscribers_one_packet_per_message():
    hub = Hub()
    exact = peer(hub, "exact")
    hub.subscribe(exact, "t")
    p = pattern_peer(hub, "t")
    run = MessageRun(Kind.MCAST, "pub", "a", "t", 2, lambda: [b"1", b"2"])
    assert hub.multicast_run(None, run) == 4
    assert p.sent == [b"B:1", b"B:2"]
    assert exact.sent == [b"A:mcast:pub:t:1", b"A:mcast:pub:t:2"]


def test_patterns_with_queue_groups_and_filters_on_the_topic():
    hub = Hub()
    q1, q2 = peer(hub, "q1"), peer(hub, "q2")
    hub.subscribe(q1, "t", queue="g")
    hub.subscribe(q2, "t", queue="g")
    p = pattern_peer(hub, "*")
    assert hub.multicast(None, mcast("pub", "t", b"1")) == 2
    assert hub.multicast(None, mcast("pub", "t", b"2")) == 2
    assert p.sent == [b"B:1", b"B:2"]
    assert len(q1.sent) == len(q2.sent) == 1


def test_pattern_results_are_recomputed_after_a_change():
    hub = Hub()
    p = pattern_peer(hub, "a")
    hub.multicast(None, mcast("pub", "b"))
    hub.subscribe_pattern(p, "b")
    hub.multicast(None, mcast("pub", "b", b"y"))
    assert p.sent == [b"B:y"]
