"""The ``password`` scheme end to end, over real sockets: SSMP, STMP, Micromessage2 and
sbus logins with the right password, a wrong one and an unknown identity. The answer to a
wrong password and to an unknown identity is the same, and comes as late."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator

import pytest

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.client_common import MM2ServerError
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.sbus.client import SbusLoginRefused
from msgbroker.plugins.ssmp.blocking import BlockingSSMPClient
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from msgbroker.plugins.stmp.client_common import STMPError
from msgbroker.plugins.users.passwords import hash_password
from tests.ssmp.e2e_support import WAIT, parse_address, running_broker

DELAY = 0.2  # login-failure-delay: short, but long enough to be seen


@contextlib.contextmanager
def users_broker(**config) -> Iterator[dict]:
    """A broker with every protocol, the password scheme alone and a users file with
    alice (s3cret) and bob (hunter2); yields the listeners' addresses by protocol."""
    directory = tempfile.mkdtemp(prefix="users", dir="/tmp")
    users = os.path.join(directory, "users")
    with open(users, "w") as f:
        f.write(f"alice:{hash_password(b's3cret')}\nbob:{hash_password(b'hunter2')}\n")
    bus = os.path.join(directory, "bus")
    config.setdefault("login_attempts", 0.0)  # these tests fail on purpose, many times
    try:
        with running_broker(
            (
                "ssmp=tcp:0:interface=127.0.0.1",
                "stmp=tcp:0:interface=127.0.0.1",
                "mm2=tcp:0:interface=127.0.0.1",
                f"sbus=unix:{bus}",
            ),
            auth=("password",),
            login_failure_delay=DELAY,
            sections={"auth": {"users": users}},
            **config,
        ) as broker:
            where = {
                listener.protocol: address for listener, address in broker.service.broker.listening
            }
            yield {
                "ssmp": parse_address(where["ssmp"]),
                "stmp": parse_address(where["stmp"]),
                "mm2": parse_address(where["mm2"]),
                "sbus": bus,
                "broker": broker,
                "users": users,
            }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def ssmp_login(address, line: bytes) -> tuple[bytes, float]:
    """The answer to one LOGIN line, and how long it took."""
    with socket.create_connection(address, timeout=WAIT) as sock:
        started = time.monotonic()
        sock.sendall(line)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(1024)
            if not chunk:
                break
            answer += chunk
        return answer, time.monotonic() - started


def test_ssmp_login_password_right_wrong_and_unknown():
    with users_broker() as where:
        assert ssmp_login(where["ssmp"], b"LOGIN alice password s3cret\n")[0] == b"200\n"
        wrong, wrong_took = ssmp_login(where["ssmp"], b"LOGIN alice password s3cret!\n")
        unknown, unknown_took = ssmp_login(where["ssmp"], b"LOGIN mallory password s3cret\n")
        # the same answer: nothing says which part was wrong; both answered late
        assert wrong == unknown == b"401 password\n"
        assert wrong_took >= DELAY and unknown_took >= DELAY
        # what follows a LOGIN in the same write waits for its (later) answer, in order
        client = BlockingSSMPClient(*where["ssmp"], "bob", "password", b"hunter2")
        client.subscribe("news")
        with socket.create_connection(where["ssmp"], timeout=WAIT) as sock:
            sock.sendall(b"LOGIN alice password s3cret\nMCAST news hello\nPING\n")
            reader = sock.makefile("rb")
            assert [reader.readline() for _ in range(3)] == [b"200\n", b"200\n", b"000 . PONG\n"]
        delivery = client.next_event(timeout=WAIT)
        assert (delivery.sender, delivery.payload) == ("alice", b"hello")
        client.close()


def test_stmp_login_password_right_wrong_and_unknown():
    with users_broker() as where:
        host, port = where["stmp"]
        client = BlockingSTMPClient(host, port, "alice", "password", "s3cret")
        client.close()
        refusals = []
        for identity, password in (("alice", "nope"), ("mallory", "s3cret")):
            started = time.monotonic()
            with pytest.raises(STMPError) as refused:
                BlockingSTMPClient(host, port, identity, "password", password)
            assert time.monotonic() - started >= DELAY
            refusals.append((refused.value.status, refused.value.payload))
        assert refusals[0] == refusals[1] == (0x21, {"schemes": ["password"]})


def test_mm2_login_password_through_x_login_right_wrong_and_unknown():
    with users_broker() as where:
        host, port = where["mm2"]
        client = BlockingMM2Client(host, port, "alice", login=("password", "s3cret"))
        client.unicast("alice", b"to myself")  # only a logged-in alice receives it
        assert client.next_message(timeout=WAIT).payload == b"to myself"
        client.close()
        for identity, password in (("alice", "nope"), ("mallory", "s3cret")):
            refused = BlockingMM2Client(host, port, identity, login=("password", password))
            with pytest.raises(MM2ServerError) as error:
                refused.next_message(timeout=WAIT)
            assert error.value.text == "login refused"
        # without x-login, the identity would log in with open, which is not enabled
        plain = BlockingMM2Client(host, port, "alice")
        with pytest.raises(MM2ServerError, match="login refused"):
            plain.next_message(timeout=WAIT)


def test_sbus_login_password_right_wrong_and_unknown():
    with users_broker() as where:
        watcher = BlockingSSMPClient(*where["ssmp"], "bob", "password", b"hunter2")
        watcher.subscribe("sensors")
        client = BlockingSbusClient(where["sbus"])
        assert client.login("alice", "password", b"s3cret") == "alice"
        client.publish(b"sensors", b"21C")  # known as alice from now on, to every protocol
        delivery = watcher.next_event(timeout=WAIT)
        assert (delivery.sender, delivery.payload) == ("alice", b"21C")
        client.close()
        watcher.close()
        for identity, password in (("alice", b"nope"), ("mallory", b"s3cret")):
            refused = BlockingSbusClient(where["sbus"])
            started = time.monotonic()
            with pytest.raises(SbusLoginRefused):
                refused.login(identity, "password", password)
            assert time.monotonic() - started >= DELAY
            refused.close()


def test_failed_logins_from_one_address_are_throttled_even_with_the_right_password():
    # a bucket of one attempt, refilled after 10 s: a refill while the test runs
    # (a failure is answered after DELAY) cannot let the right password in by chance
    with users_broker(login_attempts=0.1) as where:
        answers = [ssmp_login(where["ssmp"], b"LOGIN alice password guess\n")[0] for _ in range(2)]
        assert answers == [b"401 password\n"] * 2
        # the address's token is spent: the right password is refused unheard
        assert ssmp_login(where["ssmp"], b"LOGIN alice password s3cret\n")[0] == b"401 password\n"
        broker = where["broker"].service.broker
        assert broker.hub.stats.refused >= 1
