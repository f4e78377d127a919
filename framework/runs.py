"""Pipelined runs: many MCASTs from one sender to one topic, routed as one.

A publisher that pipelines requests to one topic (SSMP ``MCAST t ...`` lines in one read)
hands the hub a :class:`~msgbroker.message.MessageRun`; when every recipient takes every
message alike, each recipient gets the run's frames in one write and an observer sees the
run once. Split out of :mod:`msgbroker.hub`, whose ``Hub.multicast_run`` calls this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .message import MessageRun, RouteResult
from .topics import Peer, Topic, one_by_one

if TYPE_CHECKING:
    from .hub import Hub


def multicast_run(hub: Hub, sender: Peer | None, run: MessageRun) -> int:
    """Deliver ``run.count`` MCASTs to one topic at once: one frame per recipient.

    Same outcome as ``run.count`` calls of :meth:`multicast`, in order. With an
    observer set, the run observer (when there is one) sees the run once, provided
    every message reaches the same recipients; otherwise it is exactly ``run.count``
    calls of :meth:`multicast`, so the observer sees every message.
    """
    topic = hub.topics.get(run.topic)
    if (
        one_by_one(topic)
        or (hub.patterns and hub.pattern_recipients(run.topic))
        or (
            (hub.observer is not None or hub.run_observer is not None)
            and not _observes_run(hub, topic, run)
        )
    ):
        # message by message: the observer sees each; filters look at each; pattern
        # subscribers (sbus) take one packet per message
        return sum(hub.multicast(sender, m) for m in run.messages())
    hub.source = sender
    stats = hub.stats
    stats.routed += run.count
    if topic is None:
        if hub.run_observer is not None:
            hub.run_observer(run, RouteResult({}))
        return 0
    topic.published += run.count
    run_observer = hub.run_observer
    dropped_before = stats.dropped
    per_protocol: dict[str, int] = {}
    delivered = 0
    for encoder, members in topic.by_encoder.items():
        frame, carried = run.encoded(encoder)
        recipients = 0
        if carried:
            for peer in members:
                if peer is not sender:
                    peer.send(frame)
                    recipients += 1
        else:
            recipients = len(members) - (sender in members)
        if carried < run.count:
            for message in run.messages():
                if message.encoded(encoder) is None:
                    hub._skip(message, members, sender)
        delivered += recipients * carried
        if run_observer is not None and recipients:
            name = next(iter(members)).protocol
            per_protocol[name] = per_protocol.get(name, 0) + recipients
    stats.delivered += delivered
    if run_observer is not None:
        run_observer(run, RouteResult(per_protocol, 0, stats.dropped - dropped_before))
    return delivered


def _observes_run(hub: Hub, topic: Topic | None, run: MessageRun) -> bool:
    """Whether the run observer can report ``run`` as one: there is one, and every
    encoder of the topic carries every message (so all reach the same recipients)."""
    if hub.run_observer is None:
        return False
    if topic is None:
        return True
    return all(run.encoded(encoder)[1] == run.count for encoder in topic.by_encoder)
