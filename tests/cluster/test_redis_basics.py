"""Three nodes on one real redis-server, SSMP clients on each: what crosses nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.plugins.ssmp.client import BlockingSSMPClient, SSMPError
from tests.cluster.nodes import Node, cluster_nodes
from tests.cluster.redis_support import RedisServer, redis_server, wait_for


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
def nodes(redis: RedisServer) -> Iterator[list[Node]]:
    with cluster_nodes(redis.url) as nodes:
        yield nodes


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def test_mcast_crosses_to_the_nodes_with_subscribers_only(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(a, "pub") as pub, ssmp(b, "sub-b") as sub_b, ssmp(c, "sub-c") as sub_c:
        sub_b.subscribe("news")
        wait_for(lambda: a.interested("news"), "a to know b's interest")
        assert not a.interested("other")
        pub.mcast("news", b"hello")
        event = sub_b.next_event(timeout=5)
        assert (event.sender, event.kind, event.to, event.payload) == (
            "pub", "MCAST", "news", b"hello"
        )
        # c has no subscriber: nothing was sent to it
        assert c.call(lambda: c.cluster.counters.publications_in) == 0
        sub_c.ping()


def test_ucast_to_an_identity_on_another_node_and_404_when_nobody_holds_it(
    nodes: list[Node],
) -> None:
    a, b, _ = nodes
    with ssmp(a, "alice") as alice, ssmp(b, "bob") as bob:
        wait_for(lambda: a.holds_remotely("bob"), "a to know where bob is")
        alice.ucast("bob", b"hi bob")
        event = bob.next_event(timeout=5)
        assert (event.sender, event.kind, event.to, event.payload) == (
            "alice", "UCAST", "bob", b"hi bob"
        )
        with pytest.raises(SSMPError) as refused:
            alice.ucast("nobody", b"?")
        assert refused.value.code == 404


def test_metrics_say_what_crossed(nodes: list[Node]) -> None:
    from msgbroker.plugins.admin.hookspecs import collect_metrics

    a, b, _ = nodes
    with ssmp(a, "pub") as pub, ssmp(b, "sub") as sub:
        sub.subscribe("m")
        wait_for(lambda: a.interested("m"), "a to know b's interest")
        pub.mcast("m", b"one")
        sub.next_event(timeout=5)

        def families(node: Node) -> dict[str, float]:
            found = collect_metrics(node.broker.plugins, node.broker)
            return {
                sample.name: sample.value
                for family in found
                if family.name.startswith("msgbroker_cluster")
                for sample in family.samples
            }

        sent, got = a.call(families, a), b.call(families, b)
        assert sent["msgbroker_cluster_connected"] == 1
        assert sent["msgbroker_cluster_nodes"] == 2
        assert sent["msgbroker_cluster_messages_out_total"] == 1
        assert got["msgbroker_cluster_messages_in_total"] == 1
        assert "cluster: node" in a.call(a.broker.status)
