"""Micromessage2 queue groups across the cluster, on a real redis-server (streams): each
message reaches exactly one member in the whole cluster; ack and batch-ack acknowledge the
stream's entries; what a member or a node took and never acknowledged goes to another
member after queue-redeliver-after; filters apply where the message is read."""

from __future__ import annotations

from pathlib import Path

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
    until_acknowledged,
)
from tests.cluster.servers import RedisServer
from tests.ssmp.e2e_support import WAIT, parse_address, twistd_broker

REDELIVER = 0.6


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
        until_acknowledged(redis)
        taken = sum(n.call(lambda n=n: n.cluster.queues.counters.taken) for n in (a, b, c))
        claimed = sum(n.call(lambda n=n: n.cluster.queues.counters.claimed) for n in (a, b, c))
        assert (taken, claimed) == (count, 0)
        assert a.call(lambda: a.cluster.queues.counters.added) == count // 2
        assert b.call(lambda: b.cluster.queues.counters.added) == count // 2
        # the nodes' only members in the topic are queue members: no pub/sub crossed
        assert [n.call(lambda n=n: n.cluster.counters.publications_in) for n in (a, b, c)] == [
            0, 0, 0]
        figures = b.call(queue_metrics, b)  # what /metrics shows
        assert figures["msgbroker_cluster_queue_added_total"] == count // 2
        assert figures["msgbroker_cluster_queue_groups"] == 1
        assert figures["msgbroker_cluster_queue_taken_total"] == tally.by_member()[
            "b1"] + tally.by_member()["b2"]
        for member in members:
            member.close()


def queue_metrics(node: Node) -> dict[str, float]:
    from msgbroker.plugins.admin.hookspecs import collect_metrics

    return {
        sample.name: sample.value
        for family in collect_metrics(node.broker.plugins, node.broker)
        if family.name.startswith("msgbroker_cluster_queue")
        for sample in family.samples
    }


def test_ack_and_batch_ack_acknowledge_the_stream_entries(redis: RedisServer) -> None:
    with queue_nodes(redis) as (a, b):
        tally = Tally()
        one = Member(a, "one", tally, ack=True, auto_ack=False)  # the ack extension: 1
        five = Member(b, "five", tally, window=5, auto_ack=False)  # batch-ack: 5
        for node in (a, b):
            knows_group(node, a, b)
        with mm2_publisher(a) as pub:
            for i in range(20):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        delivered = 0
        while delivered < 20:
            delivered = min(delivered + 6, 20)  # each round fills both windows
            a.call(tally.when, delivered)
            # what the members hold is exactly what the nodes took: nothing more is read
            # while the windows are full, and every entry handed out is pending
            assert pending(redis) == delivered - sum(
                n.call(lambda n=n: n.cluster.queues.counters.acked) for n in (a, b)
            )
            assert pending(redis) == len(one.held) + len(five.held)
            one.ack_all()  # one ack frame per message for "ack", cumulative for batch-ack
            five.ack_all()
        until_acknowledged(redis)
        assert tally.duplicates() == {}
        assert len(tally.got) == 20
        acked = [n.call(lambda n=n: n.cluster.queues.counters.acked) for n in (a, b)]
        assert acked == [tally.by_member()["one"], tally.by_member()["five"]]


def test_a_member_dropped_with_unacked_messages_has_them_go_to_another_node_after_the_time(
    redis: RedisServer,
) -> None:
    with queue_nodes(redis) as (a, b):
        tally = Tally()
        victim = Member(a, "victim", tally, window=5, auto_ack=False)
        knows_group(b, a)
        with mm2_publisher(b) as pub:
            for i in range(5):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        a.call(tally.when, 5)
        assert pending(redis) == 5
        survivor = Member(b, "survivor", tally, window=10)
        dropped_at = a.call(a.reactor_seconds)
        victim.drop()
        b.call(tally.when, 10)  # the same five again, at the survivor
        assert tally.by_member() == {"victim": 5, "survivor": 5}
        assert all(who == ["victim", "survivor"] for who in tally.got.values())
        first = min(survivor.arrived.values())
        # not before queue-redeliver-after (Redis counts idle time in whole milliseconds),
        # and within it and a claim's quarter period (the bound leaves room for a slow box)
        assert first - dropped_at >= REDELIVER - 0.01
        assert first - dropped_at < 3 * REDELIVER
        assert a.call(lambda: a.cluster.queues.counters.released) == 5
        assert b.call(lambda: b.cluster.queues.counters.claimed) == 5
        until_acknowledged(redis, "the survivor's acks")
        survivor.close()


