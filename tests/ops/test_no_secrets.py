"""No secret is ever logged, even at debug level: a real broker at ``--log-level debug``
sees right and wrong secrets in every protocol's login, malformed logins carrying one,
and messages on secret sbus keys from every protocol; none of those bytes appears in
its log.

Whoever adds a login scheme with a credential adds its logins here (``password`` is here:
SSMP, Micromessage2's ``x-login`` and sbus's ``CMSG !/login``)."""

from __future__ import annotations

import signal
import socket

import pytest

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.client_common import MM2ServerError
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.sbus.client_session import SbusLoginRefused
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from msgbroker.plugins.stmp.client_common import STMPError
from msgbroker.plugins.users.passwords import hash_password
from tests.abuse.harness import WAIT, BrokerProcess, read_until

SECRET = b"Sup3r-s3cret-k3y-4711"
#: every secret the test shows the broker: each must stay out of its log
SECRETS = {
    "the secret": SECRET,
    "a wrong guess": b"wr0ng-gu3ss-0815",
    "a guess in a malformed login": b"m4lf0rmed-gu3ss-2222",
    "a guess in a STMP login": b"stmp-gu3ss-3333",
    "a guess in a STMP WebSocket login": b"ws-gu3ss-4444",
    "an sbus secret payload": b"sbus-pr1vate-payl0ad",
    "an STMP message on a secret key": b"stmp-pr1vate-payl0ad",
    "an MM2 message on a secret key": b"mm2-pr1vate-payl0ad",
    "a password": b"Pa55w0rd-5555",
    "a wrong password over SSMP": b"wr0ng-pa55-6666",
    "a wrong password over MM2": b"wr0ng-pa55-7777",
    "a wrong password over sbus": b"wr0ng-pa55-8888",
}


def ssmp_login(address, line):
    sock = socket.create_connection(address, timeout=WAIT)
    sock.sendall(line)
    answer = read_until(sock, b"\n")
    sock.close()
    return answer


@pytest.fixture
def broker(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    users = tmp_path / "users"
    users.write_text(f"erin:{hash_password(SECRETS['a password'])}\n")
    broker = BrokerProcess(
        "--auth", "secret", "--secret-file", str(secret_file), "--log-level", "debug",
        "--auth", "password", "--users", str(users),
        "--login-failure-delay", "0", "--login-attempts", "0",
    )  # fmt: skip
    yield broker
    if broker.alive():
        broker.stop()


def test_no_secret_reaches_the_log_at_debug_level(broker):
    ssmp = broker.tcp("ssmp")
    assert ssmp_login(ssmp, b"LOGIN alice secret %s\n" % SECRET) == b"200\n"
    assert ssmp_login(ssmp, b"LOGIN alice secret %s\n" % SECRETS["a wrong guess"]).startswith(
        b"401"
    )
    malformed = b"LOGIN al\x01ice secret %s\n" % SECRETS["a guess in a malformed login"]
    assert ssmp_login(ssmp, malformed).startswith(b"400")

    for protocol, guess in (("stmp", "a guess in a STMP login"),
                            ("stmp-ws", "a guess in a STMP WebSocket login")):  # fmt: skip
        host, port = broker.tcp(protocol)
        ws = protocol == "stmp-ws"
        with BlockingSTMPClient(host, port, "bob", "secret", SECRET, ws=ws) as client:
            client.publish("news", b"hello")
        with pytest.raises(STMPError):
            BlockingSTMPClient(host, port, "bob", "secret", SECRETS[guess], ws=ws)

    password = SECRETS["a password"]
    assert ssmp_login(ssmp, b"LOGIN erin password %s\n" % password) == b"200\n"
    wrong = SECRETS["a wrong password over SSMP"]
    assert ssmp_login(ssmp, b"LOGIN erin password %s\n" % wrong).startswith(b"401")
    mm2 = BlockingMM2Client(*broker.tcp("mm2"), "erin", login=("password", password))
    mm2.publish("news", b"hello")
    mm2.wait_acked()
    mm2.close()
    wrong = SECRETS["a wrong password over MM2"]
    refused = BlockingMM2Client(*broker.tcp("mm2"), "erin", login=("password", wrong))
    with pytest.raises(MM2ServerError):
        refused.next_message(timeout=WAIT)
    bus = broker.addresses["sbus"].removeprefix("unix:")
    with BlockingSbusClient(bus, timeout=WAIT) as client:
        assert client.login("erin", "password", password) == "erin"
    with BlockingSbusClient(bus, timeout=WAIT) as client, pytest.raises(SbusLoginRefused):
        client.login("erin", "password", SECRETS["a wrong password over sbus"])

    with BlockingSbusClient(bus, timeout=WAIT) as owner:
        key = owner.whoami() + b"/inbox"  # b"!/cred/GID/UID/PID/inbox"
        owner.subscribe(key)
        owner.sync()
        with BlockingSbusClient(bus, timeout=WAIT) as other:
            other.publish(key, SECRETS["an sbus secret payload"])
            other.sync()
        topic = key.decode()
        with BlockingSTMPClient(*broker.tcp("stmp"), "carol", "secret", SECRET) as client:
            client.publish(topic, SECRETS["an STMP message on a secret key"])
        mm2 = BlockingMM2Client(*broker.tcp("mm2"), identity="dave")
        mm2.publish(topic, SECRETS["an MM2 message on a secret key"])
        mm2.wait_acked()
        mm2.close()
        received = {owner.receive(timeout=WAIT).payload for _ in range(3)}
        assert received == {
            SECRETS["an sbus secret payload"],
            SECRETS["an STMP message on a secret key"],
            SECRETS["an MM2 message on a secret key"],
        }

    broker.process.send_signal(signal.SIGTERM)
    broker.process.wait(timeout=WAIT)
    log = "".join(broker.log.lines) + broker.log.rest()
    # the log is at debug level and saw the logins: what it leaves out, it leaves out
    assert "#debug]" in log
    # the refusals from 127.0.0.1: the first at once, the others counted in a later line
    assert "login refused for 'alice'" in log and "more like it since the last line" in log
    leaked = [name for name, secret in SECRETS.items() if secret.decode() in log]
    assert not leaked, leaked
