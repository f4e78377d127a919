"""``Broker.reload`` and the ``msgbroker_reload`` hook: every plugin checks its part of the
new configuration; nothing is committed unless all accept, then each commits, in
registration order, and the new configuration becomes the broker's."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig, ConfigError, hookimpl
from msgbroker.testing import make_broker


class Part:
    """A plugin with a part of the configuration: accepts or refuses a reload."""

    def __init__(self, name: str, log: list[str], refuse: bool = False) -> None:
        self.name, self.log, self.refuse = name, log, refuse

    @hookimpl
    def msgbroker_reload(self, broker, config):
        self.log.append(f"check {self.name}")
        if self.refuse:
            raise ConfigError(f"{self.name} refuses")
        return lambda: self.log.append(f"commit {self.name}")


def test_broker_reload_commits_in_registration_order_once_all_accept():
    log: list[str] = []
    broker = make_broker(plugins=[Part("first", log), Part("second", log)])
    new = BrokerConfig(auth=("open",), keepalive=5.0)
    broker.reload(new)
    checks = [line for line in log if line.startswith("check")]
    assert sorted(checks) == ["check first", "check second"]
    assert [line for line in log if line.startswith("commit")] == ["commit first", "commit second"]
    assert broker.config.keepalive == 5.0


def test_broker_reload_commits_nothing_when_one_refuses():
    log: list[str] = []
    broker = make_broker(plugins=[Part("first", log), Part("second", log, refuse=True)])
    before = broker.config
    with pytest.raises(ConfigError, match="second refuses"):
        broker.reload(BrokerConfig(auth=("open",), keepalive=5.0))
    assert not [line for line in log if line.startswith("commit")]
    assert broker.config is before
