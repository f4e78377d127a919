"""Stage 5 of bench/cluster.py: aggregate fan-out with the clients spread over the nodes,
as a deployment behind a load balancer has them: each client lands on a node whatever its
topics, so every node has publishers and subscribers, and each topic's subscribers are on
both nodes.

``publishers`` SSMP publishers (one forked process, ``senders.MultiPublisher``); publisher
``p`` sends ``messages`` 64-byte MCASTs rotating over its own ``topics_each`` topics
(``benchP00``...), so no two consecutive messages share a topic; subscriber ``s`` hears
publisher ``s % publishers`` (subscribed to its topics), so each publisher's messages go to
``subscribers / publishers`` subscribers. Publisher ``p`` is on node ``p % nodes``,
subscriber ``s`` on node ``(s // publishers) % nodes``: each node holds half the
publishers and half of each publisher's subscribers. Each subscriber's stream is one
publisher's, in its order: the kept streams are compared byte for byte, the others' last
frame. Figure: deliveries/s in all, from the publishers' start to the last subscriber's
last byte.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import scenarios
from clients import (
    BenchError,
    _first_difference,
    close_all,
    open_spread,
    receive_counts,
)
from senders import MultiPublisher
from wire import SSMP, payload


def spread_fanout(
    group, params: scenarios.Params, *, publishers: int, subscribers: int, topics_each: int,
    messages: int, node_names: list[str], ready: Callable[[], object] | None = None,
    own: bool = False,
) -> dict:
    """``own``: each subscriber on its publisher's node instead (a deployment that places
    clients by topic: nothing crosses; the most two nodes can do)."""
    if publishers > 10 or topics_each > 100:
        raise BenchError("at most 10 publishers and 100 topics each (names of one width)")
    proto = SSMP()
    size = params.payload_size
    senders = [f"pub{p}" for p in range(publishers)]
    topics = [[f"bench{p}{t:02d}" for t in range(topics_each)] for p in range(publishers)]
    streams = [
        b"".join(proto.delivered(senders[p], topics[p][i % topics_each], payload(i, size))
                 for i in range(messages))
        for p in range(publishers)
    ]
    datas = [
        b"".join(proto.publish(topics[p][i % topics_each], payload(i, size))
                 for i in range(messages))
        for p in range(publishers)
    ]
    frame_len = len(streams[0]) // messages
    last_frames = [streams[s % publishers][-frame_len:] for s in range(subscribers)]

    def node_port(index: int) -> int:
        return group.nodes[node_names[index % len(node_names)]].port

    keep = min(subscribers, params.verify_streams) if params.verify else 0

    def check(index: int, data: bytearray) -> str | None:
        want = streams[index % publishers]
        return None if data == want else _first_difference(data, want)

    socks: list[socket.socket] = []
    pub_socks: list[socket.socket] = []
    try:
        socks = open_spread(
            [node_port(s % publishers if own else s // publishers)
             for s in range(subscribers)],
            [proto.subscriber_setup(f"sub{s:03d}", *topics[s % publishers])
             for s in range(subscribers)], timeout=60.0)
        pub_socks = open_spread([node_port(p) for p in range(publishers)],
                                [proto.publisher_setup(sender) for sender in senders])
        for sock in (*socks, *pub_socks):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ready is not None:
            ready()
        measure = scenarios.Measurement(group)
        deadline = time.monotonic() + params.scenario_timeout
        publisher = MultiPublisher(pub_socks, datas,
                                   [messages * len(proto.publish_reply)] * publishers,
                                   params.scenario_timeout)
        pub_socks = []  # the child has them (and closed ours)
        try:
            got = receive_counts(
                socks, messages * frame_len, last_frame=None, last_frames=last_frames,
                idle_timeout=params.idle_timeout, deadline=deadline, verify_streams=keep,
                check_stream=check if keep else None, on_first=measure.first_byte,
            )
            measure.last_byte()
        finally:
            pub = publisher.finish()
        result = measure.figures(
            got, messages=messages, subscribers=subscribers, frame_len=frame_len, pub=pub,
            verified=(f"every byte of {keep} streams, the last frame of the others" if keep
                      else "last frames"))
        result.update(publishers=publishers, topics=publishers * topics_each,
                      layout="own" if own else "split")
        if pub.get("error"):
            raise BenchError(f"publishers: {pub['error']}")
        return result
    finally:
        close_all(socks)
        close_all(pub_socks)
