"""The hub's route cache (framework/routecache.py): a publisher remembers who receives a key
while only pattern subscribers of its own encoder do, and forgets it as soon as anything
about the recipients (or the broker's hooks) changes."""

from __future__ import annotations

from msgbroker import hookimpl
from msgbroker.hub import Hub
from msgbroker.routecache import RouteCache
from msgbroker.testing import make_broker
from tests.framework.test_hub import FakePeer, encode_a, encode_b, mcast, peer
from tests.framework.test_hub_patterns import pattern_peer


def routed_once(hub: Hub, cache: RouteCache, key: bytes, topic: str) -> bool:
    """The first message on ``topic``: through the hub, then remembered (or not)."""
    hub.multicast(cache.sender, mcast("me", topic, b"hub"), cache.echo)
    return cache.remember(key, topic)


def test_a_remembered_key_reaches_its_pattern_subscribers_without_the_hub():
    hub = Hub()
    a, b, miss = pattern_peer(hub, "t/*"), pattern_peer(hub, "t/"), pattern_peer(hub, "u")
    me = pattern_peer(hub, "t/x")
    cache = RouteCache(hub, me, encode_b)
    assert not cache.send(b"t/x", b"frame")  # nothing remembered yet
    assert routed_once(hub, cache, b"t/x", "t/x")
    stats = (hub.stats.routed, hub.stats.delivered)
    assert cache.send(b"t/x", b"frame")
    assert a.sent[-1] == b.sent[-1] == b"frame" and miss.sent == []
    assert me.sent == []  # no echo: the sender is left out, as the hub leaves it out
    assert (hub.stats.routed, hub.stats.delivered) == (stats[0] + 1, stats[1] + 2)


def test_the_hubs_source_is_the_sender_while_a_remembered_key_is_sent():
    hub = Hub()
    seen = []

    class Watching(FakePeer):
        def send(self, frame: bytes) -> None:
            seen.append(hub.source)

    hub.subscribe_pattern(Watching(identity="sbus:1:2", encode=encode_b), "t")
    me = pattern_peer(hub)
    cache = RouteCache(hub, me, encode_b)
    routed_once(hub, cache, b"t", "t")
    hub.source = None
    assert cache.send(b"t", b"x")
    assert seen == [me, me]


def test_with_echo_the_sender_gets_its_own_frames_and_changing_echo_forgets():
    hub = Hub()
    me = pattern_peer(hub, "t")
    cache = RouteCache(hub, me, encode_b, echo=True)
    assert routed_once(hub, cache, b"t", "t")
    assert cache.send(b"t", b"mine")
    assert me.sent == [b"B:hub", b"mine"]
    cache.echo = False
    assert cache.routes == {} and not cache.send(b"t", b"again")
    assert routed_once(hub, cache, b"t", "t")
    assert cache.send(b"t", b"not mine")
    assert me.sent == [b"B:hub", b"mine"]


def test_every_change_of_recipients_forgets_what_was_remembered():
    hub = Hub()
    me = pattern_peer(hub)
    first = pattern_peer(hub, "t")
    cache = RouteCache(hub, me, encode_b)

    def remembered() -> bool:
        return cache.send(b"t", b"x")

    routed_once(hub, cache, b"t", "t")
    assert remembered()
    late = pattern_peer(hub, "t")  # a pattern added
    assert not remembered()
    routed_once(hub, cache, b"t", "t")
    assert remembered() and late.sent[-1] == b"x"
    hub.unsubscribe_pattern(late, "t")  # removed
    assert not remembered()
    routed_once(hub, cache, b"t", "t")
    hub.close(first)  # a recipient gone
    assert not remembered()
    routed_once(hub, cache, b"t", "t")
    hub.subscribe(peer(hub, "exact"), "elsewhere")  # any subscription, anywhere
    assert not remembered()


