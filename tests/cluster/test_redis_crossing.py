"""What crosses nodes, for every protocol and across protocols, on a real redis-server:
BCAST, identities unique cluster-wide, presence, sbus patterns (and secret topics that
never leave their node), MM2 filters applied on the receiving node, pipelined runs in one
publication, malformed publications skipped."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.sbus.codec import Publish
from msgbroker.plugins.ssmp.client import BlockingSSMPClient, SSMPError
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from tests.cluster.nodes import LISTENERS, Node, cluster_nodes
from tests.cluster.servers import RedisServer
from tests.ssmp.e2e_support import WAIT


@pytest.fixture
def nodes(redis_server: RedisServer, tmp_path: Path) -> Iterator[list[Node]]:
    def listeners(index: int) -> tuple[str, ...]:
        return (*LISTENERS, f"sbus=unix:{tmp_path}/bus{index}")

    with cluster_nodes(redis_server.url, listeners=listeners) as nodes:
        yield nodes


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def sbus(node: Node) -> BlockingSbusClient:
    return BlockingSbusClient(node.addresses["sbus"].removeprefix("unix:"))


def test_bcast_reaches_every_node_sharing_a_topic_once(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(a, "alice") as alice, ssmp(b, "bob") as bob, ssmp(c, "carol") as carol:
        for client in (alice, bob, carol):
            client.subscribe("room")
            client.subscribe("hall")  # two shared topics: still one copy each
        a.until(lambda: a.cluster.view.nodes_in(["room"]) == {b.name, c.name},
                "a to know who is in the room")
        alice.bcast(b"to all")
        for client in (bob, carol):
            event = client.next_event(timeout=WAIT)
            assert (event.sender, event.kind, event.payload) == ("alice", "BCAST", b"to all")
        bob.bcast(b"second")  # carol's next event proves she got the first only once
        assert carol.next_event(timeout=WAIT).payload == b"second"


def test_a_login_on_another_node_kicks_the_holder(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(a, "watcher") as watcher:
        watcher.subscribe("room", presence=True)
        first = ssmp(b, "dora")
        first.subscribe("room")
        event = watcher.next_event(timeout=WAIT)
        assert (event.sender, event.subscribed) == ("dora", True)
        c.until_holds("dora")
        with ssmp(c, "dora") as second:
            # the holder on b is closed, and its departure announced to a's watcher
            event = watcher.next_event(timeout=WAIT)
            assert (event.sender, event.topic, event.subscribed) == ("dora", "room", False)
            with pytest.raises((ConnectionError, OSError, SSMPError, TimeoutError)):
                first.ping()
            a.until_holds("dora", where=c)
            watcher.ucast("dora", b"where are you")
            assert second.next_event(timeout=WAIT).payload == b"where are you"
        first.close()


def test_presence_snapshot_and_events_across_nodes(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(c, "carol") as carol:
        carol.subscribe("lobby", presence=True)
        a.until_interested("lobby")
        with ssmp(a, "watcher") as watcher:
            watcher.subscribe("lobby", presence=True)
            snapshot = watcher.next_event(timeout=WAIT)
            assert (snapshot.sender, snapshot.subscribed, snapshot.presence) == (
                "carol", True, True
            )
            event = carol.next_event(timeout=WAIT)  # carol hears of the watcher
            assert (event.sender, event.subscribed) == ("watcher", True)
            bob = ssmp(b, "bob")
            bob.subscribe("lobby")
            assert (watcher.next_event(timeout=WAIT).sender, carol.next_event(
                timeout=WAIT).sender) == ("bob", "bob")
            bob.close()
            for client in (watcher, carol):
                event = client.next_event(timeout=WAIT)
                assert (event.sender, event.subscribed) == ("bob", False)


def test_every_protocol_to_every_protocol_with_filters_on_the_receiving_node(
    nodes: list[Node],
) -> None:
    a, b, c = nodes
    mm2_host, mm2_port = b.address("mm2")
    stmp_host, stmp_port = c.address("stmp")
    with (
        BlockingMM2Client(mm2_host, mm2_port, "filtered") as filtered,
        BlockingSTMPClient(stmp_host, stmp_port, "stmp-sub", "open") as stmp_sub,
        ssmp(c, "ssmp-sub") as ssmp_sub,
    ):
        filtered.subscribe("prices", filters=["price>=N10"])
        stmp_sub.subscribe("prices")
        ssmp_sub.subscribe("prices")
        a.until(lambda: set(a.cluster.view.topic_nodes.get("prices", ())) == {b.name, c.name},
                "a to know both nodes want prices")
        mm2_host_a, mm2_port_a = a.address("mm2")
        with BlockingMM2Client(mm2_host_a, mm2_port_a, "mm2-pub") as pub:
            pub.publish("prices", b"cheap", {"price": 5})
            pub.publish("prices", b"dear", {"price": 12, "d": Decimal("1.25")})
            message = filtered.next_message(WAIT)  # only the one its filter passes
            assert (message.payload, message.properties) == (
                b"dear", {"price": 12, "d": Decimal("1.25")}
            )
            assert [stmp_sub.next_delivery(WAIT).data for _ in range(2)] == [b"cheap", b"dear"]
            assert [ssmp_sub.next_event(timeout=WAIT).payload for _ in range(2)] == [
                b"cheap", b"dear"
            ]
        stmp_host_a, stmp_port_a = a.address("stmp")
        with BlockingSTMPClient(stmp_host_a, stmp_port_a, "stmp-pub", "open") as stmp_pub:
            stmp_pub.publish("prices", b"from stmp")
            event = ssmp_sub.next_event(timeout=WAIT)
            assert (event.sender, event.payload) == ("stmp-pub", b"from stmp")


def test_sbus_patterns_receive_across_nodes_and_secret_topics_stay_home(
    nodes: list[Node],
) -> None:
    a, b, _ = nodes
    import os

    secret = b"!/cred/%d/%d/%d/x" % (os.getgid(), os.getuid(), os.getpid())
    with sbus(b) as sub, sbus(a) as local_sub, ssmp(a, "pub") as pub:
        sub.subscribe(b"dev/*/temp")
        sub.subscribe(secret[: secret.rindex(b"/") + 1])
        sub.sync()
        local_sub.subscribe(secret[: secret.rindex(b"/") + 1])
        local_sub.sync()
        a.until_interested("dev/kitchen/temp")
        assert not a.interested("dev/kitchen/humidity")
        assert not a.interested(secret.decode())
        with sbus(a) as sbus_pub:
            sbus_pub.publish(secret, b"for this host only")
            assert local_sub.receive(timeout=WAIT) == Publish(secret, b"for this host only")
            pub.mcast("dev/kitchen/temp", b"21")
            # the secret one went first from the same node: the next is the plain one
            assert sub.receive(timeout=WAIT) == Publish(b"dev/kitchen/temp", b"21")
            for n in range(3):  # sbus to sbus, on sbus's remembered routes too
                sbus_pub.publish(b"dev/hall/temp", b"%d" % n)
                assert sub.receive(timeout=WAIT) == Publish(b"dev/hall/temp", b"%d" % n)
            sub.unsubscribe(b"dev/*/temp")
            sub.subscribe(b"dev/hall/*")
            sub.sync()
            a.until(lambda: not a.cluster.interested("dev/kitchen/temp")
                    and a.cluster.interested("dev/hall/temp"), "a to see the change")
            sbus_pub.publish(b"dev/kitchen/temp", b"no longer")
            sbus_pub.publish(b"dev/hall/temp", b"still")
            assert sub.receive(timeout=WAIT) == Publish(b"dev/hall/temp", b"still")


def test_a_pipelined_run_crosses_as_one_publication(nodes: list[Node]) -> None:
    a, b, _ = nodes
    with ssmp(b, "sub") as sub:
        sub.subscribe("fast")
        a.until_interested("fast")
        before = a.call(lambda: a.cluster.counters.publications_out)
        host, port = a.address("ssmp")
        with socket.create_connection((host, port)) as raw:
            raw.sendall(b"LOGIN pub open\n")
            assert raw.recv(16) == b"200\n"
            raw.sendall(b"".join(b"MCAST fast m%d\n" % i for i in range(200)))
            answers = b""
            while answers.count(b"\n") < 200:
                answers += raw.recv(65536)
        got = [sub.next_event(timeout=WAIT).payload for _ in range(200)]
        assert got == [b"m%d" % i for i in range(200)]
        written = a.call(lambda: a.cluster.counters.publications_out) - before
        assert written <= 5  # one per received chunk, not one per message


def test_malformed_and_foreign_publications_are_counted_and_skipped(
    nodes: list[Node], redis_server: RedisServer
) -> None:
    a, b, _ = nodes
    with ssmp(b, "sub") as sub, ssmp(a, "pub") as pub:
        sub.subscribe("t1")
        a.until_interested("t1")
        for channel in ("msgbroker:t:t1", "msgbroker:ctl", f"msgbroker:n:{b.name}"):
            redis_server.command("PUBLISH", channel, "\x93\x01garbage")
            redis_server.command("PUBLISH", channel, "not msgpack at all \xff")
        b.until(lambda: b.cluster.counters.skipped >= 6, "b to skip them")
        pub.mcast("t1", b"still fine")
        assert sub.next_event(timeout=WAIT).payload == b"still fine"


def test_order_is_kept_across_topics_and_kinds_within_one_chunk(nodes: list[Node]) -> None:
    a, b, _ = nodes
    with ssmp(b, "sub") as sub:
        sub.subscribe("t1")
        sub.subscribe("t2")
        a.until(lambda: a.cluster.interested("t1") and a.cluster.interested("t2")
                and "sub" in a.cluster.view.identities, "a to know b's interest")
        host, port = a.address("ssmp")
        with socket.create_connection((host, port)) as raw:
            raw.sendall(b"LOGIN pub open\n")
            assert raw.recv(16) == b"200\n"
            requests = [b"MCAST t1 a\n", b"MCAST t1 b\n", b"MCAST t2 c\n", b"UCAST sub d\n",
                        b"MCAST t1 e\n", b"MCAST t2 f\n", b"MCAST t2 g\n"]
            raw.sendall(b"".join(requests))
            answers = b""
            while answers.count(b"\n") < len(requests):
                answers += raw.recv(65536)
        got = [sub.next_event(timeout=WAIT).payload for _ in requests]
        assert got == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]


def test_each_journal_counts_a_crossing_message_where_it_was_published(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A message published on A and delivered on B is in both journals; B's row names A as
    its origin, so a report over both counts the message once (docs/journal.md)."""
    import pyarrow.parquet as pq

    def journal(index: int) -> dict[str, dict[str, str]]:
        return {"journal": {"directory": str(tmp_path / f"journal{index}")}}

    with cluster_nodes(redis_server.url, count=2, sections=journal) as (a, b):
        with ssmp(a, "alice") as alice, ssmp(b, "bob") as bob:
            bob.subscribe("news")
            a.until_interested("news")
            alice.mcast("news", b"once")
            assert bob.next_event(timeout=WAIT).payload == b"once"
        a_name, b_name = a.name, b.name
    # the nodes stopped: their journals are written
    rows = {
        index: pq.read_table(tmp_path / f"journal{index}" / "messages").to_pylist()
        for index in (0, 1)
    }
    published = [r for r in rows[0] if r["topic"] == "news"]
    delivered = [r for r in rows[1] if r["topic"] == "news"]
    assert [(r["node"], r["origin_node"]) for r in published] == [(a_name, None)]
    assert [(r["node"], r["origin_node"]) for r in delivered] == [(b_name, a_name)]


def test_sys_topics_are_each_nodes_own_and_never_cross(nodes: list[Node]) -> None:
    """``_sys/...`` describes the node it is published on (the admin plugin's samples):
    a subscriber on B gets B's, never A's under the same name."""
    a, b, _ = nodes
    with ssmp(a, "alice") as alice, ssmp(b, "bob") as bob:
        bob.subscribe("_sys/broker/connections")
        bob.subscribe("news")
        a.until_interested("news")
        assert not a.interested("_sys/broker/connections")
        alice.mcast("_sys/broker/connections", b"from a")
        alice.mcast("news", b"after it")
        # same publisher, same node: had the first crossed, it would have come first
        assert bob.next_event(timeout=WAIT).payload == b"after it"
