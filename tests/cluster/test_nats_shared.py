"""The cluster tests written on Redis, run again on a real nats-server: the same test
functions (imported, not copied), with ``nodes`` on NATS. What only one engine has (its
server's faults, its password) is in test_nats_*.py and test_redis_*.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import LISTENERS, Node, cluster_nodes
from tests.cluster.servers import NatsServer
from tests.cluster.test_redis_basics import (  # noqa: F401 - collected here too, on NATS
    test_a_node_that_stops_says_bye_and_is_gone_at_once,
    test_mcast_crosses_to_the_nodes_with_subscribers_only,
    test_metrics_say_what_crossed,
    test_ucast_to_an_identity_on_another_node_and_404_when_nobody_holds_it,
)
from tests.cluster.test_redis_crossing import (  # noqa: F401 - collected here too, on NATS
    test_a_login_on_another_node_kicks_the_holder,
    test_a_pipelined_run_crosses_as_one_publication,
    test_bcast_reaches_every_node_sharing_a_topic_once,
    test_every_protocol_to_every_protocol_with_filters_on_the_receiving_node,
    test_order_is_kept_across_topics_and_kinds_within_one_chunk,
    test_presence_snapshot_and_events_across_nodes,
    test_sbus_patterns_receive_across_nodes_and_secret_topics_stay_home,
)


@pytest.fixture
def nodes(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[Node]]:
    """Three nodes on one nats-server, each with an sbus listener too."""

    def listeners(index: int) -> tuple[str, ...]:
        return (*LISTENERS, f"sbus=unix:{tmp_path}/bus{index}")

    with cluster_nodes(nats_server.url, listeners=listeners) as nodes:
        yield nodes
