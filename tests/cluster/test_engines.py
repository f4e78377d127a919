"""The engine interface: engines register through a hook, --cluster picks one by its URL
scheme, the memory engine adds nothing to routing."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock

from msgbroker import Broker, BrokerConfig, ConfigError, hookimpl
from msgbroker.config import build_config
from msgbroker.engine import ClusterSettings, EngineContext, EngineSpec, redact_url, url_scheme
from msgbroker.testing import make_broker


class _Recorder:
    """A third party's engine: records what it is asked to do."""

    def __init__(self, context: EngineContext) -> None:
        self.context = context
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> Any:
            self.calls.append((name, *args))
            return True

        return record


class _Plugin:
    built: list[_Recorder] = []

    @hookimpl
    def msgbroker_register_engines(self, register: Any) -> None:
        def build(context: EngineContext) -> _Recorder:
            engine = _Recorder(context)
            self.built.append(engine)
            return engine

        register(EngineSpec("recorder", ("rec",), build, "records"))


def _broker(url: str, plugins: tuple[Any, ...] = ()) -> Broker:
    config = BrokerConfig(sections={"cluster": {"url": url}})
    return Broker(config, Clock(), plugins=plugins)


def test_the_memory_engine_is_the_default_and_adds_nothing() -> None:
    broker = make_broker()
    assert broker.engine is not None and broker.engine.name == "memory"
    broker.started()
    assert broker.cluster is None
    assert broker.hub.cluster is None  # so routing calls nothing more per message


def test_a_third_party_engine_is_picked_by_its_url_scheme() -> None:
    plugin = _Plugin()
    broker = _broker("rec://somewhere:1", (plugin,))
    assert broker.engine is not None and broker.engine.name == "recorder"
    broker.started()
    assert broker.cluster is not None and broker.hub.cluster is broker.cluster
    engine = plugin.built[-1]
    assert engine.context.url == "rec://somewhere:1"
    assert engine.context.node == broker.cluster.node
    assert ("start",) in engine.calls


def test_an_unknown_scheme_is_a_configuration_error_without_the_password() -> None:
    with pytest.raises(ConfigError) as refused:
        _broker("nope://user:s3cret@host:1")
    assert "s3cret" not in str(refused.value)
    assert "redis" in str(refused.value)


def test_two_engines_with_one_scheme_are_refused() -> None:
    with pytest.raises(ConfigError, match="two plugins register the engine URL scheme"):
        _broker("", (_Plugin(), _Plugin()))


def test_the_cluster_option_and_section(tmp_path: Any) -> None:
    config_file = tmp_path / "broker.toml"
    config_file.write_text('[cluster]\nurl = "redis://10.0.0.5:6379/2"\nheartbeat = 0.5\n')
    broker = Broker(build_config(str(config_file), {}, _sections), Clock())
    settings = broker.cluster_settings
    assert (settings.url, settings.heartbeat, settings.timeout) == (
        "redis://10.0.0.5:6379/2", 0.5, 0.75
    )
    config = build_config(None, {"cluster": "redis://h:1", "cluster-node-timeout": 3}, _sections)
    assert config.section("cluster", ClusterSettings).node_timeout == 3.0
    with pytest.raises(ConfigError, match="at least one heartbeat"):
        build_config(None, {"cluster": "redis://h:1", "cluster-node-timeout": 0.1}, _sections)
    with pytest.raises(ConfigError, match="not both"):
        build_config(
            None, {"cluster-password": "a", "cluster-password-file": "/x"}, _sections
        )


def _sections(plugins: Any, blocked: Any) -> Any:
    return Broker(BrokerConfig(), Clock()).plugins.config_sections()


def test_urls() -> None:
    assert url_scheme("") == "memory"
    assert url_scheme("rediss://h:1") == "rediss"
    assert redact_url("redis://:pw@h:6379/1") == "redis://:***@h:6379/1"
    assert redact_url("redis://h:6379") == "redis://h:6379"
