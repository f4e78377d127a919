"""The plugin system: entry-point discovery, blocking, --plugin, subclass hooks, every hook."""

from __future__ import annotations

import importlib
import sys

import pytest

from msgbroker import (
    Accept,
    Broker,
    BrokerConfig,
    ConfigError,
    Deny,
    Listener,
    ProtocolSpec,
    hookimpl,
)
from msgbroker.connection import ServerSession
from msgbroker.pluginmanager import build_plugin_manager
from msgbroker.testing import connect, make_broker

PLUGIN_SOURCE = """
from msgbroker import Accept, Deny, hookimpl

EVENTS = []


class TokenScheme:
    name = "token"

    def authenticate(self, request):
        if request.credential == b"let-me-in":
            return Accept(request.identity)
        return Deny("bad token")


@hookimpl
def msgbroker_register_auth_schemes(register):
    register(TokenScheme())


@hookimpl
def msgbroker_authorize(session, action, topic):
    if topic == "forbidden":
        return False
    return None
"""


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A real distribution on sys.path, found through the ``msgbroker`` entry-point group."""
    (tmp_path / "msgbroker_tokenplugin.py").write_text(PLUGIN_SOURCE)
    dist = tmp_path / "msgbroker_tokenplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: msgbroker-tokenplugin\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[msgbroker]\ntokens = msgbroker_tokenplugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield "tokens"
    sys.modules.pop("msgbroker_tokenplugin", None)


def test_entry_point_plugin_registers_scheme_and_authorizes(installed_plugin):
    broker = make_broker(BrokerConfig(auth=("token",)))
    assert "token" in broker.schemes
    ok = connect(broker, "ssmp")
    ok.send(b"LOGIN alice token let-me-in\nSUBSCRIBE forbidden\nSUBSCRIBE fine\n")
    assert ok.received() == b"200\n405\n200\n"
    bad = connect(broker, "ssmp")
    bad.send(b"LOGIN bob token nope\n")
    broker.reactor.advance(broker.config.login_failure_delay)  # a refusal waits
    assert bad.received() == b"401 token\n"


def test_no_plugin_blocks_an_entry_point_plugin(installed_plugin):
    with pytest.raises(ConfigError, match="unknown auth scheme 'token'"):
        make_broker(BrokerConfig(auth=("token",), no_plugins=(installed_plugin,)))


def test_builtins_are_entry_point_plugins_and_can_be_blocked():
    pm = build_plugin_manager()
    names = {name for name, _ in pm.list_name_plugin()}
    assert {"ssmp", "auth-open", "auth-secret", "auth-cert"} <= names
    with pytest.raises(ConfigError, match="unknown auth scheme 'secret'"):
        make_broker(BrokerConfig(auth=("secret",), secret_file="x", no_plugins=("auth-secret",)))
    broker = make_broker(BrokerConfig(auth=("open",), no_plugins=("ssmp",)))
    assert "ssmp" not in broker.protocols


def test_plugin_option_loads_a_module_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_auth_plugin.py").write_text(PLUGIN_SOURCE.replace('"token"', '"mytoken"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    broker = make_broker(BrokerConfig(auth=("mytoken",), plugins=("my_auth_plugin",)))
    assert "mytoken" in broker.schemes
    sys.modules.pop("my_auth_plugin", None)
    with pytest.raises(ConfigError, match="cannot import plugin"):
        make_broker(BrokerConfig(plugins=("no_such_module_anywhere",)))


def test_misspelled_hook_is_a_config_error():
    class Typo:
        @hookimpl
        def msgbroker_authorise(self, session):
            return None

    with pytest.raises(ConfigError, match="msgbroker_authorise"):
        make_broker(plugins=[Typo()])


def test_broker_subclass_methods_are_hooks_without_decorator():
    class PrivateBroker(Broker):
        def msgbroker_authorize(self, session, action, topic):
            return action != "broadcast"

        def msgbroker_authenticate(self, request):
            return Deny("no mallory") if request.identity == "mallory" else None

    broker = make_broker(BrokerConfig(auth=("open",)), broker_class=PrivateBroker)
    a = connect(broker, "ssmp")
    a.send(b"LOGIN a open\nSUBSCRIBE t\nBCAST x\n")
    assert a.received() == b"200\n200\n405\n"
    m = connect(broker, "ssmp")
    m.send(b"LOGIN mallory open\n")
    broker.reactor.advance(broker.config.login_failure_delay)  # a refusal waits
    assert m.received() == b"401 open\n"


def test_authenticate_hook_can_accept_and_abstain():
    class Allowlist:
        @hookimpl
        def msgbroker_authenticate(self, request):
            if request.identity.startswith("vip-"):
                return Accept(request.identity)
            return None

    broker = make_broker(
        BrokerConfig(auth=("secret",), secret_file=__file__), plugins=[Allowlist()]
    )
    vip = connect(broker, "ssmp")
    vip.send(b"LOGIN vip-1 secret wrong\n")
    assert vip.received() == b"200\n"
    other = connect(broker, "ssmp")
    other.send(b"LOGIN joe secret wrong\n")
    broker.reactor.advance(broker.config.login_failure_delay)  # a refusal waits
    assert other.received() == b"401 secret\n"


class Recorder:
    def __init__(self):
        self.events = []

    @hookimpl
    def msgbroker_session_opened(self, session):
        self.events.append(("opened", session.protocol))

    @hookimpl
    def msgbroker_session_login(self, session, request, result):
        self.events.append(("login", request.identity, request.scheme, type(result).__name__))

    @hookimpl
    def msgbroker_session_closed(self, session, reason):
        self.events.append(("closed", session.identity, reason))

    @hookimpl
    def msgbroker_message_routed(self, message, result):
        self.events.append(
            ("routed", message.kind.value, message.topic, dict(result.recipients), result.skipped)
        )

    @hookimpl
    def msgbroker_broker_started(self, broker):
        self.events.append(("started", [str(listener) for listener, _ in broker.listening]))

    @hookimpl
    def msgbroker_broker_stopped(self, broker):
        self.events.append(("stopped",))


def test_observation_hooks_see_sessions_logins_and_routing():
    rec = Recorder()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[rec])
    a, b = connect(broker, "ssmp"), connect(broker, "ssmp")
    a.send(b"LOGIN a open\n")
    b.send(b"LOGIN b open\nSUBSCRIBE t\n")
    a.send(b"MCAST t hi\nMCAST t " + b"\x00\x00x" + b"\n")
    bad = connect(broker, "ssmp")
    bad.send(b"LOGIN c nope\n")
    broker.reactor.advance(broker.config.login_failure_delay)  # a refusal waits
    a.send(b"CLOSE\n")
    assert rec.events == [
        ("opened", "ssmp"),
        ("opened", "ssmp"),
        ("login", "a", "open", "Accept"),
        ("login", "b", "open", "Accept"),
        ("routed", "mcast", "t", {"ssmp": 1}, 0),
        ("routed", "mcast", "t", {"ssmp": 1}, 0),
        ("opened", "ssmp"),
        ("login", "c", "nope", "Deny"),
        ("closed", None, "login refused"),
        ("closed", "a", "close requested"),
    ]


def test_no_per_message_hook_when_nobody_implements_it():
    broker = make_broker(BrokerConfig(auth=("open",)))
    assert broker.hub.observer is None
    assert not broker.authorizes
    rec = make_broker(BrokerConfig(auth=("open",)), plugins=[Recorder()])
    assert rec.hub.observer is not None


class EchoSession(ServerSession):
    """A toy protocol: echoes what it receives (no login)."""

    name = "echo"
    encode = staticmethod(lambda message: message.payload)
    login_required = False

    def data_received(self, data):
        self.peer.send(data)


class EchoPlugin:
    def __init__(self, name="echo"):
        self.name = name

    @hookimpl
    def msgbroker_register_protocols(self, register):
        register(
            ProtocolSpec(
                name=self.name,
                session=EchoSession,
                default_endpoint="tcp:7777:interface=127.0.0.1",
            )
        )


def test_register_protocols_hook_adds_a_protocol_with_its_default_endpoint():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[EchoPlugin()])
    assert {"ssmp", "echo"} <= set(broker.protocols)
    assert Listener("echo", "tcp:7777:interface=127.0.0.1") in broker.listeners()
    conn = connect(broker, "echo")
    conn.send(b"ping?")
    assert conn.received() == b"ping?"


def test_two_protocols_with_one_name_are_an_error():
    with pytest.raises(ConfigError, match="two plugins register the protocol 'ssmp'"):
        make_broker(plugins=[EchoPlugin("ssmp")])


def test_the_built_ins_are_the_entry_points_pyproject_declares():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["msgbroker"]
    broker = make_broker()
    for name, module in declared.items():
        plugin = broker.plugins.get(name)
        assert plugin is not None and plugin.__name__ == module, name
