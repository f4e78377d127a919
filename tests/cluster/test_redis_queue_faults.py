"""Queue groups across nodes while Redis restarts: meanwhile each node's members share what
is published on their node (as on one node) and what has no member there is counted as
dropped; after it, the groups are made again and each message reaches one member in the
cluster. A Redis that keeps its data (append-only file) keeps the queues' messages and
what members hold: acknowledgements after the restart still count."""

from __future__ import annotations

from pathlib import Path

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from tests.cluster.nodes import Node, cluster_nodes
from tests.cluster.queue_support import (
    TOPIC,
    Member,
    Tally,
    knows_group,
    pending,
    until_acknowledged,
)
from tests.cluster.servers import RedisServer

SETTINGS = {"heartbeat": 0.2, "queue-redeliver-after": 0.6}


def publish(node: Node, identity: str, payloads: list[bytes]) -> None:
    host, port = node.address("mm2")
    with BlockingMM2Client(
        host, port, identity, required=("pubsub", "batch-ack"), optional=()
    ) as pub:
        for payload in payloads:
            pub.publish(TOPIC, payload)
        assert pub.wait_acked()


def test_while_redis_restarts_each_node_shares_its_own_messages_then_the_cluster_again(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path / "redis") as redis, cluster_nodes(
        redis.url, count=2, cluster=SETTINGS
    ) as (a, b):
        tally = Tally()
        members = [Member(a, "a1", tally), Member(a, "a2", tally), Member(b, "b1", tally)]
        for node in (a, b):
            knows_group(node, a, b)
        redis.stop()
        a.until_connected(False)
        b.until_connected(False)
        publish(a, "pub-a", [b"a%d" % i for i in range(10)])
        a.call(tally.when, 10)
        # a's members shared a's messages; b's member got none of them
        assert set(tally.by_member()) == {"a1", "a2"}
        assert a.call(lambda: a.cluster.queues.counters.local) == 10
        assert a.call(lambda: a.cluster.queues.counters.dropped) == 0
        redis.start()  # empty: the nodes make their groups again
        for node in (a, b):
            node.synced()
            knows_group(node, a, b)
        publish(a, "pub-a2", [b"x%d" % i for i in range(100)])
        publish(b, "pub-b", [b"y%d" % i for i in range(100)])
        a.call(tally.when, 210)
        assert tally.duplicates() == {}
        assert len(tally.got) == 210
        assert tally.by_member().get("b1", 0) > 0  # across the nodes again
        until_acknowledged(redis)
        for member in members:
            member.close()


def test_a_node_without_members_counts_what_it_cannot_store_while_redis_is_away(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path / "redis") as redis, cluster_nodes(
        redis.url, count=2, cluster=SETTINGS
    ) as (a, b):
        tally = Tally()
        member = Member(b, "b1", tally)
        knows_group(a, b)
        redis.stop()
        a.until_connected(False)
        publish(a, "pub", [b"lost%d" % i for i in range(7)])
        assert a.call(lambda: a.cluster.queues.counters.dropped) == 7
        redis.start()
        for node in (a, b):
            node.synced()
        knows_group(a, b)
        publish(a, "pub2", [b"after"])
        b.call(tally.when, 1)
        assert list(tally.got) == [b"after"]
        member.close()


def test_a_redis_that_keeps_its_data_keeps_the_queue_and_what_members_hold(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path / "redis", durable=True) as redis, cluster_nodes(
        redis.url, count=2, cluster=SETTINGS
    ) as (a, b):
        tally = Tally()
        member = Member(a, "member", tally, window=3, auto_ack=False)
        knows_group(b, a)
        publish(b, "pub", [b"m%d" % i for i in range(10)])
        a.call(tally.when, 3)
        redis.restart()  # SIGTERM: the append-only file is written, then read again
        for node in (a, b):
            node.synced()
        assert pending(redis) == 3  # still held by a's member
        member.ack_all()  # acknowledged after the restart: the entries are done
        a.call(tally.when, 6)
        member.ack_all()
        a.call(tally.when, 9)
        member.ack_all()
        a.call(tally.when, 10)
        member.ack_all()
        until_acknowledged(redis)
        assert sorted(tally.got) == sorted(b"m%d" % i for i in range(10))
        assert tally.duplicates() == {}
        assert a.call(lambda: a.cluster.queues.counters.claimed) == 0
