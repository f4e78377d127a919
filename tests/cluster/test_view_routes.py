"""The view's index of plain members (topic -> nodes with members outside queue groups),
kept change by change, and the routes a node derives from it (pure: no engine)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from msgbroker import clusterwire as wire
from msgbroker.clustertraffic import NOWHERE, Traffic
from msgbroker.clusterview import RemoteNode, RemoteView


def member(topic: str, identity: str) -> tuple[bytes, bytes]:
    return wire.member_field(topic, identity), wire.member_value("ssmp", False)


def in_queue(topic: str, group: str, count: int) -> tuple[bytes, bytes]:
    return wire.queue_field(topic, group), wire.pack(count)


def nodes(view: RemoteView, *names: str) -> list[RemoteNode]:
    for name in names:
        view.nodes[name] = RemoteNode(name, "e", 0.0)
    return [view.nodes[name] for name in names]


def test_queue_members_are_not_plain_members_whatever_order_their_fields_come_in() -> None:
    view = RemoteView()
    b, c = nodes(view, "b", "c")
    view.apply(b, [member("jobs", "w1"), in_queue("jobs", "workers", 1)])
    view.apply(c, [in_queue("jobs", "workers", 1)])  # the count before the member
    assert view.plain_nodes("jobs") == [] and not view.plain_members("jobs")
    view.apply(c, [member("jobs", "w2")])
    assert view.plain_nodes("jobs") == []
    view.apply(c, [member("jobs", "plain")])  # a plain member beside the queue member
    assert view.plain_nodes("jobs") == ["c"] and view.plain_members("jobs")
    view.apply(b, [in_queue("jobs", "workers", 0)])  # w1 left the group, still a member
    assert sorted(view.plain_nodes("jobs")) == ["b", "c"]
    view.apply(b, [(wire.member_field("jobs", "w1"), None)])
    view.drop("c")
    assert view.plain == {} and view.plain_nodes("jobs") == []


def traffic(view: RemoteView) -> Traffic:
    cluster: Any = SimpleNamespace(view=view, counters=None)
    return Traffic(cluster)


def test_routes_say_the_topic_channel_the_nodes_beside_it_and_every_node() -> None:
    view = RemoteView()
    b, c, d = nodes(view, "b", "c", "d")
    view.apply(b, [member("t", "x")])
    view.apply(c, [(wire.pattern_field("t"), b""), member("t", "y")])  # member and pattern
    view.apply(d, [(wire.pattern_field(""), b"")])  # d's empty pattern: every topic
    routes = traffic(view)
    topic, beside, every = routes.route("t")
    assert (topic, beside, sorted(every)) == ("t", ("d",), ["b", "c", "d"])
    assert routes.route("other") == (None, ("d",), ("d",))  # a pattern only: d's channel
    assert routes.route("_sys/broker/node") is NOWHERE  # this node's own: never crosses
    view.apply(d, [(wire.pattern_field(""), None)])
    assert routes.route("other") is NOWHERE  # the view changed: the route too
    # a node whose only member in a topic is in a queue group gets no publication of it,
    # unless its pattern wants it
    view.apply(b, [member("q", "w"), in_queue("q", "g", 1)])
    assert routes.route("q") is NOWHERE
    view.apply(b, [(wire.pattern_field("q"), b"")])
    assert routes.route("q") == (None, ("b",), ("b",))
