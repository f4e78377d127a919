"""Plugins' options and configuration sections (msgbroker_register_config_sections): the
journal's ``[journal]`` section, its ``--journal*`` options and the top-level keys it had
before; a third-party plugin's section; errors naming the section and key; and the twistd
options built from the installed plugins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from attrs import frozen
from twisted.python import usage

from msgbroker import BrokerConfig, ConfigError, ConfigSection, Option, hookimpl
from msgbroker.config import build_config
from msgbroker.hooks import declared_sections
from msgbroker.plugins.journal.settings import JournalSettings
from msgbroker.tap import BrokerOptions, options_class
from msgbroker.testing import make_broker
from tests.framework.plugin_dists import child_env, write_greeter

TWISTD = Path(sys.executable).with_name("twistd")


def parse(*argv: str) -> BrokerConfig:
    options = options_class(declared_sections((), ()))()
    options.parseOptions(list(argv))
    return options.config


def journal(config: BrokerConfig) -> JournalSettings:
    return config.section("journal", JournalSettings)


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def test_the_journal_options_on_the_command_line():
    config = parse(
        "--journal",
        "/var/j",
        "--journal-payloads",
        "--journal-rotate-seconds",
        "5",
        "--journal-rotate-bytes",
        "1M",
        "--journal-max-records",
        "7",
    )
    assert journal(config) == JournalSettings("/var/j", True, 5.0, 1 << 20, 7)
    assert config.sections == {
        "journal": {
            "directory": "/var/j",
            "payloads": True,
            "rotate-seconds": "5",
            "rotate-bytes": "1M",
            "max-records": "7",
        }
    }


def test_no_journal_options_is_no_journal():
    assert journal(parse()) == JournalSettings()
    assert journal(parse()).directory is None


def test_the_journal_section_of_the_file(tmp_path):
    path = config_file(
        tmp_path,
        '[journal]\ndirectory = "/var/j"\npayloads = true\nrotate_seconds = 2\n'
        'rotate-bytes = "2M"\nmax-records = 10\n',
    )
    assert journal(parse("--config", path)) == JournalSettings("/var/j", True, 2.0, 2 << 20, 10)


def test_the_old_top_level_keys_still_work(tmp_path):
    path = config_file(
        tmp_path, 'journal = "/var/j"\njournal-payloads = true\njournal_rotate_bytes = "2M"\n'
    )
    settings = journal(parse("--config", path))
    assert (settings.directory, settings.payloads, settings.rotate_bytes) == (
        "/var/j",
        True,
        2 << 20,
    )


def test_the_command_line_wins_over_the_file(tmp_path):
    path = config_file(tmp_path, '[journal]\ndirectory = "/a"\npayloads = true\n')
    settings = journal(parse("--config", path, "--journal", "/b"))
    assert (settings.directory, settings.payloads) == ("/b", True)
    old_style = config_file(tmp_path, 'journal = "/a"\njournal_rotate_seconds = 3\n')
    settings = journal(parse("--config", old_style, "--journal-rotate-seconds", "4"))
    assert (settings.directory, settings.rotate_seconds) == ("/a", 4.0)


@pytest.mark.parametrize(
    ("text", "argv", "message"),
    [
        (
            "journal-payloads = true\n[journal]\npayloads = false\n",
            (),
            "journal-payloads and [journal] payloads are one option: give it once",
        ),
        ("[journal]\ncolour = 1\n", (), "unknown key 'colour' in the [journal] section"),
        ("[journal]\nrotate-seconds = 0\n", (), "journal-rotate-seconds must be positive, not 0.0"),
        ('[journal]\npayloads = "yes"\n', (), "journal-payloads must be true or false, not 'yes'"),
        ("[journal]\nmax-records = 0\n", (), "journal-max-records must be at least 1, not 0"),
        ("", ("--journal-rotate-bytes", "lots"), "journal-rotate-bytes must be a number of bytes"),
        ("", ("--journal", "/j", "--no-plugin", "journal"), "unknown configuration key 'journal'"),
    ],
)
def test_bad_plugin_options_are_one_line_usage_errors(tmp_path, text, argv, message):
    with pytest.raises(usage.UsageError) as caught:
        parse("--config", config_file(tmp_path, text), *argv)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_table_no_plugin_declares_is_kept_as_it_is(tmp_path):
    config = parse("--config", config_file(tmp_path, "[tokens]\nalice_smith = 's3cret'\n"))
    assert config.sections["tokens"] == {"alice_smith": "s3cret"}
    assert config.extra is config.sections
    with pytest.raises(
        ConfigError, match=r"no plugin declares the configuration section \[tokens\]"
    ):
        config.section("tokens", dict)


def test_section_needs_a_resolved_config_and_the_right_class():
    with pytest.raises(ConfigError, match=r"no plugin declares .*\[journal\]"):
        BrokerConfig().section("journal", JournalSettings)
    broker = make_broker()
    assert journal(broker.config) == JournalSettings()
    with pytest.raises(TypeError, match="JournalSettings"):
        broker.config.section("journal", dict)


def test_python_callers_give_a_section_as_a_table_or_a_settings_object():
    given = JournalSettings(directory="/j", rotate_seconds=1.0)
    assert journal(make_broker(BrokerConfig(sections={"journal": given})).config) is given
    broker = make_broker(BrokerConfig(sections={"journal": {"rotate_seconds": 2}}))
    assert journal(broker.config).rotate_seconds == 2.0
    with pytest.raises(ConfigError, match=r"unknown key 'dir' in the \[journal\] section"):
        make_broker(BrokerConfig(sections={"journal": {"dir": "/j"}}))


@frozen
class LevelSettings:
    level: int = 1
    names: tuple[str, ...] = ()


class Leveled:
    section = ConfigSection(
        "leveled",
        LevelSettings,
        (Option("level", "count", "How high."), Option("names", "list", "Who.")),
    )

    @hookimpl
    def msgbroker_register_config_sections(self, register):
        register(self.section)


def test_a_plugin_object_declares_a_section_the_broker_resolves():
    broker = make_broker(
        BrokerConfig(sections={"leveled": {"level": "3", "names": "ann"}}), plugins=[Leveled()]
    )
    assert broker.config.section("leveled", LevelSettings) == LevelSettings(3, ("ann",))
    with pytest.raises(ConfigError, match="level must be a whole number, not 'high'"):
        make_broker(BrokerConfig(sections={"leveled": {"level": "high"}}), plugins=[Leveled()])


LEVELED_MODULE = """
from attrs import frozen

