"""``/metrics``: the broker's counters in the Prometheus text format.

A custom collector (:class:`BrokerCollector`) reads the counters when Prometheus scrapes,
so nothing calls prometheus-client per message: the families are built from the hub's,
the broker's and the sessions' plain counters at scrape time, the busiest topics come from
the sampler's latest sample (see :mod:`.sampler`), and every plugin implementing
``msgbroker_collect_metrics`` adds its own families (the journal does).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from . import hookspecs

if TYPE_CHECKING:
    from msgbroker.broker import Broker

    from .sampler import Sampler
    from .systopics import SysPublisher

__all__ = ["CONTENT_TYPE_LATEST", "BrokerCollector", "registry_for"]


class BrokerCollector(Collector):
    """The broker's metric families, read at scrape time."""

    def __init__(
        self, broker: Broker, sampler: Sampler, sys: SysPublisher, version: str
    ) -> None:
        self.broker = broker
        self.sampler = sampler
        self.sys = sys
        self.version = version

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        stats = broker.hub.stats
        counters = broker.counters
        info = GaugeMetricFamily(
            "msgbroker_info",
            "The broker's version and node name (the value is 1).",
            labels=["version", "node"],
        )
        info.add_metric([self.version, broker.node_name], 1)
        yield info
        yield GaugeMetricFamily(
            "msgbroker_uptime_seconds",
            "Seconds since the broker started.",
            value=broker.reactor.seconds() - broker.started_at,
        )
        open_now = GaugeMetricFamily(
            "msgbroker_connections", "Open connections, by protocol.", labels=["protocol"]
        )
        by_protocol: dict[str, int] = dict.fromkeys(broker.protocols, 0)
        for session in broker.sessions:
            by_protocol[session.protocol] = by_protocol.get(session.protocol, 0) + 1
        for name, count in sorted(by_protocol.items()):
            open_now.add_metric([name], count)
        yield open_now
        traffic = broker.traffic()
        families = {
            "connections": ("msgbroker_connections_opened", "Connections opened, by protocol."),
            "messages_in": (
                "msgbroker_messages_received",
                "Messages clients published (MCAST, UCAST, BCAST), by their protocol.",
            ),
            "frames_out": (
                "msgbroker_frames_sent",
                "Frames delivered to clients, by their protocol (one per delivery, but a "
                "pipelined run reaches a recipient as one frame; see msgbroker_deliveries).",
            ),
            "bytes_in": (
                "msgbroker_bytes_received",
                "Bytes read from clients, by protocol (not counted for sbus).",
            ),
            "bytes_out": (
                "msgbroker_bytes_sent",
                "Bytes written to clients, by protocol (not counted for sbus).",
            ),
        }
        for attribute, (name, text) in families.items():
            family = CounterMetricFamily(name, text, labels=["protocol"])
            for protocol in sorted(set(traffic) | set(broker.protocols)):
                moved = traffic.get(protocol)
                family.add_metric([protocol], getattr(moved, attribute) if moved else 0)
            yield family
        for name, text, value in (
            (
                "msgbroker_routed",
                "Messages routed (each message of a run counts; _sys ones too).",
                stats.routed,
            ),
            (
                "msgbroker_sys_messages",
                "Messages the broker published on its _sys topics.",
                self.sys.published,
            ),
            (
                "msgbroker_deliveries",
                "Messages delivered to recipients (each message of a run counts).",
                stats.delivered,
            ),
            ("msgbroker_dropped", "Deliveries a slow-consumer policy dropped.", stats.dropped),
            (
                "msgbroker_skipped",
                "Recipients skipped: their protocol cannot carry the message.",
                stats.skipped,
            ),
            ("msgbroker_refused", "Requests a configured limit refused.", stats.refused),
            ("msgbroker_logins", "Logins accepted.", counters.logins),
            ("msgbroker_login_failures", "Logins refused.", counters.login_failures),
            (
                "msgbroker_slow_consumer_disconnects",
                "Connections closed because they did not read their output.",
                counters.closed.get("slow consumer", 0),
            ),
        ):
            yield CounterMetricFamily(name, text, value=value)
        closed = CounterMetricFamily(
            "msgbroker_connections_closed", "Connections closed, by reason.", labels=["reason"]
        )
        for reason, count in sorted(counters.closed.items()):
            closed.add_metric([reason], count)
        yield closed
        yield GaugeMetricFamily(
            "msgbroker_topics", "Topics with subscribers.", value=len(broker.hub.topics)
        )
        yield GaugeMetricFamily(
            "msgbroker_identities", "Identities logged in.", value=len(broker.hub.identities)
        )
        budget = broker.output_budget
        yield GaugeMetricFamily(
            "msgbroker_output_backlog_bytes",
            "Bytes held for clients that do not read (all slow consumers together).",
            value=budget.total,
        )
        yield GaugeMetricFamily(
            "msgbroker_slow_consumers",
            "Connections holding an output backlog now.",
            value=len(budget.members),
        )
        yield from self._topics()
        yield from hookspecs.collect_metrics(broker.plugins, broker)

    def _topics(self) -> Iterator[Metric]:
        sample = self.sampler.latest
        topics = sample.topics if sample is not None else []
        published = CounterMetricFamily(
            "msgbroker_topic_messages",
            "MCASTs published on each of the busiest topics (see msgbroker_topic_rank_size).",
            labels=["topic"],
        )
        rate = GaugeMetricFamily(
            "msgbroker_topic_messages_per_second",
            "Messages per second on each of the busiest topics over the last sample.",
            labels=["topic"],
        )
        subscribers = GaugeMetricFamily(
            "msgbroker_topic_subscribers",
            "Subscribers of each of the busiest topics.",
            labels=["topic"],
        )
        for topic in topics:
            published.add_metric([topic.topic], topic.published)
            rate.add_metric([topic.topic], topic.rate)
            subscribers.add_metric([topic.topic], topic.subscribers)
        yield published
        yield rate
        yield subscribers
        yield GaugeMetricFamily(
            "msgbroker_topic_rank_size",
            "How many of the busiest topics the msgbroker_topic_* families carry at most.",
            value=self.sampler.top,
        )


def registry_for(collector: BrokerCollector) -> CollectorRegistry:
    """A registry of its own (not prometheus-client's global one) with the broker's
    collector and the process's (CPU, memory, file descriptors)."""
    from prometheus_client.process_collector import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(namespace="msgbroker", registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format of everything ``registry`` collects now."""
    return generate_latest(registry)
