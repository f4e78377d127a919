"""The NATS engine's own malformed input (state requests without a reply subject, state
replies that are no state) is counted in the cluster's /metrics like every other skipped
input (``msgbroker_cluster_skipped_total``), on a real nats-server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.plugins.admin.hookspecs import collect_metrics
from msgbroker.plugins.nats import codec
from tests.cluster.nats_support import RawNats
from tests.cluster.nodes import Node, cluster_nodes
from tests.cluster.servers import NatsServer


@pytest.fixture
def nodes(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[Node]]:
    with cluster_nodes(nats_server.url, count=2) as nodes:
        yield nodes


def read_skipped(node: Node) -> float:
    """msgbroker_cluster_skipped (in the reactor thread)."""
    for family in collect_metrics(node.broker.plugins, node.broker):
        if family.name == "msgbroker_cluster_skipped":
            return float(family.samples[0].value)
    raise AssertionError("no msgbroker_cluster_skipped family")


def skipped_total(node: Node) -> float:
    return float(node.call(read_skipped, node))


def test_malformed_state_requests_and_replies_are_in_the_metrics(
    nodes: list[Node], nats_server: NatsServer
) -> None:
    _, b = nodes
    assert skipped_total(b) == 0
    node = codec.topic_token(b.name)
    with RawNats(nats_server) as raw:
        raw.pub(b"msgbroker.q", b"no reply subject")  # a state request nobody can answer
        raw.pub(b"msgbroker.r." + node + b".1", b"not a state part")
        raw.sync()
    b.until(lambda: read_skipped(b) == 2, "b to count both in its metrics")
    assert b.call(lambda: b.cluster.engine.status()["skipped"]) == 2  # the engine's own too
