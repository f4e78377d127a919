"""The ``password`` scheme on its own: an unknown identity costs the same check as a wrong
password (against a hash of nothing anyone knows), the checks are bounded, and the password
file is read again on reload — on a fake clock, where checks run at once."""

from __future__ import annotations

import pytest

from msgbroker import Accept, BrokerConfig, ConfigError, Deny
from msgbroker.auth import LoginRequest
from msgbroker.plugins.users import passwords, scheme
from msgbroker.plugins.users.plugin import STATE
from msgbroker.testing import drive, make_broker


def request(identity: str, password: bytes | None) -> LoginRequest:
    return LoginRequest("ssmp", identity, "password", password, "127.0.0.1")


def users_broker(tmp_path, **users: str):
    path = tmp_path / "users"
    path.write_text(
        "".join(f"{name}:{passwords.hash_password(pw.encode())}\n" for name, pw in users.items())
    )
    config = BrokerConfig(auth=("password",), sections={"auth": {"users": str(path)}})
    broker = make_broker(config)
    return broker, config, path, broker.plugins.state(STATE, lambda: None)


def test_an_unknown_identity_is_checked_against_the_dummy_hash(tmp_path, monkeypatch):
    broker, _, _, password_scheme = users_broker(tmp_path, alice="s3cret")
    checked = []
    real = passwords.verify
    monkeypatch.setattr(passwords, "verify", lambda h, p: checked.append(h) or real(h, p))
    assert password_scheme.authenticate(request("alice", b"s3cret")) == Accept("alice")
    assert password_scheme.authenticate(request("alice", b"wrong")) == Deny("wrong password")
    assert password_scheme.authenticate(request("mallory", b"s3cret")) == Deny("unknown identity")
    hashes = password_scheme.users
    assert checked == [hashes["alice"], hashes["alice"], scheme.dummy_hash()]
    assert scheme.dummy_hash().startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert password_scheme.authenticate(request("alice", None)) == Deny("no password")


def test_the_verifier_refuses_past_its_bound_without_checking():
    class ThreadedReactor:  # provides IReactorThreads for the check, never used to run one
        pass

    from twisted.internet.interfaces import IReactorThreads
    from zope.interface import directlyProvides

    reactor = ThreadedReactor()
    directlyProvides(reactor, IReactorThreads)
    verifier = scheme.Verifier(reactor, max_pending=0)
    assert verifier.in_threads
    assert verifier("$argon2id$x", b"pw") is None
    password_scheme = scheme.PasswordScheme({"alice": scheme.dummy_hash()}, verifier)
    busy = password_scheme.authenticate(request("alice", b"pw"))
    assert busy == Deny("too many passwords being checked at once")


def test_without_a_users_file_the_scheme_refuses_everyone():
    broker = make_broker(BrokerConfig(auth=("password",)))
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN alice password x\n")
    d.advance(1.0)
    assert d.received() == b"401 password\n"


def test_reload_reads_the_users_file_again_and_refuses_a_bad_one(tmp_path):
    broker, config, path, _ = users_broker(tmp_path, alice="one")
    path.write_text(
        f"alice:{passwords.hash_password(b'two')}\nbob:{passwords.hash_password(b'b')}\n"
    )
    broker.reload(config)
    for line, answer in (
        (b"LOGIN alice password two\n", b"200\n"),
        (b"LOGIN bob password b\n", b"200\n"),
    ):
        d = drive(broker, "ssmp")
        d.feed(line)
        assert d.received() == answer
    path.write_text("bob:not-a-hash\n")
    with pytest.raises(ConfigError, match="line 1: the hash of 'bob' is not an argon2 hash"):
        broker.reload(config)
    # nothing changed: bob's password still works
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN bob password b\n")
    assert d.received() == b"200\n"


def test_reload_follows_a_new_path_for_the_users_file(tmp_path):
    broker, config, _, _ = users_broker(tmp_path, alice="one")
    other = tmp_path / "other"
    other.write_text(f"zoe:{passwords.hash_password(b'z')}\n")
    broker.reload(BrokerConfig(auth=("password",), sections={"auth": {"users": str(other)}}))
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN zoe password z\n")
    assert d.received() == b"200\n"
    with pytest.raises(ConfigError, match="does not exist"):
        broker.reload(
            BrokerConfig(auth=("password",), sections={"auth": {"users": str(tmp_path / "gone")}})
        )


def test_a_service_built_without_twistd_reloads_its_running_configuration(tmp_path):
    from msgbroker.plugins.users.passwords import hash_password
    from tests.ssmp.e2e_support import running_broker

    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password(b'one')}\n")
    with running_broker(auth=("password",), sections={"auth": {"users": str(users)}}) as broker:
        users.write_text(f"alice:{hash_password(b'two')}\n")
        broker.call(broker.service.hangup)  # what SIGHUP calls
        scheme = broker.service.broker.plugins.state(STATE, lambda: None)
        assert passwords.verify(scheme.users["alice"], b"two")
        assert broker.service.broker.config.auth == ("password",)  # not the defaults