def test_a_member_dropped_hands_its_messages_to_a_member_of_its_node_at_once(
    redis: RedisServer,
) -> None:
    with queue_nodes(redis, **{"queue-redeliver-after": 300.0}) as (a, b):
        tally = Tally()
        victim = Member(a, "victim", tally, window=3, auto_ack=False)
        knows_group(b, a)
        with mm2_publisher(b) as pub:
            for i in range(3):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        a.call(tally.when, 3)
        neighbour = Member(a, "neighbour", tally)  # same node, room for them
        victim.drop()
        a.call(tally.when, 6)  # long before 300 s: as on one node
        assert tally.by_member() == {"victim": 3, "neighbour": 3}
        until_acknowledged(redis, "the neighbour's acks")
        assert a.call(lambda: a.cluster.queues.counters.released) == 0
        neighbour.close()


def test_filters_apply_where_read_and_what_no_member_takes_is_acknowledged(
    redis: RedisServer,
) -> None:
    with queue_nodes(redis) as (a, b):
        tally = Tally()
        high = Member(a, "high", tally, filters=("n>=N10",))
        low = Member(a, "low", tally, filters=("n<N5",))
        knows_group(b, a)
        with mm2_publisher(b) as pub:
            for i in range(15):
                pub.publish(TOPIC, b"m%d" % i, {"n": i})
            pub.publish(TOPIC, b"last", {"n": 99})
            assert pub.wait_acked()
        a.call(tally.when, 11)
        assert sorted(tally.got) == sorted([b"m%d" % i for i in (*range(5), *range(10, 15))]
                                           + [b"last"])
        assert tally.by_member() == {"low": 5, "high": 6}
        # m5..m9 matched nobody on the node that read them: acknowledged unseen, counted
        until_acknowledged(redis)
        assert a.call(lambda: a.cluster.queues.counters.filtered) == 5
        high.close()
        low.close()


def test_a_node_killed_with_kill_9_has_its_members_messages_claimed_after_the_time(
    redis: RedisServer, tmp_path: Path
) -> None:
    with queue_nodes(redis, count=1) as (a,), twistd_broker(
        tmp_path,
        "--listen", "ssmp=tcp:0:interface=127.0.0.1",
        "--listen", "mm2=tcp:0:interface=127.0.0.1",
        "--auth", "open", "--cluster", redis.url, "--cluster-heartbeat", "0.2",
        "--cluster-queue-redeliver-after", str(REDELIVER),
    ) as doomed:  # fmt: skip
        mm2_at = parse_address(doomed.log.wait_for(r"mm2 listening on (tcp:\S+)").group(1))
        tally = Tally()
        victim = Member(a, "victim", tally, window=5, auto_ack=False, address=mm2_at)
        a.until(lambda: a.cluster.view.queues.get(TOPIC, {}).get(GROUP),
                "a to know the doomed node's member")
        with mm2_publisher(a) as pub:
            for i in range(5):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        a.call(tally.when, 5)
        survivor = Member(a, "survivor", tally, window=10)
        assert pending(redis) == 5  # the doomed node renews them: nobody claims them
        killed_at = a.call(a.reactor_seconds)
        doomed.process.kill()  # kill -9: nothing more is renewed
        doomed.process.wait(WAIT)
        a.call(tally.when, 10)
        assert tally.by_member() == {"victim": 5, "survivor": 5}
        waited = min(survivor.arrived.values()) - killed_at
        # the doomed node renewed them a quarter of the time before it died at most, so
        # they come between 3/4 and 1 + 1/4 of queue-redeliver-after (room for a slow box)
        assert REDELIVER / 2 <= waited < 4 * REDELIVER
        until_acknowledged(redis, "the survivor's acks")
        assert a.call(lambda: a.cluster.queues.counters.claimed) == 5
        del victim
        survivor.close()