from msgbroker import ConfigSection, Option, hookimpl


@frozen
class Settings:
    level: int = 1
    names: tuple = ()


@hookimpl
def msgbroker_register_config_sections(register):
    options = (Option("level", "count", ""), Option("names", "list", ""))
    register(ConfigSection("leveled", Settings, options))
"""


def test_a_plugin_module_named_in_the_file_has_its_section_and_keys(tmp_path, monkeypatch):
    (tmp_path / "leveled_plugin.py").write_text(LEVELED_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = config_file(
        tmp_path, 'plugin = ["leveled_plugin"]\nleveled-names = ["a", "b"]\n[leveled]\nlevel = 2\n'
    )
    try:
        config = build_config(path, {}, declared_sections)
        settings = sys.modules["leveled_plugin"].Settings
        assert config.section("leveled", settings) == settings(2, ("a", "b"))
    finally:
        sys.modules.pop("leveled_plugin", None)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            ConfigSection("journal", dict, ()),
            r"two plugins declare the configuration section \[journal\]",
        ),
        (
            ConfigSection("listen", dict, ()),
            r"the configuration section \[listen\] is a broker option",
        ),
        (
            ConfigSection("other", dict, (Option("x", "str", "", flag="journal"),)),
            r"the option --journal of \[other\] is already \[journal\]'s",
        ),
        (
            ConfigSection("other", dict, (Option("x", "str", "", flag="keepalive"),)),
            r"the option --keepalive of \[other\] is already the broker's",
        ),
    ],
)
def test_sections_that_clash_are_config_errors(section, message):
    class Clashing:
        @hookimpl
        def msgbroker_register_config_sections(self, register):
            register(section)

    with pytest.raises(ConfigError, match=message):
        make_broker(plugins=[Clashing()])


def test_a_section_declaration_is_checked():
    with pytest.raises(ValueError, match="section names"):
        ConfigSection("Bad Name", dict, ())
    with pytest.raises(ValueError, match="kind 'colour'"):
        Option("x", "colour", "")
    with pytest.raises(ValueError, match="declares a key twice"):
        ConfigSection("x", dict, (Option("a", "str", ""), Option("a", "bool", "")))


def test_the_broker_options_alone_have_no_plugin_options():
    assert not hasattr(BrokerOptions, "opt_journal")
    with pytest.raises(usage.UsageError, match="option --journal not recognized"):
        BrokerOptions().parseOptions(["--journal", "/j"])


def test_twistd_help_lists_the_installed_plugins_options(tmp_path):
    env = child_env(write_greeter(tmp_path / "greeter"))
    done = subprocess.run(
        [str(TWISTD), "msgbroker", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for option in (
        "--journal=",
        "--journal-payloads",
        "--journal-rotate-seconds=",
        "--greeter-greeting=",
        "--greeter-times=",
        "--greeter-loud",
    ):
        assert option in done.stdout
    bad = subprocess.run(
        [str(TWISTD), "--nodaemon", "--pidfile=", "msgbroker", "--greeter-times", "many"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2
    assert (
        bad.stderr == "twistd msgbroker: error: greeter-times must be a whole number, not 'many'\n"
    )


def test_the_options_import_no_reactor():
    code = (
        "import sys\n"
        "from msgbroker.tap import twistd_options\n"
        "options = twistd_options()()\n"
        "options.parseOptions(['--journal-rotate-seconds', '3'])\n"
        "assert 'twisted.internet.reactor' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
