"""Faults on a real redis-server: a node killed with kill -9 is seen gone (presence events,
identities freed) within the configured time; Redis restarted: every node keeps serving
its own clients, reconnects, restores its subscriptions and identities, counts what could
not cross; a Redis that stops reading never stalls local delivery. The kill -9 test takes
``engine``: it runs on NATS too (test_nats_faults.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from msgbroker.plugins.ssmp.client import BlockingSSMPClient, SSMPError
from tests.cluster.nodes import Node, cluster_nodes, log_lines
from tests.cluster.servers import EngineServer, RedisServer
from tests.ssmp.e2e_support import WAIT, twistd_broker

HEARTBEAT = 0.5


@pytest.fixture
def engine(redis: RedisServer) -> EngineServer:
    """The engine of the tests written for both (test_nats_faults.py runs them on NATS)."""
    return redis


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def test_a_node_killed_with_kill_9_is_gone_within_the_timeout(
    engine: EngineServer, tmp_path: Path
) -> None:
    url = engine.url
    with cluster_nodes(url, count=2, cluster={"heartbeat": HEARTBEAT}) as (a, b):
        with twistd_broker(
            tmp_path, "--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open",
            "--cluster", url, "--cluster-heartbeat", str(HEARTBEAT),
        ) as doomed:
            doomed.log.wait_for(r"cluster: node \S+ connected")
            with ssmp(a, "watcher") as watcher, BlockingSSMPClient(
                doomed.host, doomed.port, "victim"
            ) as victim:
                watcher.subscribe("room", presence=True)
                victim.subscribe("room")
                event = watcher.next_event(timeout=WAIT)
                assert (event.sender, event.subscribed) == ("victim", True)
                b.until_holds("victim")
                killed_at = a.call(a.reactor_seconds)
                doomed.process.kill()  # kill -9: no bye, no more heartbeats
                doomed.process.wait(WAIT)
                event = watcher.next_event(timeout=WAIT)
                seen_at = a.call(a.reactor_seconds)
                assert (event.sender, event.topic, event.subscribed) == ("victim", "room", False)
                # seen gone within the timeout (1.5 heartbeats) and a check's quarter beat,
                # under 2 heartbeats; the bound here leaves room for a loaded machine
                assert seen_at - killed_at < 4 * HEARTBEAT
                b.until_free("victim")
                with ssmp(b, "asker") as asker, pytest.raises(SSMPError) as refused:
                    asker.ucast("victim", b"anyone?")
                assert refused.value.code == 404
                assert a.call(lambda: a.cluster.counters.nodes_gone) == 1


def test_redis_restarted_every_node_serves_reconnects_and_restores(
    redis: RedisServer,
) -> None:
    with cluster_nodes(redis.url, count=2, cluster={"heartbeat": HEARTBEAT}) as (a, b):
        with ssmp(a, "pub") as pub, ssmp(a, "local") as local, ssmp(b, "remote") as remote:
            local.subscribe("t")
            remote.subscribe("t")
            a.until_interested("t")
            redis.stop()
            a.until_connected(False)
            pub.mcast("t", b"during the outage")
            assert local.next_event(timeout=WAIT).payload == b"during the outage"
            assert a.call(lambda: a.cluster.counters.dropped) >= 1
            remote.ucast("local", b"ucast held nowhere")  # b still knows where local is
            redis.start()  # empty: every node stores its state again
            for node in (a, b):
                node.synced()
            a.until_interested("t", what="a to restore b's interest")
            b.until_holds("local")
            pub.mcast("t", b"after the restart")
            assert remote.next_event(timeout=WAIT).payload == b"after the restart"
            assert local.next_event(timeout=WAIT).payload == b"after the restart"
            remote.ucast("local", b"ucast again")
            assert local.next_event(timeout=WAIT).payload == b"ucast again"
            assert a.call(lambda: a.cluster.counters.connects) == 2


def test_a_redis_that_stops_reading_never_stalls_local_delivery(redis: RedisServer) -> None:
    with log_lines() as lines, cluster_nodes(
        redis.url, count=2, cluster={"heartbeat": 30.0, "max-buffer": 64 << 10}
    ) as (a, b):
        with ssmp(a, "local") as local, ssmp(b, "remote") as remote:
            local.subscribe("bulk")
            remote.subscribe("bulk")
            a.until_interested("bulk")
            redis.pause()
            try:
                payload = b"x" * 1000
                host, port = a.address("ssmp")
                with socket.create_connection((host, port), timeout=WAIT) as raw:
                    raw.sendall(b"LOGIN pub open\n")
                    assert raw.recv(16) == b"200\n"
                    for _ in range(40):  # 40 x 250 x 1 KB: far more than the buffers hold
                        raw.sendall(b"MCAST bulk %s\n" % payload * 250)
                    raw.sendall(b"MCAST bulk last\n")
                    # a says so (once: the line is rate-limited) when it first drops
                    lines.wait_for("cluster: messages could not cross",
                                   "a to drop what Redis does not take")
                    assert a.call(lambda: a.cluster.counters.dropped) > 0
                    received = 0
                    while True:  # every message reaches the local subscriber meanwhile
                        event = local.next_event(timeout=WAIT)
                        received += 1
                        if event.payload == b"last":
                            break
                    assert received == 40 * 250 + 1
                    status = a.call(lambda: dict(a.cluster.engine.status()))
                    assert status["buffered"] <= (64 << 10) + (256 << 10)
            finally:
                redis.resume()
            remote.ping()  # b stayed up all along
