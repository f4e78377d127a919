"""One received chunk whose messages go to different places crosses as one publication per
interested node, on Redis and on NATS (real servers): MCASTs alternating over topics,
UCAST/BCAST/MCAST mixed, Micromessage2 filters and sbus patterns applied on the receiving
node, every message once and in the order it was published. And what arrives on a node's
own channel is delivered as a topic's publication is (docs/cluster.md, "Batching")."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msgbroker import clusterwire as wire
from msgbroker.message import Kind, Message
from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.nats import codec as nats_codec
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.sbus.codec import Publish
from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from tests.cluster.nats_support import RawNats
from tests.cluster.nodes import LISTENERS, Node, cluster_nodes
from tests.ssmp.e2e_support import WAIT


@pytest.fixture(params=["redis", "nats"])
def engine(request: pytest.FixtureRequest) -> Any:
    """A real redis-server or nats-server."""
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def nodes(engine: Any, tmp_path: Path) -> Iterator[list[Node]]:
    """Three nodes, each with an sbus listener too."""

    def listeners(index: int) -> tuple[str, ...]:
        return (*LISTENERS, f"sbus=unix:{tmp_path}/bus{index}")

    with cluster_nodes(engine.url, listeners=listeners) as nodes:
        yield nodes


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def sbus(node: Node) -> BlockingSbusClient:
    return BlockingSbusClient(node.addresses["sbus"].removeprefix("unix:"))


def published(node: Node) -> int:
    """Publications the node wrote (the counter behind msgbroker_cluster_publications_out)."""
    return int(node.call(lambda: node.cluster.counters.publications_out))


def knows(a: Node, topic: str, *others: Node) -> bool:
    """Whether ``a`` routes ``topic`` to every one of ``others`` (in the reactor thread:
    a check for ``Node.until``)."""
    return {o.name for o in others} <= set(a.cluster.traffic.route(topic)[2])


@contextlib.contextmanager
def raw_ssmp(node: Node, identity: str, *topics: str) -> Iterator[socket.socket]:
    """A logged-in SSMP connection (subscribed to ``topics``) to send chunks on."""
    host, port = node.address("ssmp")
    with socket.create_connection((host, port), timeout=WAIT) as raw:
        lines = [b"LOGIN %s open\n" % identity.encode()]
        lines += [b"SUBSCRIBE %s\n" % topic.encode() for topic in topics]
        raw.sendall(b"".join(lines))
        answers = b""
        while answers.count(b"\n") < len(lines):
            answers += raw.recv(4096)
        assert set(answers.split()) == {b"200"}, answers
        yield raw


def send_chunk(raw: socket.socket, requests: list[bytes]) -> None:
    """All of ``requests`` in one write (far below a segment: one chunk for the broker),
    then every answer read."""
    data = b"".join(requests)
    assert len(data) < 1400
    raw.sendall(data)
    answers = b""
    while answers.count(b"\n") < len(requests):
        answers += raw.recv(65536)
    assert set(answers.split()) == {b"200"}, answers


def test_mcasts_alternating_over_topics_cross_as_one_publication_per_node(
    nodes: list[Node],
) -> None:
    a, b, c = nodes
    topics = ["t0", "t1", "t2", "t3", "nobody"]
    with ssmp(b, "sub-b") as sub_b, ssmp(c, "sub-c") as sub_c:
        for topic in ("t0", "t1", "t2"):
            sub_b.subscribe(topic)
        for topic in ("t2", "t3"):
            sub_c.subscribe(topic)
        a.until(lambda: knows(a, "t0", b) and knows(a, "t1", b) and knows(a, "t2", b, c)
                and knows(a, "t3", c), "a to know who wants what")
        with raw_ssmp(a, "pub") as raw:
            before = published(a)
            sent = [(topics[i % len(topics)], b"m%d" % i) for i in range(40)]
            send_chunk(raw, [b"MCAST %s %s\n" % (t.encode(), p) for t, p in sent])
            want_b = [p for t, p in sent if t in ("t0", "t1", "t2")]
            want_c = [p for t, p in sent if t in ("t2", "t3")]
            assert [sub_b.next_event(timeout=WAIT).payload for _ in want_b] == want_b
            assert [sub_c.next_event(timeout=WAIT).payload for _ in want_c] == want_c
            assert published(a) - before == 2  # one to b, one to c: not one per topic change
            # once each: the next thing each gets is what comes next
            send_chunk(raw, [b"MCAST t2 end\n"])
            assert sub_b.next_event(timeout=WAIT).payload == b"end"
            assert sub_c.next_event(timeout=WAIT).payload == b"end"
            assert published(a) - before == 3  # one topic: its own publication, fanned out
        in_b = b.call(lambda: b.cluster.counters.messages_in)
        assert in_b == len(want_b) + 1


def test_ucast_bcast_and_mcast_mixed_in_one_chunk(nodes: list[Node]) -> None:
    a, b, c = nodes
    with ssmp(b, "bob") as bob, ssmp(c, "carol") as carol:
        bob.subscribe("room")
        bob.subscribe("t0")
        carol.subscribe("room")
        carol.subscribe("t1")
        a.until(lambda: knows(a, "t0", b) and knows(a, "t1", c) and knows(a, "room", b, c)
                and {"bob", "carol"} <= a.cluster.view.identities.keys(),
                "a to know bob, carol and their topics")
        with raw_ssmp(a, "pub", "room") as raw:
            before = published(a)
            send_chunk(raw, [
                b"MCAST t0 1\n", b"UCAST bob 2\n", b"MCAST t1 3\n", b"BCAST 4\n",
                b"UCAST carol 5\n", b"MCAST t0 6\n", b"MCAST t1 7\n", b"BCAST 8\n",
            ])
            got_b = [bob.next_event(timeout=WAIT) for _ in range(5)]
            got_c = [carol.next_event(timeout=WAIT) for _ in range(5)]
            assert [(e.kind, e.payload) for e in got_b] == [
                ("MCAST", b"1"), ("UCAST", b"2"), ("BCAST", b"4"), ("MCAST", b"6"),
                ("BCAST", b"8"),
            ]
            assert [(e.kind, e.payload) for e in got_c] == [
                ("MCAST", b"3"), ("BCAST", b"4"), ("UCAST", b"5"), ("MCAST", b"7"),
                ("BCAST", b"8"),
            ]
            assert published(a) - before == 2
            send_chunk(raw, [b"BCAST end\n"])  # once each: the next is this one
            assert bob.next_event(timeout=WAIT).payload == b"end"
            assert carol.next_event(timeout=WAIT).payload == b"end"


@contextlib.contextmanager
def one_write(client: BlockingMM2Client) -> Iterator[None]:
    """What the client sends meanwhile goes out in one write (one chunk for the broker)."""
    channel = client._channel
    held: list[Any] = []
    send = channel.send
    channel.send = held.extend
    try:
        yield
    finally:
        channel.send = send
    send(held)


def test_filters_and_patterns_apply_on_the_receiving_node(nodes: list[Node]) -> None:
    a, b, c = nodes
    host_a, port_a = a.address("mm2")
    host_b, port_b = b.address("mm2")
    with (
        BlockingMM2Client(host_b, port_b, "filtered") as filtered,
        ssmp(c, "member") as member,
        sbus(c) as patterned,
        BlockingMM2Client(host_a, port_a, "pub") as pub,
    ):
        filtered.subscribe("prices", filters=["price>=N10"])
        member.subscribe("prices")
        member.subscribe("dev/x")
        patterned.subscribe(b"dev/*")  # c has a member in dev/x and a pattern matching it
        patterned.sync()
        a.until(lambda: knows(a, "prices", b, c) and knows(a, "dev/x", c)
                and knows(a, "dev/y", c), "a to know b's and c's interests")
        before = published(a)
        with one_write(pub):
            pub.publish("prices", b"p5", {"price": 5})
            pub.publish("dev/x", b"d1")
            pub.publish("prices", b"p12", {"price": 12})
            pub.publish("dev/y", b"d2")  # c's pattern only
            pub.publish("prices", b"p20", {"price": 20})
            pub.publish("dev/x", b"d3")
        assert pub.wait_acked(WAIT)
        messages = [filtered.next_message(WAIT) for _ in range(2)]
        assert [m.payload for m in messages if m is not None] == [b"p12", b"p20"]
        assert [member.next_event(timeout=WAIT).payload for _ in range(5)] == [
            b"p5", b"d1", b"p12", b"p20", b"d3"
        ]
        assert [patterned.receive(timeout=WAIT) for _ in range(3)] == [
            Publish(b"dev/x", b"d1"), Publish(b"dev/y", b"d2"), Publish(b"dev/x", b"d3")
        ]
        assert published(a) - before == 2
        pub.publish("dev/x", b"end")  # once each: the next is this one
        assert member.next_event(timeout=WAIT).payload == b"end"
        assert patterned.receive(timeout=WAIT) == Publish(b"dev/x", b"end")
        pub.publish("prices", b"p30", {"price": 30})
        message = filtered.next_message(WAIT)
        assert message is not None and message.payload == b"p30"


def test_a_node_delivers_what_comes_on_its_own_channel_as_a_topic_publication(
    nodes: list[Node], engine: Any
) -> None:
    """Items written straight onto b's own channel (as another node's per-node publication
    would be): its members and patterns get them once, a topic it has no member in
    reaches nobody, a UCAST its holder."""
    _, b, _ = nodes
    with ssmp(b, "member") as member, sbus(b) as patterned:
        member.subscribe("dev/x")
        patterned.subscribe(b"dev/*")
        patterned.sync()
        items = [
            wire.message_item(Message(Kind.MCAST, "elsewhere", "ssmp", "dev/x", b"1")),
            wire.message_item(Message(Kind.MCAST, "elsewhere", "ssmp", "gone", b"2")),
            wire.message_item(Message(Kind.UCAST, "elsewhere", "ssmp", "member", b"3")),
            wire.message_item(Message(Kind.MCAST, "elsewhere", "ssmp", "dev/y", b"4")),
        ]
        data = wire.header("other-node", "e1") + wire.body(wire.MESSAGES, items)
        if hasattr(engine, "command"):  # Redis
            engine.command("PUBLISH", f"msgbroker:n:{b.name}", data)
        else:
            with RawNats(engine) as raw:
                raw.pub(b"msgbroker.n." + nats_codec.topic_token(b.name), data)
                raw.sync()
        assert [member.next_event(timeout=WAIT).payload for _ in range(2)] == [b"1", b"3"]
        assert [patterned.receive(timeout=WAIT) for _ in range(2)] == [
            Publish(b"dev/x", b"1"), Publish(b"dev/y", b"4")
        ]
        b.until(lambda: b.cluster.counters.messages_in == 4, "b to count the four")
        member.ucast("member", b"next")  # nothing more came before it: each got it once
        assert member.next_event(timeout=WAIT).payload == b"next"
