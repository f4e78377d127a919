"""msgbroker_run_routed: an observed hub keeps its run fast path when a run observer is
there and every message of the run reaches the same recipients."""

from __future__ import annotations

from msgbroker import Broker, BrokerConfig, hookimpl
from msgbroker.hub import Hub
from tests.framework.test_hub import encode_b, peer, run_of


def observed_hub() -> tuple[Hub, list, list]:
    hub = Hub()
    messages: list = []
    runs: list = []
    hub.observer = lambda m, r: messages.append((m.payload, dict(r.recipients)))
    hub.run_observer = lambda run, r: runs.append((run.count, dict(r.recipients), r.dropped))
    return hub, messages, runs


def test_a_run_everyone_carries_is_reported_once_with_each_messages_recipients():
    hub, messages, runs = observed_hub()
    s, a = peer(hub, "s"), peer(hub, "a")
    b = peer(hub, "b", encode=encode_b, protocol="b")
    for p in (s, a, b):
        hub.subscribe(p, "t")
    assert hub.multicast_run(s, run_of("s", "t", [b"1", b"22"])) == 4
    assert runs == [(2, {"a": 1, "b": 1}, 0)] and messages == []
    assert a.sent == [b"A:mcast:s:t:1A:mcast:s:t:22"]  # still one frame: the fast path
    assert hub.stats.routed == 2 and hub.stats.delivered == 4


def test_a_run_some_protocol_cannot_carry_whole_is_reported_message_by_message():
    hub, messages, runs = observed_hub()
    s, a = peer(hub, "s"), peer(hub, "a")
    b = peer(hub, "b", encode=encode_b, protocol="b")
    for p in (s, a, b):
        hub.subscribe(p, "t")
    hub.multicast_run(s, run_of("s", "t", [b"1", b"too long"]))
    assert runs == []
    assert messages == [(b"1", {"a": 1, "b": 1}), (b"too long", {"a": 1})]


def test_a_run_to_nobody_is_reported_once():
    hub, messages, runs = observed_hub()
    s = peer(hub, "s")
    hub.multicast_run(s, run_of("s", "nobody", [b"1", b"2", b"3"]))
    assert runs == [(3, {}, 0)] and messages == []


def test_the_broker_binds_the_run_observer_only_beside_message_routed():
    class Both:
        @hookimpl
        def msgbroker_message_routed(self, message, result):
            pass

        @hookimpl
        def msgbroker_run_routed(self, run, result):
            pass

    class MessagesOnly:
        @hookimpl
        def msgbroker_message_routed(self, message, result):
            pass

    from twisted.internet.task import Clock

    both = Broker(BrokerConfig(), Clock(), plugins=[Both()])
    assert both.hub.observer is not None and both.hub.run_observer is not None
    only = Broker(BrokerConfig(), Clock(), plugins=[MessagesOnly()])
    assert only.hub.observer is not None and only.hub.run_observer is None
    none = Broker(BrokerConfig(), Clock())
    assert none.hub.observer is None and none.hub.run_observer is None
