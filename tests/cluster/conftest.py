"""The real engine servers' fixtures (tests/cluster/servers.py) for every cluster test."""

import pytest

from tests.cluster.servers import RedisServer, nats_server, redis_server  # noqa: F401 - fixtures


@pytest.fixture
def redis(redis_server: RedisServer) -> RedisServer:  # noqa: F811 - the fixture, by argument
    """``redis_server`` under the short name the Redis fault and queue tests use."""
    return redis_server
