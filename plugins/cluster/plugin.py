"""The ``[cluster]`` section (``--cluster URL`` and the engine's settings), the built-in
``memory`` engine (one node: no cluster, nothing more per message), and the cluster's
figures for ``/metrics``.

::

    [cluster]
    url = "redis://10.0.0.5:6379/0"   # --cluster URL; none: the memory engine (one node)
    heartbeat = 1.0                    # --cluster-heartbeat
    node-timeout = 0                   # --cluster-node-timeout (0: 1.5 heartbeats)
    password-file = "/etc/msgbroker/redis-password"
    queue-redeliver-after = 30         # MM2 queue groups across nodes (Redis streams)
    durable-queues = ["billing"]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import ConfigSection, Option, hookimpl
from msgbroker.engine import ClusterSettings, EngineContext, EngineSpec

if TYPE_CHECKING:
    from msgbroker import Broker

SECTION = ConfigSection(
    "cluster",
    ClusterSettings,
    options=(
        Option(
            "url",
            "str",
            "Join the cluster at this engine URL: redis://HOST:PORT[/DB], rediss:// (TLS), "
            "nats://HOST:PORT, tls:// (TLS).",
            flag="cluster",
        ),
        Option("heartbeat", "float", "Seconds between a node's heartbeats [1]."),
        Option("node-timeout", "float", "Seconds without heartbeat before a node is gone [1.5x]."),
        Option("connect-timeout", "float", "Seconds a connection to the engine may take [5]."),
        Option("max-buffer", "size", "Bytes held for a slow engine before dropping [16M]."),
        Option("prefix", "str", "Prefix of the engine's channels and keys [msgbroker]."),
        Option("password", "str", "The engine's password (better: password-file)."),
        Option("password-file", "str", "File whose first line is the engine's password."),
        Option("tls-ca", "str", "CA certificate(s) (PEM) the engine's certificate must chain to."),
        Option("tls-cert", "str", "Client certificate (PEM) for the engine, if it asks."),
        Option("tls-key", "str", "Client private key (PEM) for the engine."),
        Option(
            "queue-redeliver-after",
            "float",
            "Seconds before a queue message a member or node took unacked goes to another [30].",
        ),
        Option("queue-max-length", "count", "Messages a queue group's stream holds [100000]."),
        Option(
            "durable-queues",
            "list",
            "Queue groups (names; * for all) whose messages outlive members and nodes.",
        ),
    ),
    help="join a cluster of brokers (docs/cluster.md)",
)


def _no_engine(context: EngineContext) -> None:
    """The memory engine: this broker is the only node."""
    return None


MEMORY = EngineSpec("memory", ("memory",), _no_engine, "one node, no cluster (the default)")


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)


@hookimpl
def msgbroker_register_engines(register: Callable[[EngineSpec], None]) -> None:
    register(MEMORY)


@hookimpl(optionalhook=True)  # the admin plugin's hook: it may be blocked
def msgbroker_collect_metrics(broker: Broker) -> list[Any]:
    """The cluster's state for ``/metrics``: connected, nodes seen, what crossed."""
    cluster = broker.cluster
    if cluster is None:
        return []
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    counters = cluster.counters
    families: list[Any] = [
        GaugeMetricFamily(
            "msgbroker_cluster_connected",
            "1 while the node is connected to its cluster engine.",
            value=int(cluster.connected),
        ),
        GaugeMetricFamily(
            "msgbroker_cluster_nodes", "Other nodes this node sees.", value=len(cluster.view.nodes)
        ),
    ]
    for name, help_text in (
        ("messages_out", "Messages this node sent to other nodes."),
        ("messages_in", "Messages this node received from other nodes."),
        (
            "publications_out",
            "Engine publications written (one per chunk, or one per node when its routes differ).",
        ),
        ("publications_in", "Engine publications received."),
        ("bytes_out", "Bytes of publications written."),
        ("bytes_in", "Bytes of publications received."),
        ("dropped", "Messages that could not cross (engine away or its buffer full)."),
        (
            "skipped",
            "Malformed or foreign input skipped (publications, the engine's state requests "
            "and replies), and UCASTs whose target left.",
        ),
        ("nodes_gone", "Nodes seen gone (no heartbeat, or left)."),
        ("connects", "Connections made to the engine."),
    ):
        families.append(
            CounterMetricFamily(
                f"msgbroker_cluster_{name}", help_text, value=getattr(counters, name)
            )
        )
    queues = cluster.queues
    if queues is not None:
        families += _queue_families(queues)
    return families


def _queue_families(queues: Any) -> list[Any]:
    """MM2 queue groups across nodes: what this node stored, took, acknowledged."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    figures = queues.metrics()
    families: list[Any] = [
        GaugeMetricFamily(
            "msgbroker_cluster_queue_groups",
            "Queue groups with members on this node.",
            value=figures["groups"],
        ),
        GaugeMetricFamily(
            "msgbroker_cluster_queue_held",
            "Queue messages this node holds for its members (sent unacknowledged, or waiting).",
            value=figures["held"],
        ),
    ]
    for name, help_text in (
        ("added", "Queue messages this node added to a group's stream."),
        ("local", "Queue messages shared by local members while the engine was away."),
        ("dropped", "Queue messages that could not be stored (engine away or buffer full)."),
        ("taken", "Queue messages read from a group's stream for local members."),
        ("claimed", "Queue messages taken over after queue-redeliver-after."),
        ("acked", "Queue messages local members acknowledged."),
        ("filtered", "Queue messages no local member's filters matched (acknowledged unseen)."),
        ("released", "Queue messages given back (no local member left to take them)."),
        ("skipped", "Malformed queue entries skipped."),
    ):
        families.append(
            CounterMetricFamily(f"msgbroker_cluster_queue_{name}", help_text, value=figures[name])
        )
    return families