def test_a_key_is_not_remembered_when_the_hub_has_more_to_do_than_copy_the_frame():
    hub = Hub()
    me = pattern_peer(hub)
    pattern_peer(hub, "t/")
    cache = RouteCache(hub, me, encode_b)
    # a recipient of another encoder needs its own encoding
    hub.subscribe_pattern(FakePeer(identity="other", encode=encode_a), "t/other")
    assert not routed_once(hub, cache, b"t/other", "t/other")
    # an exact subscriber (its filters, queues, presence are the hub's)
    hub.subscribe(peer(hub, "exact", encode=encode_b), "t/exact")
    assert not routed_once(hub, cache, b"t/exact", "t/exact")
    # an observer sees every routed message
    hub.observer = lambda message, result: None
    assert not routed_once(hub, cache, b"t/seen", "t/seen")
    hub.observer = None
    assert routed_once(hub, cache, b"t/seen", "t/seen")
    assert cache.send(b"t/seen", b"x")


def test_nobody_subscribed_is_remembered_too():
    hub = Hub()
    me = pattern_peer(hub)
    cache = RouteCache(hub, me, encode_b)
    assert routed_once(hub, cache, b"void", "void")
    routed = hub.stats.routed
    assert cache.send(b"void", b"x")
    assert hub.stats.routed == routed + 1


def test_past_its_limit_the_cache_starts_again():
    hub = Hub()
    me = pattern_peer(hub)
    pattern_peer(hub, "")
    cache = RouteCache(hub, me, encode_b, limit=3)
    for key in (b"a", b"b", b"c"):
        routed_once(hub, cache, key, key.decode())
    assert set(cache.routes) == {b"a", b"b", b"c"}
    routed_once(hub, cache, b"d", "d")
    assert set(cache.routes) == {b"d"}
    cache.forget()
    assert cache.routes == {}


def test_a_plugin_added_to_a_running_broker_invalidates_remembered_routes():
    broker = make_broker()
    hub = broker.hub
    me = pattern_peer(hub)
    pattern_peer(hub, "t")
    cache = RouteCache(hub, me, encode_b)
    routed_once(hub, cache, b"t", "t")
    seen = []

    class Observer:
        @hookimpl
        def msgbroker_message_routed(self, message, result):
            seen.append(message.topic)

    broker.add_plugin(Observer(), name="observer")
    assert not cache.send(b"t", b"x")  # through the hub, which the observer watches
    assert not routed_once(hub, cache, b"t", "t")
    assert seen == ["t"]


def test_a_slice_of_keyed_frames_is_routed_in_order_and_counted_once():
    hub = Hub()
    me = pattern_peer(hub)
    subscriber = pattern_peer(hub, "k")
    cache = RouteCache(hub, me, encode_b)
    routed_once(hub, cache, b"k", "k")
    others: list[bytes] = []

    def other(frame: bytes) -> bool:
        others.append(frame)
        subscriber.sent.append(b"(other)")
        return frame != b"stop"

    before = hub.stats.routed, hub.stats.delivered
    frames = [b"P k|1", b"P j|x", b"P k|2", b"P k", b"Q k|3", b"P k|" + b"4" * 10, b"P k|5"]
    cache.send_frames(iter(frames), b"P ", b"|", 8, other)
    # remembered key k: sent here; unknown key j, no separator, another prefix, over the
    # limit: to other(), in order
    assert others == [b"P j|x", b"P k", b"Q k|3", b"P k|4444444444"]
    assert subscriber.sent[1:] == [
        b"P k|1",
        b"(other)",
        b"P k|2",
        b"(other)",
        b"(other)",
        b"(other)",
        b"P k|5",
    ]
    assert (hub.stats.routed, hub.stats.delivered) == (before[0] + 3, before[1] + 3)
    cache.send_frames(iter([b"P k|6", b"stop", b"P k|never"]), b"P ", b"|", 8, other)
    assert subscriber.sent[-2:] == [b"P k|6", b"(other)"]
    assert hub.stats.routed == before[0] + 4


def test_an_empty_key_is_a_key():
    hub = Hub()
    me = pattern_peer(hub)
    subscriber = pattern_peer(hub, "")
    cache = RouteCache(hub, me, encode_b)
    routed_once(hub, cache, b"", "")
    cache.send_frames(iter([b"P |x"]), b"P ", b"|", 100, lambda frame: True)
    assert subscriber.sent[-1] == b"P |x"
