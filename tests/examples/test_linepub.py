"""The example third-party plugin (examples/linepub), installed into a fresh virtualenv by
pip and found through its entry points, end to end over real sockets: its protocol, its
login scheme on another protocol, its Micromessage2 extension, its STMP action, its own hook
implemented by its second plugin, its config section and its sub-command."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

import pytest

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.codec import Command
from msgbroker.plugins.ssmp.blocking import BlockingSSMPClient
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from tests.ssmp.e2e_support import LineReader, parse_address, stop_process


def test_msgbroker_plugins_lists_the_installed_example(example_venv):
    out = subprocess.run(
        [str(example_venv), "-c", "from msgbroker.cli import main; raise SystemExit(main())",
         "plugins"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "linepub" in out
    assert "msgbroker-linepub 1.0.0" in out
    assert "msgbroker_linepub_motd" in out


# -- the broker, from the example's virtualenv ---------------------------------------------------




TWISTD = "from twisted.scripts.twistd import run; run()"
PROTOCOLS = ("linepub", "ssmp", "stmp", "mm2")


@contextlib.contextmanager
def running(python, directory, *options, name="msgbroker", protocols=PROTOCOLS):
    listen = [a for p in protocols for a in ("--listen", f"{p}=tcp:0:interface=127.0.0.1")]
    process = subprocess.Popen(
        [str(python), "-c", TWISTD, "-n", "--pidfile=", name, *listen, *options],
        cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log = LineReader(process.stdout)
    try:
        ports = {}
        for _ in protocols:
            match = log.wait_for(r"(\w+) listening on (tcp:\S+)")
            ports[match.group(1)] = parse_address(match.group(2))[1]
        yield ports, log, process
    finally:
        stop_process(process, signal.SIGTERM)


class LineClient:
    """linepub over a raw socket: what the protocol is, byte for byte."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def say(self, line):
        self.sock.sendall(line.encode() + b"\n")

    def line(self):
        return self.file.readline().decode().rstrip("\n")

    def close(self):
        self.file.close()
        self.sock.close()


