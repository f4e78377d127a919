"""``Broker.reload`` and the ``msgbroker_reload`` hook: every participant checks first, and
only when all accept does anything change (in registration order); a refusal changes
nothing. What the framework itself takes from a reload, and what waits for a restart."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig, ConfigError, Listener, hookimpl
from msgbroker.testing import drive, make_broker


class Recorder:
    """A plugin that records its reload calls and commits, and refuses when told to."""

    def __init__(self, name: str, log: list, refuse: Exception | None = None) -> None:
        self.name, self.log, self.refuse = name, log, refuse

    @hookimpl
    def msgbroker_reload(self, broker, config):
        self.log.append((self.name, "check", broker.config.login_timeout, config.login_timeout))
        if self.refuse is not None:
            raise self.refuse
        return lambda: self.log.append((self.name, "commit", broker.config.login_timeout))


class NothingToDo:
    @hookimpl
    def msgbroker_reload(self, config):
        return None


def test_every_implementation_checks_then_all_commit_in_registration_order():
    log: list = []
    plugins = [Recorder("a", log), NothingToDo(), Recorder("b", log)]
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=plugins)
    broker.reload(BrokerConfig(auth=("open",), login_timeout=3.0))
    # each checked with the broker still on its old config, then committed, in order
    assert log == [
        ("a", "check", 10.0, 3.0),
        ("b", "check", 10.0, 3.0),
        ("a", "commit", 10.0),
        ("b", "commit", 10.0),
    ]
    assert broker.config.login_timeout == 3.0


def test_one_refusal_changes_nothing_anywhere():
    log: list = []
    refused = ConfigError("bad file /etc/x")
    broker = make_broker(
        BrokerConfig(auth=("open",)), plugins=[Recorder("a", log), Recorder("b", log, refused)]
    )
    with pytest.raises(ConfigError, match="bad file /etc/x"):
        broker.reload(BrokerConfig(auth=("open",), login_timeout=3.0))
    assert [entry[1] for entry in log] == ["check", "check"]  # no commit ran
    assert broker.config.login_timeout == 10.0


def test_a_plugin_failing_otherwise_is_a_refusal_naming_it():
    broker = make_broker(
        BrokerConfig(auth=("open",)), plugins=[Recorder("a", [], RuntimeError("bug"))]
    )
    with pytest.raises(ConfigError, match=r"failed to reload: RuntimeError\('bug'\)"):
        broker.reload(BrokerConfig(auth=("open",)))


def test_a_bad_new_configuration_is_refused_before_any_plugin_sees_it():
    log: list = []
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[Recorder("a", log)])
    with pytest.raises(ConfigError, match="unknown auth scheme 'nope'"):
        broker.reload(BrokerConfig(auth=("nope",)))
    with pytest.raises(ConfigError, match="slow-consumer"):
        broker.reload(BrokerConfig(slow_consumer="maybe"))
    assert log == []
    assert broker.enabled_schemes == ("open",)


def test_the_framework_reloads_schemes_limits_and_the_throttle(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    broker = make_broker(BrokerConfig(auth=("open",)))
    broker.reload(
        BrokerConfig(
            auth=("secret",),
            secret_file=str(secret),
            login_attempts=1.0,
            max_connections=7,
            max_connections_per_address=3,
            max_subscriptions=5,
            max_topics=9,
        )
    )
    assert broker.enabled_schemes == ("secret",)
    assert broker.login_throttle.rate == 1.0
    assert (broker.connections.max_total, broker.connections.max_per_address) == (7, 3)
    assert (broker.hub.limits.max_subscriptions, broker.hub.limits.max_topics) == (5, 9)
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN alice open\n")
    d.advance(1.0)
    assert d.received() == b"401 secret\n"  # open is no longer enabled


def test_settings_that_shaped_the_start_keep_their_running_values():
    running = BrokerConfig(
        auth=("open",), listeners=(Listener("ssmp", "tcp:0"),), max_backlog=1 << 20
    )
    broker = make_broker(running)
    broker.reload(
        BrokerConfig(
            auth=("open",),
            listeners=(Listener("ssmp", "tcp:1"),),
            max_backlog=2 << 20,
            keepalive=5.0,
        )
    )
    assert broker.config.listeners == running.listeners
    assert broker.config.max_backlog == 1 << 20
    assert broker.config.keepalive == 5.0  # read where it is used: new connections get it


def test_the_secret_file_is_read_again(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("one\n")
    config = BrokerConfig(auth=("secret",), secret_file=str(secret))
    broker = make_broker(config)
    secret.write_text("two\n")
    broker.reload(config)
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN alice secret two\n")
    assert d.received() == b"200\n"
    secret.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        broker.reload(config)
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN bob secret two\n")  # the old secret stays
    assert d.received() == b"200\n"


def test_the_log_level_follows_a_reload():
    from twisted.logger import LogLevel

    from msgbroker import logs

    broker = make_broker(BrokerConfig(auth=("open",)))
    try:
        broker.reload(BrokerConfig(auth=("open",), log_level="debug"))
        assert logs.log_filter.level == LogLevel.debug
        broker.reload(BrokerConfig(auth=("open",), log_level="warn"))
        assert logs.log_filter.level == LogLevel.warn
    finally:
        logs.set_level("info")
