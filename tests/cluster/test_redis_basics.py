"""Three nodes on one real redis-server, SSMP clients on each: what crosses nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.plugins.ssmp.client import BlockingSSMPClient, SSMPError
from tests.cluster.nodes import Node, cluster_nodes, log_lines
from tests.cluster.servers import RedisServer


@pytest.fixture
def nodes(redis_server: RedisServer) -> Iterator[list[Node]]:
    with cluster_nodes(redis_server.url) as nodes:
        yield nodes


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def test_mcast_crosses_to_the_nodes_with_subscribers_only(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(a, "pub") as pub, ssmp(b, "sub-b") as sub_b, ssmp(c, "sub-c") as sub_c:
        sub_b.subscribe("news")
        a.until_interested("news")
        assert not a.interested("other")
        pub.mcast("news", b"hello")
        event = sub_b.next_event(timeout=5)
        assert (event.sender, event.kind, event.to, event.payload) == (
            "pub", "MCAST", "news", b"hello"
        )
        # c has no subscriber: nothing was sent to it
        assert c.call(lambda: c.cluster.counters.publications_in) == 0
        sub_c.ping()
        # Nagle off: a lone message is not held for Redis's delayed ACK of the last one
        assert a.engine_no_delay() and b.engine_no_delay()


def test_ucast_to_an_identity_on_another_node_and_404_when_nobody_holds_it(
    nodes: list[Node],
) -> None:
    a, b, _ = nodes
    with ssmp(a, "alice") as alice, ssmp(b, "bob") as bob:
        a.until_holds("bob")
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
        a.until_interested("m")
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


def test_a_node_that_stops_says_bye_and_is_gone_at_once(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(a, "watcher") as watcher, ssmp(c, "leaving") as leaving:
        watcher.subscribe("room", presence=True)
        leaving.subscribe("room")
        assert watcher.next_event(timeout=5).sender == "leaving"
        c.stop()  # long before a heartbeat could be missed (heartbeat 0.2 s, but a bye)
        event = watcher.next_event(timeout=5)
        assert (event.sender, event.subscribed) == ("leaving", False)
        a.until_forgets(c)
        b.until_forgets(c)
        assert a.call(lambda: a.cluster.counters.nodes_gone) == 1


def test_a_password_protected_redis_and_a_password_that_never_shows(tmp_path: Path) -> None:
    from tests.cluster.nodes import LISTENERS
    from tests.ssmp.e2e_support import reactor_thread

    with log_lines() as lines:
        with RedisServer(tmp_path / "redis", password="s3cret-pw") as redis:
            good = tmp_path / "password"
            good.write_text("s3cret-pw\n")
            with cluster_nodes(redis.url, count=2, cluster={"password-file": str(good)}) as (a, b):
                with ssmp(a, "pub") as pub, ssmp(b, "sub") as sub:
                    sub.subscribe("t")
                    a.until_interested("t")
                    pub.mcast("t", b"through a password")
                    assert sub.next_event(timeout=5).payload == b"through a password"
            url = f"redis://:wrong-s3cret@127.0.0.1:{redis.port}"
            wrong = Node(reactor_thread(), url, LISTENERS, {"heartbeat": 0.2}, {})
            try:
                lines.wait_for("refused the connection", "the refusal to be logged")
                assert not wrong.call(lambda: wrong.cluster.connected)
            finally:
                wrong.stop()
    text = "\n".join(lines)
    assert "s3cret" not in text
    assert "redis://:***@127.0.0.1" in text


def test_rediss_with_a_ca_and_a_client_certificate(tmp_path: Path) -> None:
    from tests.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    client = pki.client("node")
    with RedisServer(tmp_path / "redis", pki=pki, client_certificates=True) as redis:
        settings = {
            "tls-ca": str(pki.ca.cert_path), "tls-cert": str(client.cert),
            "tls-key": str(client.key),
        }
        url = f"rediss://localhost:{redis.port}"  # the certificate's name, not its address
        with cluster_nodes(url, count=2, cluster=settings) as (a, b):
            with ssmp(a, "pub") as pub, ssmp(b, "sub") as sub:
                sub.subscribe("secure")
                a.until_interested("secure")
                pub.mcast("secure", b"over TLS")
                assert sub.next_event(timeout=5).payload == b"over TLS"
            # Nagle off on the TCP socket under TLS too: small writes go at once
            assert a.engine_no_delay() and b.engine_no_delay()