@pytest.fixture
def broker(example_venv, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:a-token\nbob:b-token\n")
    config = tmp_path / "msgbroker.toml"
    config.write_text(f'auth = ["token", "open"]\n\n[linepub]\ntoken-file = "{tokens}"\n')
    with running(
        example_venv, tmp_path, "--config", str(config), "--linepub-motd", "hello {identity}"
    ) as (ports, _, _):
        yield ports


def test_linepub_logs_in_with_its_token_scheme_and_gets_the_motd_from_its_own_hook(broker):
    client = LineClient(broker["linepub"])
    client.say("HELLO alice token a-token")
    assert client.line() == "OK"
    assert client.line() == "MOTD hello alice"  # [linepub] motd, via linepub-motd's hook
    client.say("PING")
    assert client.line() == "PONG"
    client.say("BYE")
    assert client.line() == "OK"
    client.close()


def test_a_wrong_token_is_refused_and_the_scheme_serves_ssmp_too(broker):
    client = LineClient(broker["linepub"])
    client.say("HELLO alice token wrong")
    assert client.line() == "NO login refused"
    client.close()
    with BlockingSSMPClient("127.0.0.1", broker["ssmp"], "bob", "token", b"b-token") as ssmp:
        ssmp.ping()


def test_messages_cross_between_linepub_and_the_built_in_protocols(broker):
    sub = LineClient(broker["linepub"])
    sub.say("HELLO alice token a-token")
    assert sub.line() == "OK"
    assert sub.line().startswith("MOTD")
    sub.say("SUB news")
    assert sub.line() == "OK"
    with BlockingSSMPClient("127.0.0.1", broker["ssmp"], "carol", "open") as ssmp:
        ssmp.subscribe("news")
        ssmp.mcast("news", b"from-ssmp")
        assert sub.line() == "MSG news carol from-ssmp"
        sub.say("PUB news from linepub")
        assert sub.line() == "OK"
        delivery = ssmp.next_event(timeout=10)
        assert (delivery.sender, delivery.to, delivery.payload) == (
            "alice", "news", b"from linepub",
        )
    sub.close()


def test_its_stmp_action_and_its_mm2_extension(broker):
    with BlockingSTMPClient("127.0.0.1", broker["stmp"], "dave", "open") as stmp:
        linepub = LineClient(broker["linepub"])
        linepub.say("HELLO bob token b-token")
        assert linepub.line() == "OK"
        linepub.line()  # MOTD
        status = stmp.call("10.76.0.1", {})
        assert status == {"connections": 1, "motd": "hello dave"}
        linepub.close()
    with BlockingMM2Client(
        "127.0.0.1", broker["mm2"], "erin", optional=["x-linepub-count"]
    ) as mm2:
        mm2.publish("topic", b"one")
        mm2.publish("topic", b"two")
        mm2.command(Command("linepub-count", ()))
        answer = mm2.next_extension(timeout=10)
        assert answer.payload == b"2"


def test_its_sub_command_publishes(broker, example_venv, tmp_path):
    sub = LineClient(broker["linepub"])
    sub.say("HELLO alice token a-token")
    sub.line(), sub.line()
    sub.say("SUB news")
    assert sub.line() == "OK"
    token = tmp_path / "bob-token"
    token.write_text("b-token\n")
    done = subprocess.run(
        [str(example_venv), "-c", "from msgbroker.cli import main; raise SystemExit(main())",
         "linepub", "pub", "news", "via the CLI", "--port", str(broker["linepub"]),
         "--id", "bob", "--scheme", "token", "--secret-file", str(token)],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert sub.line() == "MSG news bob via the CLI"
    sub.close()


TWISTED_CLIENT = """
import sys
from twisted.internet import defer, task
from msgbroker_linepub.blocking import BlockingLinepubClient
from msgbroker_linepub.client import connect

@defer.inlineCallbacks
def main(reactor, port):
    got = defer.Deferred()
    client = yield connect(reactor, "127.0.0.1", int(port), identity="alice",
                           scheme="token", credential=b"a-token", on_message=got.callback)
    yield client.subscribe("news")
    with BlockingLinepubClient("127.0.0.1", int(port), "bob", "token", b"b-token") as other:
        other.publish("news", "from the blocking client")
    delivery = yield got
    print(delivery.topic, delivery.sender, delivery.text)
    yield client.close()

task.react(main, sys.argv[1:])
"""


def test_its_twisted_and_blocking_clients_talk_through_the_broker(broker, example_venv):
    done = subprocess.run(
        [str(example_venv), "-c", TWISTED_CLIENT, str(broker["linepub"])],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["news bob from the blocking client"]


def test_a_password_login_is_decided_later_and_what_follows_it_waits(example_venv, tmp_path):
    """The password scheme answers later (a hash checked off the reactor): linepub's HELLO
    takes its answer through Broker.begin_login, as the built-ins do, and the requests
    that came after the HELLO are handled after it, in order."""
    users = tmp_path / "users"
    subprocess.run(
        [sys.executable, "-c", "from msgbroker.cli import main; main()",
         "users", "add", str(users), "carol"],
        input="s3cret\n", text=True, check=True, capture_output=True,
    )  # fmt: skip
    with running(
        example_venv, tmp_path, "--users", str(users), "--auth", "password",
        protocols=("linepub",),
    ) as (ports, _, _):  # fmt: skip
        client = LineClient(ports["linepub"])
        client.sock.sendall(b"HELLO carol password s3cret\nPING\n")
        assert client.line() == "OK"
        assert client.line() == "PONG"
        client.close()
        wrong = LineClient(ports["linepub"])
        wrong.sock.sendall(b"HELLO carol password wrong\nPING\n")
        assert wrong.line() == "NO login refused"
        assert wrong.line() == ""  # closed: nothing after a refused HELLO is read
        wrong.close()
