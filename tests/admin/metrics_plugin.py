"""A plugin adding a metric family to ``/metrics`` (``--plugin tests.admin.metrics_plugin``)."""

from prometheus_client.core import GaugeMetricFamily

from msgbroker import hookimpl


@hookimpl
def msgbroker_collect_metrics(broker):
    return [
        GaugeMetricFamily(
            "msgbroker_example_sessions_plus_41", "A plugin's own family.",
            value=len(broker.sessions) + 41,
        )
    ]
