"""What only the NATS engine has, on real nats-server processes and three broker nodes:
topics of every shape as subject tokens (and never as wildcards), passwords and tokens
that never show, TLS, malformed messages on every subject the engine uses, queue
subscriptions refused, a node's state in parts within the server's max_payload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.plugins.mm2 import codec as mm2codec
from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.codec import ErrorFrame, Subscribe
from msgbroker.plugins.nats import codec
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.sbus.codec import Publish
from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from tests.certs import make_pki
from tests.cluster.nats_support import RawNats
from tests.cluster.nodes import LISTENERS, Node, cluster_nodes, log_lines
from tests.cluster.servers import NatsServer
from tests.mm2.test_e2e import RawClient
from tests.ssmp.e2e_support import WAIT, reactor_thread


@pytest.fixture
def nodes(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[Node]]:
    def listeners(index: int) -> tuple[str, ...]:
        return (*LISTENERS, f"sbus=unix:{tmp_path}/bus{index}")

    with cluster_nodes(nats_server.url, listeners=listeners) as nodes:
        yield nodes


def mm2(node: Node, identity: str) -> BlockingMM2Client:
    host, port = node.address("mm2")
    return BlockingMM2Client(host, port, identity)


def sbus(node: Node) -> BlockingSbusClient:
    return BlockingSbusClient(node.addresses["sbus"].removeprefix("unix:"))


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


#: MM2 destinations are printable ASCII: spaces, dots and NATS wildcards in them
AWKWARD = ["a b.c", "price *.>", "price x.y", "*", ">", "a.*", "a.b", "%41", "a..b", " "]


def test_topics_of_every_shape_cross_as_themselves_never_as_wildcards(
    nodes: list[Node], nats_server: NatsServer
) -> None:
    a, b, c = nodes
    with (
        mm2(a, "pub") as pub,
        mm2(b, "sub-b") as sub_b,
        mm2(c, "sub-c") as sub_c,
        RawNats(nats_server) as spy,
    ):
        spy.sub(b"msgbroker.t.>")
        for index, topic in enumerate(AWKWARD):
            (sub_b if index % 2 else sub_c).subscribe(topic)
        a.until_interested(*AWKWARD, what="a to know every topic")
        for index, topic in enumerate(AWKWARD):
            # one at a time: a chunk of one topic crosses on the topic's subject (a chunk
            # mixing topics would cross on the nodes' own subjects instead)
            pub.publish(topic, topic.encode())
            message = (sub_b if index % 2 else sub_c).next_message(WAIT)
            # each gets exactly its own topic's message, in order: "a.*" is no wildcard
            assert message is not None and (message.destination, message.payload) == (
                topic, topic.encode()
            )
        seen = [spy.next_msg().subject for _ in AWKWARD]
        assert seen == [b"msgbroker.t." + codec.topic_token(t) for t in AWKWARD]
        assert b"msgbroker.t.a%20b%2Ec" in seen
        # Nagle off: a lone message is not held for the server's delayed ACK of the last
        assert a.engine_no_delay() and c.engine_no_delay()
        assert [codec.token_topic(s.split(b".", 2)[2]) for s in seen] == AWKWARD


def test_non_ascii_and_undecodable_topics_cross(nodes: list[Node]) -> None:
    a, b, _ = nodes
    keys = ["prix €/x".encode(), "日本/ж".encode(), b"raw/\xff\xfe"]  # sbus keys are bytes
    with sbus(b) as sub, sbus(a) as pub:
        for key in keys:
            sub.subscribe(key)
        sub.sync()
        a.until_interested(*(k.decode("utf-8", "surrogateescape") for k in keys),
                           what="a to know b's patterns")
        for key in keys:
            pub.publish(key, key)
        for key in keys:
            assert sub.receive(timeout=WAIT) == Publish(key, key)


def test_a_queue_subscription_is_refused_on_nats_with_the_reason(nodes: list[Node]) -> None:
    a, _, _ = nodes
    port = a.address("mm2")[1]
    worker = RawClient(port, "worker")
    worker.send(mm2codec.encode_pubsub(Subscribe("jobs", "workers")))
    frame = worker.next_frame()
    assert isinstance(frame, ErrorFrame)
    assert frame.text.startswith("not allowed to subscribe to 'jobs': queue groups need the "
                                    "Redis engine")
    worker.close()


def test_malformed_messages_on_every_subject_are_counted_and_skipped(
    nodes: list[Node], nats_server: NatsServer
) -> None:
    a, b, _ = nodes
    with ssmp(b, "sub") as sub, ssmp(a, "pub") as pub, RawNats(nats_server) as raw:
        sub.subscribe("t1")
        a.until_interested("t1")
        node = codec.topic_token(b.name)
        for subject in (b"msgbroker.t.t1", b"msgbroker.a", b"msgbroker.n." + node):
            raw.pub(subject, b"\x93\x01garbage")
            raw.pub(subject, b"not msgpack at all \xff")
        raw.pub(b"msgbroker.q", b"no reply subject")  # a state request nobody can answer
        raw.pub(b"msgbroker.r." + node + b".1", b"not a state part")
        raw.pub(b"msgbroker.r." + node + b".x", b"\x95\x01\xa1n\x00\x01\x90")
        raw.sync()

        b.until(lambda: b.cluster.counters.skipped + b.cluster.engine.status()["skipped"] >= 9,
                "b to skip them all")
        pub.mcast("t1", b"still fine")
        assert sub.next_event(timeout=WAIT).payload == b"still fine"
        assert b.call(lambda: b.cluster.connected)


def test_a_password_a_token_and_neither_ever_in_the_log(tmp_path: Path) -> None:
    with log_lines() as lines:
        with NatsServer(tmp_path / "n", user="bob", password="s3cret-pw") as nats:
            good = tmp_path / "password"
            good.write_text("s3cret-pw\n")
            url = f"nats://bob@127.0.0.1:{nats.port}"
            with cluster_nodes(url, count=2, cluster={"password-file": str(good)}) as (a, b):
                with ssmp(a, "pub") as pub, ssmp(b, "sub") as sub:
                    sub.subscribe("t")
                    a.until_interested("t")
                    pub.mcast("t", b"through a password")
                    assert sub.next_event(timeout=WAIT).payload == b"through a password"
            wrong = Node(reactor_thread(), f"nats://bob:wrong-s3cret@127.0.0.1:{nats.port}",
                         LISTENERS, {"heartbeat": 0.2}, {})
            try:
                lines.wait_for("Authorization Violation", "the refusal to be logged")
                assert not wrong.call(lambda: wrong.cluster.connected)
            finally:
                wrong.stop()
        with NatsServer(tmp_path / "t", extra=("--auth", "t0ken-s3cret")) as nats:
            url = f"nats://t0ken-s3cret@127.0.0.1:{nats.port}"
            with cluster_nodes(url, count=2) as (a, b):
                assert "t0ken" not in a.call(a.broker.status)
    text = "\n".join(lines)
    assert "s3cret" not in text
    assert "nats://bob:***@127.0.0.1" in text and "nats://***@127.0.0.1" in text


def test_tls_to_nats_with_the_cluster_ca_and_a_client_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    client = pki.client("node")
    verify = ("--tlsverify", "--tlscacert", str(pki.ca.cert_path))
    with NatsServer(tmp_path / "n", pki=pki, extra=verify) as nats:
        settings = {
            "tls-ca": str(pki.ca.cert_path), "tls-cert": str(client.cert),
            "tls-key": str(client.key),
        }
        url = f"tls://localhost:{nats.port}"
        with cluster_nodes(url, count=2, cluster=settings) as (a, b):
            with ssmp(a, "pub") as pub, ssmp(b, "sub") as sub:
                sub.subscribe("secure")
                a.until_interested("secure")
                pub.mcast("secure", b"over TLS")
                assert sub.next_event(timeout=WAIT).payload == b"over TLS"
            # Nagle off on the TCP socket under TLS too: small writes go at once
            assert a.engine_no_delay() and b.engine_no_delay()
        # without a client certificate the server refuses: logged, never connected
        with log_lines() as lines:
            alone = Node(reactor_thread(), url, LISTENERS, {"tls-ca": str(pki.ca.cert_path)}, {})
            try:
                lines.wait_for("before it was ready", "the failure to be logged")
                assert not alone.call(lambda: alone.cluster.connected)
            finally:
                alone.stop()


def test_a_large_state_crosses_in_parts_and_a_too_large_publication_is_counted(
    tmp_path: Path,
) -> None:
    config = tmp_path / "nats.conf"
    config.write_text("max_payload: 4096\n")
    with log_lines() as lines, NatsServer(tmp_path / "n", extra=("-c", str(config))) as nats:
        with cluster_nodes(nats.url, count=1) as (a,):
            with ssmp(a, "many") as many:
                topics = [f"topic-{i:04d}-{'x' * 40}" for i in range(300)]  # ~25 KB of state
                for topic in topics:
                    many.subscribe(topic)
                many.ping()
                with cluster_nodes(nats.url, count=1) as (b,):
                    # b learned a's whole state by asking, in parts of at most 4 KB
                    b.until_interested(*topics, what="b to read a's state")
                    with mm2(b, "pub") as pub:
                        pub.publish(topics[-1], b"small")
                        assert many.next_event(timeout=WAIT).payload == b"small"
                        pub.publish(topics[0], b"x" * 5000)  # above max_payload: not sent
                        lines.wait_for("cluster: messages could not cross",
                                       "the drop to be counted")
                        assert b.call(lambda: b.cluster.counters.dropped) == 1
                        assert b.call(lambda: b.cluster.engine.status()["too_big"]) == 1
                        pub.publish(topics[0], b"after")
                        assert many.next_event(timeout=WAIT).payload == b"after"
                        assert b.call(lambda: b.cluster.counters.connects) == 1
