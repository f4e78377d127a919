"""Faults on a real nats-server: a node killed with kill -9 is seen gone within two
heartbeats (presence events, identities freed), from heartbeats on a subject, not an
expiring key; nats-server restarted: every node keeps serving its own clients, reconnects,
restores its subscriptions and identities (by asking the others), counts what could not
cross; a paused nats-server never stalls local delivery.

The kill -9 test is test_redis_faults.py's, run here on NATS (it takes the ``engine``
fixture: tests/cluster/servers.py's ``EngineServer``); the others are written against
``EngineServer`` too (kill, stop, start, pause)."""

from __future__ import annotations

import socket

import pytest

from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from tests.cluster.nodes import Node, cluster_nodes, log_lines
from tests.cluster.servers import EngineServer, NatsServer
from tests.cluster.test_redis_faults import (  # noqa: F401 - collected here too, on NATS
    test_a_node_killed_with_kill_9_is_gone_within_the_timeout,
)
from tests.ssmp.e2e_support import WAIT

HEARTBEAT = 0.5


@pytest.fixture
def engine(nats_server: NatsServer) -> EngineServer:
    return nats_server


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def test_the_server_restarted_every_node_serves_reconnects_and_restores(
    engine: NatsServer,
) -> None:
    with cluster_nodes(engine.url, count=2, cluster={"heartbeat": HEARTBEAT}) as (a, b):
        with ssmp(a, "pub") as pub, ssmp(a, "local") as local, ssmp(b, "remote") as remote:
            local.subscribe("t")
            remote.subscribe("t")
            a.until_interested("t")
            engine.kill()  # gone without a word
            a.until_connected(False)
            b.until_connected(False)
            pub.mcast("t", b"during the outage")
            assert local.next_event(timeout=WAIT).payload == b"during the outage"
            assert a.call(lambda: a.cluster.counters.dropped) == 1
            remote.ucast("local", b"ucast held nowhere")  # b still knows where local is
            assert b.call(lambda: b.cluster.counters.dropped) == 1
            assert a.sees(b) and b.sees(a)  # nobody timed out while nobody was heard
            remote.subscribe("t2")  # changes nobody can hear now: told after the restart
            late = ssmp(b, "late")
            engine.start()  # on the same port, knowing nothing: the nodes tell each other
            for node in (a, b):
                node.until(lambda n=node: n.cluster.counters.connects == 2,
                           f"{node.name} to reconnect")
                node.synced()
            a.until_interested("t2", what="a to restore b's interest")
            a.until_holds("late")
            b.until_holds("local")
            pub.mcast("t", b"after the restart")
            assert remote.next_event(timeout=WAIT).payload == b"after the restart"
            assert local.next_event(timeout=WAIT).payload == b"after the restart"
            remote.ucast("local", b"ucast again")
            assert local.next_event(timeout=WAIT).payload == b"ucast again"
            pub.mcast("t2", b"to what was subscribed meanwhile")
            assert remote.next_event(timeout=WAIT).payload == b"to what was subscribed meanwhile"
            pub.ucast("late", b"to who logged in meanwhile")
            assert late.next_event(timeout=WAIT).payload == b"to who logged in meanwhile"
            late.close()


def test_a_paused_server_never_stalls_local_delivery(engine: NatsServer) -> None:
    with log_lines() as lines, cluster_nodes(
        engine.url, count=2, cluster={"heartbeat": 30.0, "max-buffer": 64 << 10}
    ) as (a, b):
        with ssmp(a, "local") as local, ssmp(b, "remote") as remote:
            local.subscribe("bulk")
            remote.subscribe("bulk")
            a.until_interested("bulk")
            engine.pause()
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
                                   "a to drop what NATS does not take")
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
                engine.resume()
            remote.ping()  # b stayed up all along
            # once the server reads again, what was held goes: crossing works again
            with ssmp(a, "pub2") as pub:
                pub.mcast("bulk", b"resumed")
                while (event := remote.next_event(timeout=WAIT)).payload != b"resumed":
                    pass


def test_a_server_that_stops_answering_is_left_and_connected_to_again(
    engine: NatsServer,
) -> None:
    """No FIN comes from a server that hangs (or a cut network): an unanswered PING for
    max(3 heartbeats, connect-timeout) makes the node connect again."""
    settings = {"heartbeat": 0.2, "connect-timeout": 1.0}
    with log_lines() as lines, cluster_nodes(engine.url, count=2, cluster=settings) as (a, b):
        with ssmp(a, "pub") as pub, ssmp(b, "sub") as sub:
            sub.subscribe("t")
            a.until_interested("t")
            engine.pause()
            try:
                lines.wait_for("has not answered a PING", "the silence to be noticed")
                a.until_connected(False)
            finally:
                engine.resume()
            for node in (a, b):
                node.until_connected()
                node.synced()
            a.until_interested("t", what="a to know b's interest again")
            pub.mcast("t", b"after the silence")
            assert sub.next_event(timeout=WAIT).payload == b"after the silence"
            assert a.call(lambda: a.cluster.counters.connects) >= 2
