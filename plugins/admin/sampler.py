"""Samples a broker's counters every few seconds into rates: per protocol, per topic (the
busiest ones) and per slow consumer. No Twisted: the plugin ticks it on the reactor.

Nothing here runs per message. A sample reads counters that already exist or cost one
integer increment where the broker already does something: the hub's
:class:`~msgbroker.topics.HubStats`, the broker's :class:`~msgbroker.stats.BrokerCounters`,
each session's traffic counters (counted once per input and per written batch) and each
topic's ``published`` count (once per MCAST or per run). The busiest topics are ranked by
how much their ``published`` count moved since the last sample: one pass over the topics
per sample, keeping the ``top`` largest (:func:`heapq.nlargest`), so the metrics and the
dashboard carry a bounded number of topics however many there are. Topics under
:data:`SYS_PREFIX` (what the plugin publishes itself) are never ranked.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.stats import Traffic

#: the topics the admin plugin publishes (``_sys/broker/...``)
SYS_PREFIX = "_sys/"

#: how many slow consumers, and recent slow-consumer disconnects, a sample lists
SLOW_LISTED = 10


@frozen
class TopicRate:
    """One of the busiest topics in a sample."""

    topic: str
    subscribers: int
    #: MCASTs published on it since it exists
    published: int
    #: messages per second over the last interval
    rate: float


@frozen
class Sample:
    """What the broker looked like at ``at`` (its clock), with rates over the interval
    since the previous sample."""

    at: float
    uptime: float
    connections: dict[str, int]
    traffic: dict[str, Traffic]
    #: per protocol: messages_in, frames_out, bytes_in, bytes_out per second
    rates: dict[str, dict[str, float]]
    #: messages delivered per second (every protocol, ``_sys`` messages included)
    delivery_rate: float
    topics: list[TopicRate]
    topic_count: int
    #: the sessions holding the most output now, or that dropped deliveries
    slow: list[dict[str, Any]]
    routed: int
    delivered: int
    dropped: int
    skipped: int
    refused: int
    logins: int
    login_failures: int
    slow_disconnects: int

    def as_json(self) -> dict[str, Any]:
        """The sample as the dashboard's event stream sends it."""
        return {
            "at": self.at,
            "uptime": self.uptime,
            "connections": self.connections,
            "rates": self.rates,
            "delivery_rate": self.delivery_rate,
            "topics": [
                {
                    "topic": t.topic,
                    "subscribers": t.subscribers,
                    "published": t.published,
                    "rate": t.rate,
                }
                for t in self.topics
            ],
            "topic_count": self.topic_count,
            "slow": self.slow,
            "totals": {
                "routed": self.routed,
                "delivered": self.delivered,
                "dropped": self.dropped,
                "skipped": self.skipped,
                "refused": self.refused,
                "logins": self.logins,
                "login_failures": self.login_failures,
                "slow_disconnects": self.slow_disconnects,
            },
        }


class Sampler:
    """Samples ``broker`` (call :meth:`sample` every few seconds); keeps the last
    ``history`` samples for the dashboard."""

    def __init__(self, broker: Broker, top: int = 20, history: int = 120) -> None:
        self.broker = broker
        self.top = top
        self.history: deque[Sample] = deque(maxlen=history)
        #: topic name -> its ``published`` count at the last sample
        self._published: dict[str, int] = {}
        #: topic name -> messages per second over the last interval, every topic
        self.topic_rates: dict[str, float] = {}
        #: recent slow-consumer disconnects, newest last (the plugin's close hook adds them)
        self.slow_closed: deque[dict[str, Any]] = deque(maxlen=SLOW_LISTED)

    @property
    def latest(self) -> Sample | None:
        return self.history[-1] if self.history else None

    def sample(self) -> Sample:
        """Read the counters now; the rates are over the time since the previous sample."""
        broker = self.broker
        now = broker.reactor.seconds()
        previous = self.latest
        elapsed = now - previous.at if previous is not None else 0.0
        connections: dict[str, int] = {}
        for session in broker.sessions:
            connections[session.protocol] = connections.get(session.protocol, 0) + 1
        traffic = broker.traffic()
        rates = {
            name: _rates(t, previous.traffic.get(name) if previous else None, elapsed)
            for name, t in traffic.items()
        }
        stats = broker.hub.stats
        counters = broker.counters
        delivered = stats.delivered - previous.delivered if previous is not None else 0
        sample = Sample(
            at=now,
            uptime=now - broker.started_at,
            connections=connections,
            traffic=traffic,
            rates=rates,
            delivery_rate=delivered / elapsed if elapsed > 0 else 0.0,
            topics=self._busiest(elapsed),
            topic_count=len(broker.hub.topics),
            slow=self._slow(),
            routed=stats.routed,
            delivered=stats.delivered,
            dropped=stats.dropped,
            skipped=stats.skipped,
            refused=stats.refused,
            logins=counters.logins,
            login_failures=counters.login_failures,
            slow_disconnects=counters.closed.get("slow consumer", 0),
        )
        self.history.append(sample)
        return sample

    def _busiest(self, elapsed: float) -> list[TopicRate]:
        before = self._published
        now: dict[str, int] = {}
        rates: dict[str, float] = {}
        moved: list[tuple[int, int, str]] = []
        for name, topic in self.broker.hub.topics.items():
            if name.startswith(SYS_PREFIX):
                continue
            published = topic.published
            now[name] = published
            delta = published - before.get(name, 0)
            rates[name] = delta / elapsed if elapsed > 0 else 0.0
            moved.append((delta, published, name))
        self._published = now
        self.topic_rates = rates
        top = heapq.nlargest(self.top, moved)
        topics = self.broker.hub.topics
        return [
            TopicRate(
                name,
                len(topics[name].members),
                published,
                delta / elapsed if elapsed > 0 else 0.0,
            )
            for delta, published, name in top
        ]

    def _slow(self) -> list[dict[str, Any]]:
        """The sessions holding a backlog now, or that dropped deliveries, worst first."""
        found = []
        for session in self.broker.sessions:
            backlog = session.output.measure() if session.output is not None else 0
            if backlog or session.dropped:
                found.append((backlog, session.dropped, session))
        worst = heapq.nlargest(SLOW_LISTED, found, key=lambda item: (item[0], item[1]))
        return [
            {
                "id": s.id,
                "identity": s.identity,
                "protocol": s.protocol,
                "host": s.host,
                "backlog": backlog,
                "dropped": dropped,
            }
            for backlog, dropped, s in worst
        ]


def _rates(now: Traffic, before: Traffic | None, elapsed: float) -> dict[str, float]:
    names = ("messages_in", "frames_out", "bytes_in", "bytes_out")
    if before is None or elapsed <= 0:
        return dict.fromkeys(names, 0.0)
    # a counter that went down (sessions of a protocol closed between two samples cannot
    # do that: their counts move to the totals of the sessions gone) is shown as 0
    return {
        name: max(0.0, (getattr(now, name) - getattr(before, name)) / elapsed) for name in names
    }
