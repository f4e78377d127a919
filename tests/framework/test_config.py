"""Configuration: TOML file, command-line options, one-line errors."""

from __future__ import annotations

import pytest
from twisted.python import usage

from msgbroker.config import BrokerConfig, Listener, build_config
from msgbroker.errors import ConfigError
from msgbroker.tap import BrokerOptions, makeService


def parse(*argv):
    options = BrokerOptions()
    options.parseOptions(list(argv))
    return options.config


def test_no_options_is_the_embedded_default():
    config = parse()
    assert config == BrokerConfig()
    assert config.is_default


def test_repeatable_options_and_values():
    config = parse(
        "--listen",
        "ssmp=tcp:0:interface=127.0.0.1",
        "--listen",
        "ssmp=tcp:0:interface=::1",
        "--auth",
        "open",
        "--auth",
        "cert",
        "--login-timeout",
        "3",
        "--keepalive",
        "7.5",
        "--max-backlog",
        "64K",
        "--slow-consumer",
        "drop",
    )
    assert config.listeners == (
        Listener("ssmp", "tcp:0:interface=127.0.0.1"),
        Listener("ssmp", "tcp:0:interface=::1"),
    )
    assert config.auth == ("open", "cert")
    assert (config.login_timeout, config.keepalive) == (3.0, 7.5)
    assert (config.max_backlog, config.slow_consumer) == (65536, "drop")


def test_config_file_and_command_line_override(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text(
        'listen = ["ssmp=tcp:4444:interface=127.0.0.1"]\n'
        'auth = "secret"\n'
        'secret_file = "/etc/secret"\n'
        "max-backlog = 2048\n"
        "[myplugin]\nsetting = 1\n"
    )
    config = parse("--config", str(path), "--auth", "open")
    assert config.listeners == (Listener("ssmp", "tcp:4444:interface=127.0.0.1"),)
    assert config.auth == ("open",)
    assert config.secret_file == "/etc/secret"
    assert config.max_backlog == 2048
    assert config.extra == {"myplugin": {"setting": 1}}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "ssmp"], "bad listen value 'ssmp'"),
        (["--slow-consumer", "pray"], "bad slow-consumer policy 'pray'"),
        (["--keepalive", "-1"], "keepalive must be a positive number"),
        (["--max-backlog", "lots"], "max-backlog must be a number of bytes"),
        (["--auth", "secret"], "the secret scheme needs --secret-file"),
        (["--listen", "ssmp=tls:0"], "a TLS listener needs --tls-cert and --tls-key"),
        (["--tls-cert", "a.pem"], "--tls-cert and --tls-key go together"),
        (["--config", "/nonexistent/x.toml"], "cannot read config file /nonexistent/x.toml"),
    ],
)
def test_bad_options_are_usage_errors_naming_the_problem(argv, message):
    with pytest.raises(usage.UsageError) as caught:
        parse(*argv)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_config_file_contents(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = [\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        build_config(str(bad), {})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('colour = "blue"\n')
    with pytest.raises(ConfigError, match="unknown configuration key 'colour'"):
        build_config(str(unknown), {})
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("listen = 5\n")
    with pytest.raises(ConfigError, match="listen must be a string or a list"):
        build_config(str(wrong), {})


def test_make_service_reports_unknown_protocol_and_scheme():
    from twisted.internet.task import Clock

    with pytest.raises(ConfigError, match="unknown protocol 'smtp'"):
        makeService(_options("--listen", "smtp=tcp:25"), Clock())
    with pytest.raises(ConfigError, match="unknown auth scheme 'kerberos'"):
        makeService(_options("--auth", "kerberos"), Clock())


def test_embedded_default_listens_on_every_protocol_default_endpoint():
    from twisted.internet.task import Clock

    service = makeService(_options(), Clock())
    names = [s.name for s in service]
    assert "ssmp=tcp:4444:interface=127.0.0.1" in names
    assert service.broker.enabled_schemes == ("open",)


def _options(*argv):
    options = BrokerOptions()
    options.parseOptions(list(argv))
    return options


def test_cert_scheme_without_a_ca_is_a_config_error():
    from twisted.internet.task import Clock

    with pytest.raises(ConfigError, match="the cert scheme needs --tls-ca"):
        makeService(_options("--auth", "cert"), Clock())
