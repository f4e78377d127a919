"""The admin plugin's own hook, ``msgbroker_collect_metrics``: how other plugins add their
metric families to ``/metrics`` (the journal does; a cluster plugin would report its peers
there)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from msgbroker import Plugins, hookspec

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from msgbroker import Broker


@hookspec
def msgbroker_collect_metrics(broker: Broker) -> Iterable[Metric]:
    """Metric families of a plugin for ``/metrics``, read when Prometheus scrapes.

    Return prometheus-client families (``GaugeMetricFamily``, ``CounterMetricFamily``, ...)
    named ``msgbroker_<plugin>_...``, built from counters the plugin keeps anyway: this is
    called once per scrape, never per message. Return ``()`` when there is nothing to
    report (the plugin is not active on this broker)."""
    return ()


def collect_metrics(plugins: Plugins, broker: Broker) -> list[Metric]:
    """Every plugin's families (``msgbroker_collect_metrics``), in one list."""
    results = plugins.caller("msgbroker_collect_metrics")(broker=broker)
    return [family for result in results if result for family in result]
