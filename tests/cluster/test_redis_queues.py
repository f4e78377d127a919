"""Micromessage2 queue groups across the cluster, on a real redis-server (streams): each
message reaches exactly one member in the whole cluster; ack and batch-ack acknowledge the
stream's entries; what a member or a node took and never acknowledged goes to another
member after queue-redeliver-after; filters apply where the message is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from tests.cluster.nodes import Node, cluster_nodes
from tests.cluster.queue_support import (
    GROUP,
    STREAM,
    TOPIC,
    Member,
    Tally,
    knows_group,
    pending,
)
from tests.cluster.redis_support import wait_for
from tests.cluster.servers import RedisServer

REDELIVER = 0.6


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


def queue_nodes(redis: RedisServer, count: int = 2, **cluster: object):
    settings = {"heartbeat": 0.2, "queue-redeliver-after": REDELIVER, **cluster}
    return cluster_nodes(redis.url, count=count, cluster=settings)


def mm2_publisher(node: Node, identity: str = "publisher") -> BlockingMM2Client:
    host, port = node.address("mm2")
    return BlockingMM2Client(host, port, identity, required=("pubsub", "batch-ack"), optional=())


def test_each_message_reaches_exactly_one_member_across_nodes(redis: RedisServer) -> None:
    with queue_nodes(redis, count=3) as (a, b, c):
        tally = Tally()
        members = [
            Member(a, "a1", tally), Member(b, "b1", tally),
            Member(b, "b2", tally, window=3), Member(c, "c1", tally, window=50),
        ]  # fmt: skip
        for node in (a, b, c):
            knows_group(node, a, b, c)
        count = 600
        with mm2_publisher(a) as pub:
            for i in range(count // 2):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        host, port = b.address("ssmp")
        with BlockingSSMPClient(host, port, "ssmp-pub") as pub:
            for i in range(count // 2, count):
                pub.mcast(TOPIC, b"m%d" % i)
            pub.ping()
        a.call(tally.when, count)
        assert tally.duplicates() == {}
        assert sorted(tally.got) == sorted(b"m%d" % i for i in range(count))
        assert set(tally.by_member()) == {"a1", "b1", "b2", "c1"}  # all took a share
        wait_for(lambda: pending(redis) == 0, "every entry acknowledged")
        taken = sum(n.call(lambda n=n: n.cluster.queues.counters.taken) for n in (a, b, c))
        claimed = sum(n.call(lambda n=n: n.cluster.queues.counters.claimed) for n in (a, b, c))
        assert (taken, claimed) == (count, 0)
        assert a.call(lambda: a.cluster.queues.counters.added) == count // 2
        assert b.call(lambda: b.cluster.queues.counters.added) == count // 2
        for member in members:
            member.close()
