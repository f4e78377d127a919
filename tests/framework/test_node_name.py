"""The node name (``--node-name``, ``node-name``, ``[cluster] node-name``): how it is given,
its default (host name and first listener), what a name may hold, how a file spells it,
the start-up log line, and that a reload keeps it."""

from __future__ import annotations

import socket

import pytest
from attrs import frozen
from twisted.internet.task import Clock
from twisted.python import usage

from msgbroker import BrokerConfig, ConfigError, ConfigSection, Listener, Option, hookimpl
from msgbroker.config import build_config
from msgbroker.hooks import declared_sections
from msgbroker.nodes import check_node_name, default_node_name, file_form, node_name
from msgbroker.service import BrokerService
from msgbroker.tap import options_class
from msgbroker.testing import make_broker
from tests.ssmp.e2e_support import running_broker

HOST = socket.gethostname()


def parse(*argv: str) -> BrokerConfig:
    options = options_class(declared_sections((), ()))()
    options.parseOptions(list(argv))
    return options.config


def from_file(tmp_path, text: str, overrides: dict | None = None, sections=()) -> BrokerConfig:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return build_config(str(path), overrides or {}, lambda plugins, blocked: sections)


def test_the_option_the_top_level_key_and_the_cluster_tables_key(tmp_path):
    assert parse("--node-name", "east-1").node_name == "east-1"
    assert parse().node_name is None
    assert from_file(tmp_path, 'node-name = "east-1"\n').node_name == "east-1"
    assert from_file(tmp_path, '[cluster]\nnode-name = "east-2"\n').node_name == "east-2"
    # the command line replaces either
    overridden = from_file(tmp_path, '[cluster]\nnode-name = "a"\n', {"node-name": "b"})
    assert overridden.node_name == "b"


def test_both_ways_in_one_file_is_refused_naming_both(tmp_path):
    with pytest.raises(ConfigError) as caught:
        from_file(tmp_path, 'node-name = "a"\n[cluster]\nnode-name = "b"\n')
    assert str(caught.value) == "node-name and [cluster] node-name are one option: give it once"


@frozen
class ClusterSettings:
    url: str = ""


CLUSTER = ConfigSection(
    "cluster", ClusterSettings, (Option("url", "str", "Join a cluster.", flag="cluster"),)
)


def test_the_cluster_tables_other_keys_are_the_cluster_plugins_section(tmp_path):
    config = from_file(
        tmp_path,
        '[cluster]\nnode-name = "east-1"\nurl = "redis://10.0.0.5:6379"\n',
        sections=(CLUSTER,),
    )
    assert config.node_name == "east-1"
    assert config.section("cluster", ClusterSettings) == ClusterSettings("redis://10.0.0.5:6379")
    # no plugin declares [cluster]: its other keys are kept for whoever reads them
    kept = from_file(tmp_path, '[cluster]\nnode-name = "n"\nurl = "x"\n')
    assert (kept.node_name, kept.sections["cluster"]) == ("n", {"url": "x"})


def test_a_cluster_section_cannot_declare_the_brokers_node_name():
    taken = ConfigSection("cluster", dict, (Option("node-name", "str", ""),))

    class Cluster:
        @hookimpl
        def msgbroker_register_config_sections(self, register):
            register(taken)

    # in place of the built-in cluster plugin, which declares [cluster] without it
    config = BrokerConfig(auth=("open",), no_plugins=("cluster",))
    with pytest.raises(ConfigError, match=r"\[cluster\] node-name is the broker's --node-name"):
        make_broker(config, plugins=[Cluster()])


@pytest.mark.parametrize("bad", ["", "a b", "a/b", "ünï", "x" * 129, "a~b", "seg\n1"], ids=repr)
def test_a_node_name_holds_letters_digits_and_dot_underscore_colon_dash(bad):
    with pytest.raises(ConfigError, match="bad node-name"):
        check_node_name(bad)
    with pytest.raises(usage.UsageError, match="bad node-name"):
        parse("--node-name", bad)
    assert check_node_name("db-1.example_com:4444") == "db-1.example_com:4444"


def test_the_default_is_the_host_name_and_the_first_listeners_port_or_socket_file():
    def default(*endpoints: str, host: str = "db1", bound: str | None = None) -> str:
        return default_node_name([Listener.parse(e) for e in endpoints], host, bound)

    assert default("ssmp=tcp:4444:interface=127.0.0.1", "mm2=tcp:4447") == "db1:4444"
    assert default("ssmp=tls:port=4443:interface=0.0.0.0") == "db1:4443"
    assert default("sbus=unix:/run/msgbroker/sbus.socket", "ssmp=tcp:4444") == "db1:sbus.socket"
    assert default("ssmp=unix:address=/run/m.sock:mode=600") == "db1:m.sock"
    # port 0: the one the system chose, as the log says it
    assert default("ssmp=tcp:0", bound="tcp:127.0.0.1:36173") == "db1:36173"
    assert default("ssmp=tcp6:0", bound="tcp:[::1]:36174") == "db1:36174"
    assert default("ssmp=tls:0", bound="tls:127.0.0.1:36175") == "db1:36175"
    # what a name cannot hold becomes "-"
    assert default("ssmp=tcp:4444", host="my host") == "my-host:4444"
    assert default(host="db1") == "db1"
    config = BrokerConfig(node_name="given")
    assert node_name(config, [Listener.parse("ssmp=tcp:4444")], "db1") == "given"


def test_a_file_spells_the_colon_as_a_tilde_which_no_name_holds():
    # Hadoop's paths (Spark reads the journal through them) take "a:b" for a URI scheme
    assert file_form("db1:4444") == "db1~4444"
    assert file_form("plain") == "plain"


def test_a_broker_is_named_after_its_bound_port_and_says_so_at_start():
    from twisted.logger import globalLogPublisher

    assert (
        BrokerService(
            BrokerConfig(listeners=(Listener.parse("ssmp=tcp:0"),)), Clock()
        ).broker.node_name
        == f"{HOST}:0"
    )  # until it is bound
    seen: list[dict] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        with running_broker() as broker:
            named = broker.call(lambda: broker.service.broker.node_name)
    finally:
        globalLogPublisher.removeObserver(seen.append)
    assert named == f"{HOST}:{broker.port}"
    (line,) = [e for e in seen if e.get("log_format", "").startswith("msgbroker {version}")]
    assert line["node"] == named


def test_a_named_broker_keeps_its_name_and_a_reload_keeps_it_too():
    broker = make_broker(BrokerConfig(node_name="east-1"))
    assert broker.node_name == "east-1"
    broker.reload(BrokerConfig(node_name="west-9"))
    assert broker.node_name == "east-1"
    assert broker.config.node_name == "east-1"  # restart-only: the running value stays
