"""A node's answer to "what is your state?" against the announcements it makes after it,
on real nats-server processes.

A node that connects (or connects again) asks every node for its state and takes the
answers that come within a heartbeat. An answer may come at once and the request end a
heartbeat later: what the answering node announced in between (a subscriber it gained)
must survive the answer, or the asking node routes as if the subscriber were not there,
for good (found by bench/cluster.py's "spread" stage: one node's messages to the other's
subscribers stopped mid-run and never resumed). The tests make the window wide (a 3 s
heartbeat), see the answer cross (a spy on the reply subjects), then subscribe.
"""

from __future__ import annotations

from msgbroker.plugins.nats import codec, statewire
from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from tests.cluster.nats_support import RawNats
from tests.cluster.nodes import LISTENERS, Node, cluster_nodes
from tests.cluster.servers import NatsServer
from tests.ssmp.e2e_support import WAIT, reactor_thread

#: the request for every node's state stays open min(heartbeat, connect-timeout) = 3 s
WIDE = {"heartbeat": 3.0}


def ssmp(node: Node, identity: str) -> BlockingSSMPClient:
    host, port = node.address("ssmp")
    return BlockingSSMPClient(host, port, identity)


def answer_from(spy: RawNats, node: Node) -> None:
    """Until the spy sees ``node`` answer a state request (its answer has left it)."""
    while statewire.read_part(spy.next_msg().payload)[0] != node.name:
        pass


def subscribe_within_the_window(a: Node, b: Node, sub: BlockingSSMPClient) -> None:
    """``sub`` (on a) subscribes after a answered b's request and b hears of it while the
    request is still open; then b's request ends."""
    sub.subscribe("news")
    a_node = b.call(lambda: b.cluster.view.nodes.get(a.name))
    # the announcement reached b (applied, or held until the answers are in)
    b.until(lambda: b.cluster.interested("news") or (
        b.cluster.view.nodes.get(a.name) is a_node and a_node is not None and a_node.waiting
    ), "b to hear of a's subscriber")
    assert b.call(lambda: b.cluster._snapshotting), "b's request ended too early to tell"
    b.synced()


def crosses(a: Node, b: Node, sub: BlockingSSMPClient) -> None:
    assert b.interested("news"), "b forgot a's subscriber"
    with ssmp(b, "pub") as pub:
        pub.mcast("news", b"still routed")
        event = sub.next_event(timeout=WAIT)
        assert event is not None and event.payload == b"still routed"


def test_an_answer_older_than_a_new_nodes_announcements_never_undoes_them(
    nats_server: NatsServer,
) -> None:
    thread = reactor_thread()
    url = nats_server.url
    a = Node(thread, url, LISTENERS, dict(WIDE), {})
    b: Node | None = None
    try:
        a.until_connected()
        with RawNats(nats_server) as spy, ssmp(a, "sub") as sub:
            # b's answers (to its first request) come on msgbroker.r.B.*; b's name is
            # its listening address, known once it runs: spy on every node's replies
            spy.sub(b"msgbroker.r.>")
            b = Node(thread, url, LISTENERS, dict(WIDE), {})
            answer_from(spy, a)  # a has answered b's request (a's own ask got no answer)
            subscribe_within_the_window(a, b, sub)
            crosses(a, b, sub)
    finally:
        if b is not None:
            b.stop()
        a.stop()


def test_an_answer_older_than_a_known_nodes_announcements_never_undoes_them(
    nats_server: NatsServer,
) -> None:
    with (
        cluster_nodes(nats_server.url, count=2, listeners=LISTENERS, cluster=WIDE) as (a, b),
        RawNats(nats_server) as spy,
        ssmp(a, "sub") as sub,
    ):
        spy.sub(b"msgbroker.r." + codec.topic_token(b.name) + b".*")

        def cut() -> None:  # b's connection to NATS, read in the reactor thread
            b.cluster.engine.conn.transport.abortConnection()

        b.call(cut)
        b.until(lambda: b.cluster.counters.connects >= 2, "b to connect again")
        answer_from(spy, a)  # a has answered b's new request
        subscribe_within_the_window(a, b, sub)
        crosses(a, b, sub)
