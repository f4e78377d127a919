"""The queue store, an optional engine capability: an engine without one (NATS, a third
party's) refuses Micromessage2 queue subscriptions with the "not allowed" ERROR frame,
everything else working; the [cluster] settings of queue groups across nodes."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from msgbroker import Broker, BrokerConfig, ConfigError, hookimpl
from msgbroker.config import build_config
from msgbroker.engine import ClusterSettings, EngineContext, EngineSpec, queue_store
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import ErrorFrame, Handshake, MessageFrame, Subscribe
from msgbroker.testing import connect


class StreamlessEngine:
    """An engine that moves messages but has no queue store (as the NATS engine)."""

    def __init__(self, context: EngineContext) -> None:
        self.context = context

    def start(self) -> None:
        self.context.events.engine_connected()

    def stop(self) -> Deferred[None]:
        return succeed(None)

    def snapshot(self, nodes: Any = None) -> Deferred[dict[str, Any]]:
        return succeed({})

    def status(self) -> dict[str, Any]:
        return {"connected": True, "buffered": 0}

    def listen(self, topic: str) -> None: ...
    def unlisten(self, topic: str) -> None: ...
    def beat(self) -> None: ...
    def flush(self) -> None: ...

    def publish(self, topic: str, data: bytes) -> bool:
        return True

    def send(self, node: str, data: bytes) -> bool:
        return True

    def announce(self, data: bytes, changes: Any) -> bool:
        return True

    def replace_state(self, state: Any) -> bool:
        return True


class StreamlessPlugin:
    @hookimpl
    def msgbroker_register_engines(self, register: Any) -> None:
        register(EngineSpec("streamless", ("streamless",), StreamlessEngine, "no streams"))


def mm2_client(broker: Broker, identity: str) -> Any:
    conn = connect(broker, "mm2")
    hello = Handshake(identity, (), codec.parse_extension_list("pubsub"))
    conn.send(codec.encode_handshake(hello))
    assert isinstance(codec.HandshakeDecoder().feed(conn.received()), Handshake)
    conn.send(codec.encode_handshake(hello))
    return conn


def test_a_queue_subscription_on_an_engine_without_a_queue_store_is_refused() -> None:
    config = BrokerConfig(auth=("open",), sections={"cluster": {"url": "streamless://x"}})
    broker = Broker(config, Clock(), plugins=(StreamlessPlugin(),))
    broker.started()
    assert broker.cluster is not None and broker.cluster.queues is None
    plain, worker = mm2_client(broker, "plain"), mm2_client(broker, "worker")
    plain.send(codec.encode_frame(codec.encode_pubsub(Subscribe("jobs", None, ()))))
    worker.send(codec.encode_frame(codec.encode_pubsub(Subscribe("jobs", "workers", ()))))
    frames = list(codec.FrameDecoder().feed(worker.received()))
    assert len(frames) == 1 and isinstance(frames[0], ErrorFrame)
    assert frames[0].text.startswith("not allowed to subscribe to 'jobs': queue groups")
    assert "need an engine with a queue store (Redis)" in frames[0].text
    assert worker.closed
    # nothing of the refused subscription is left; the plain one works
    topic = broker.hub.topics["jobs"]
    assert list(topic.members) == [s for s in topic.members if s.identity == "plain"]
    assert not topic.queues
    publisher = mm2_client(broker, "publisher")
    publisher.send(codec.encode_frame(MessageFrame(1, "jobs", b"hello")))
    (got,) = codec.FrameDecoder().feed(plain.received())
    assert isinstance(got, MessageFrame) and got.payload == b"hello"


def test_queue_store_finds_an_engines_store_and_nothing_else() -> None:
    class Lying:  # answers everything, as a recording test double would
        def __getattr__(self, name: str) -> Any:
            return lambda *args: True

    assert queue_store(StreamlessEngine) is None
    assert queue_store(Lying()) is None
    assert queue_store(object()) is None

    class RealStore:
        def open(self, key: Any, durable: bool, wake: Any) -> None: ...
        def close(self, key: Any) -> None: ...
        def add(self, key: Any, entries: Any, missing: Any) -> bool: return True
        def read(self, key: Any, count: int) -> Any: ...
        def claim(self, key: Any, count: int) -> Any: ...
        def ack(self, key: Any, ids: Any) -> None: ...
        def touch(self, key: Any, ids: Any) -> None: ...
        def keep(self, key: Any, durable: bool) -> None: ...
        def durables(self) -> Any: ...

    store = RealStore()

    class Engine:
        def queue_store(self) -> Any:
            return store

    assert queue_store(Engine()) is store


def test_the_queue_settings_of_the_cluster_section() -> None:
    config = build_config(
        None,
        {
            "cluster": "redis://h:1",
            "cluster-queue-redeliver-after": 5,
            "cluster-queue-max-length": 1000,
            "cluster-durable-queues": ["billing", "audit"],
        },
        _sections,
    )
    settings = config.section("cluster", ClusterSettings)
    assert (settings.queue_redeliver_after, settings.queue_max_length) == (5.0, 1000)
    assert settings.durable("billing") and not settings.durable("workers")
    assert ClusterSettings(durable_queues=("*",)).durable("anything")
    assert not ClusterSettings().durable("anything")
    assert ClusterSettings().queue_redeliver_after == 30.0
    with pytest.raises(ConfigError, match="queue-redeliver-after"):
        ClusterSettings(queue_redeliver_after=0)
    with pytest.raises(ConfigError, match="queue-max-length"):
        ClusterSettings(queue_max_length=0)


def _sections(plugins: Any, blocked: Any) -> Any:
    return Broker(BrokerConfig(), Clock()).plugins.config_sections()
