"""``--users`` and ``[auth]``: the table form of the broker's ``auth`` option (its
``schemes`` key) holding the users plugin's ``users``, beside the old top-level list."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig, ConfigError, ConfigSection, Option
from msgbroker.config import build_config
from msgbroker.hooks import declared_sections
from msgbroker.plugins.users.passwords import hash_password
from msgbroker.plugins.users.settings import UsersSettings, users_settings
from msgbroker.sections import check_sections
from msgbroker.testing import make_broker


def config_from(tmp_path, text: str, **overrides) -> BrokerConfig:
    path = tmp_path / "msgbroker.toml"
    path.write_text(text)
    return build_config(str(path), overrides, declared_sections)


def test_the_old_top_level_auth_list_still_works(tmp_path):
    config = config_from(tmp_path, 'auth = ["secret"]\nsecret-file = "/s"\n')
    assert config.auth == ("secret",)
    assert users_settings(config).users is None


def test_an_auth_table_holds_the_schemes_and_the_users_file(tmp_path):
    config = config_from(tmp_path, '[auth]\nschemes = ["password", "open"]\nusers = "/etc/u"\n')
    assert config.auth == ("password", "open")
    assert users_settings(config) == UsersSettings(users="/etc/u")


def test_the_command_line_overrides_the_table(tmp_path):
    text = '[auth]\nschemes = ["password"]\nusers = "/etc/u"\n'
    config = config_from(tmp_path, text, users="/tmp/other", auth=["cert"])
    assert config.auth == ("cert",)
    assert users_settings(config).users == "/tmp/other"
    only_users = config_from(tmp_path, '[auth]\nusers = "/etc/u"\n')
    assert only_users.auth == ()  # no schemes in the table: the default


def test_users_given_twice_in_one_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="give it once"):
        config_from(tmp_path, 'users = "/a"\n[auth]\nusers = "/b"\n')


def test_an_unknown_key_in_the_auth_table_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'user' in the \[auth\] section"):
        config_from(tmp_path, '[auth]\nuser = "/etc/u"\n')


def test_only_the_auth_option_may_also_be_a_section_and_not_with_a_schemes_key():
    clash = ConfigSection("auth", UsersSettings, (Option("schemes", "str", "x"),))
    with pytest.raises(ConfigError, match=r"\[auth\] schemes is the broker's --auth"):
        check_sections([clash], ["auth", "listen"])
    with pytest.raises(ConfigError, match="is a broker option"):
        check_sections([ConfigSection("listen", UsersSettings, ())], ["auth", "listen"])


def test_users_enables_the_password_scheme_without_auth_naming_it(tmp_path):
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password(b'pw')}\n")
    broker = make_broker(BrokerConfig(sections={"auth": {"users": str(users)}}))
    assert broker.enabled_schemes == ("open", "password")
    broker = make_broker(
        BrokerConfig(
            auth=("secret",), secret_file=str(users), sections={"auth": {"users": str(users)}}
        )
    )
    assert broker.enabled_schemes == ("secret", "password")
    assert make_broker(BrokerConfig(auth=("open",))).enabled_schemes == ("open",)


def test_a_bad_users_file_stops_the_broker_in_one_line(tmp_path):
    users = tmp_path / "users"
    users.write_text("alice\n")
    with pytest.raises(ConfigError, match=r"users, line 1: expected identity:hash"):
        make_broker(BrokerConfig(sections={"auth": {"users": str(users)}}))
