"""The real engine servers' fixtures (tests/cluster/servers.py) for every cluster test."""

from tests.cluster.servers import nats_server, redis_server  # noqa: F401 - pytest fixtures