def test_a_durable_queue_keeps_its_messages_across_a_restart_of_every_node(
    redis: RedisServer,
) -> None:
    durable = {"durable-queues": [GROUP]}
    with queue_nodes(redis, **durable) as (a, b):
        tally = Tally()
        member = Member(a, "member", tally, window=3, auto_ack=False)
        knows_group(b, a)
        with mm2_publisher(b) as pub:
            for i in range(10):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
            a.call(tally.when, 3)  # three taken, never acknowledged
            member.close()
            b.until(lambda: not b.cluster.view.queues, "the member gone")
            for i in range(10, 15):  # no member anywhere: a durable group still takes them
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        assert b.call(lambda: b.cluster.queues.counters.added) == 15
    # every node stopped; a new cluster of nodes (other names) on the same Redis
    assert int(redis.command("XLEN", STREAM)) == 15
    with queue_nodes(redis, **durable) as (c, d):
        # no member yet: the nodes know the group from Redis, and store what is published
        assert c.call(lambda: c.cluster.queues.durables) == {TOPIC: {GROUP}}
        with mm2_publisher(c) as pub:
            for i in range(15, 17):
                pub.publish(TOPIC, b"m%d" % i)
            assert pub.wait_acked()
        assert c.call(lambda: c.cluster.queues.counters.added) == 2
        tally = Tally()
        member = Member(d, "again", tally, window=20)
        d.call(tally.when, 17)  # 14 never taken at once; the 3 taken after the time
        assert sorted(tally.got) == sorted(b"m%d" % i for i in range(17))
        assert tally.duplicates() == {}
        assert d.call(lambda: d.cluster.queues.counters.claimed) == 3
        until_acknowledged(redis)
        member.close()
    assert int(redis.command("EXISTS", STREAM)) == 1  # durable: kept without members


def test_a_group_that_is_not_durable_is_deleted_when_its_last_member_anywhere_leaves(
    redis: RedisServer,
) -> None:
    with queue_nodes(redis, count=3) as (a, b, c):
        tally = Tally()
        one, two = Member(a, "one", tally), Member(b, "two", tally)
        for node in (a, b, c):
            knows_group(node, a, b)
        with mm2_publisher(c) as pub:
            pub.publish(TOPIC, b"hello")
            assert pub.wait_acked()
        a.call(tally.when, 1)
        assert int(redis.command("EXISTS", STREAM)) == 1
        one.close()
        c.until(lambda: a.name not in c.cluster.view.queues.get(TOPIC, {}).get(GROUP, {}),
                "c to see one leave")
        assert int(redis.command("EXISTS", STREAM)) == 1  # two is still a member
        two.close()
        redis.until_gone(STREAM, "the stream deleted")
        with mm2_publisher(c, "late") as pub:  # nobody's group: nothing is stored
            pub.publish(TOPIC, b"nobody")
            assert pub.wait_acked()
        # and c, told so by Redis, adds nothing more to it
        c.until(lambda: c.cluster.queues.targets(TOPIC) == (), "c to forget")
        assert int(redis.command("EXISTS", STREAM)) == 0
        # a node that dies holding the group's last members: nobody keeps the stream any
        # more, it expires (4 x queue-redeliver-after); a node that is only late with its
        # heartbeats is never taken for dead by the stream
        three = Member(b, "three", tally)
        knows_group(a, b)
        assert int(redis.command("EXISTS", STREAM)) == 1
        assert 0 < int(redis.command("PTTL", STREAM)) <= 4000 * REDELIVER
        b.crash()
        redis.until_gone(STREAM, "the stream expired")
        del three

