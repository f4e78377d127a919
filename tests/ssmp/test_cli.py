"""``msgbroker ssmp ...`` as a person uses it: against ``twistd -n msgbroker`` in a
subprocess, ``sub`` in a subprocess read line by line and stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from msgbroker.cli import main
from msgbroker.clientkit.cli import render_payload
from msgbroker.plugins.ssmp.client import BlockingSSMPClient, Presence
from tests.ssmp.e2e_support import LineReader, running_broker, stop_process, twistd_broker

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with twistd_broker(tmp_path_factory.mktemp("twistd")) as running:
        yield running


def msgbroker(broker, *args, stdin=None):
    """Run ``msgbroker ARGS --port PORT`` to completion."""
    return subprocess.run(
        [MSGBROKER, *args, "--port", str(broker.port)],
        input=stdin, capture_output=True, timeout=30, check=False,
    )


class Sub:
    """A running ``msgbroker ssmp sub``, its stdout read line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.out = LineReader(process.stdout)
        self.err = LineReader(process.stderr)

    def expect(self, pattern: str) -> re.Match[str]:
        return self.out.wait_for(pattern)

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C; the exit status and everything on stderr."""
        status = stop_process(self.process, signal.SIGINT)
        return status, "".join(self.err.lines) + self.err.rest()


@contextlib.contextmanager
def running_sub(port, *args, watcher=None):
    """``msgbroker ssmp sub ARGS``; returns once it is subscribed (its stderr says so)."""
    process = subprocess.Popen(
        [MSGBROKER, "ssmp", "sub", *args, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    sub = Sub(process)
    try:
        sub.err.wait_for(r"^msgbroker: subscribed to ")
        yield sub
    finally:
        stop_process(process, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_sub_prints_what_pub_sends_and_exits_0_on_ctrl_c(broker):
    with running_sub(broker.port, "news", "--id", "alice") as sub:
        done = msgbroker(broker, "ssmp", "pub", "news", "hello world", "--id", "bob")
        assert done.returncode == 0, done.stderr
        assert done.stdout == done.stderr == b""
        assert sub.expect(r"hello world").string == "bob news hello world\n"
        status, stderr = sub.interrupt()
    assert status == 0
    assert "Traceback" not in stderr
    assert stderr == (
        f"msgbroker: subscribed to news as alice on 127.0.0.1:{broker.port}; Ctrl-C to stop\n"
    )


def test_sub_leaves_cleanly_on_ctrl_c(broker):
    with BlockingSSMPClient(broker.host, broker.port, "watcher") as watcher:
        watcher.subscribe("lobby", presence=True)
        with running_sub(broker.port, "lobby", "--id", "leaver") as sub:
            assert watcher.next_event(timeout=10) == Presence("leaver", "lobby", True, False)
            status, _ = sub.interrupt()
        assert status == 0
        assert watcher.next_event(timeout=10) == Presence("leaver", "lobby", False, False)


def test_pub_with_a_generated_id(broker):
    with running_sub(broker.port, "gen") as sub:
        assert msgbroker(broker, "ssmp", "pub", "gen", "x").returncode == 0
        assert re.fullmatch(r"cli-\d+-[0-9a-f]{4} gen x\n", sub.expect(r"gen x").string)


def test_pub_dash_sends_one_mcast_per_stdin_line(broker):
    with running_sub(broker.port, "lines", "--id", "reader") as sub:
        lines = b"first\n\nsecond line\r\n\xff\tthird\\\n"
        done = msgbroker(broker, "ssmp", "pub", "lines", "-", "--id", "w", stdin=lines)
        assert done.returncode == 0, done.stderr
        sub.expect(r"^w lines \\xff\\tthird\\\\$")
        assert sub.out.lines == ["w lines first\n", "w lines second line\n",
                                 "w lines \\xff\\tthird\\\\\n"]


def test_ucast_reaches_the_named_sub(broker):
    with running_sub(broker.port, "any", "--id", "carol") as sub:
        done = msgbroker(broker, "ssmp", "ucast", "carol", "psst", "--id", "dave")
        assert done.returncode == 0, done.stderr
        assert sub.expect(r"psst").string == "dave @carol psst\n"


def test_ucast_to_nobody_is_one_line_on_stderr_and_status_1(broker):
    done = msgbroker(broker, "ssmp", "ucast", "nobody-here", "hello")
    assert done.returncode == 1
    assert done.stderr == b"msgbroker: error: no client is logged in as 'nobody-here' (404)\n"


def test_bcast_with_join_reaches_subscribers_of_the_joined_topic(broker):
    with running_sub(broker.port, "town", "--id", "erin") as sub:
        done = msgbroker(broker, "ssmp", "bcast", "hear ye", "--join", "town", "--id", "crier")
        assert done.returncode == 0, done.stderr
        assert sub.expect(r"hear ye").string == "crier * hear ye\n"


def test_sub_presence_prints_joined_and_left(broker):
    with running_sub(broker.port, "hall", "--presence", "--id", "door") as sub:
        with BlockingSSMPClient(broker.host, broker.port, "frank") as frank:
            frank.subscribe("hall")
            assert sub.expect(r"joined").string == "frank joined hall\n"
        assert sub.expect(r"left").string == "frank left hall\n"


def test_sub_says_it_lost_the_broker_keeps_trying_and_exits_0_on_ctrl_c():
    # tests/test_reconnect_cli.py restarts a real broker under it
    with running_broker(auth=("open",)) as broker, running_sub(broker.port, "t") as sub:
        broker.call(broker.service.stopService)
        assert sub.err.wait_for("lost").string == (
            f"msgbroker: lost the connection to 127.0.0.1:{broker.port} (the broker closed "
            "the connection); reconnecting\n"
        )
        assert sub.process.poll() is None
        status, stderr = sub.interrupt()
    assert status == 0
    assert "Traceback" not in stderr and "error" not in stderr


# -- errors, in process through main() ---------------------------------------------------------


def test_connection_refused_is_one_line_and_status_1(capsys):
    import socket

    with socket.socket() as bound:  # bound, not listening: refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        assert main(["ssmp", "pub", "t", "x", "--port", str(port)]) == 1
    assert capsys.readouterr().err == (
        f"msgbroker: error: cannot connect to 127.0.0.1:{port}: Connection refused\n"
    )


def test_refused_login_is_one_line_with_the_schemes(broker, tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.write_bytes(b"guess\n")
    args = ["ssmp", "pub", "t", "x", "--port", str(broker.port), "--id", "mallory"]
    assert main([*args, "--secret-file", str(secret)]) == 1
    assert capsys.readouterr().err == (
        f"msgbroker: error: 127.0.0.1:{broker.port} refused login as 'mallory' with scheme "
        "'secret' (401; it offers: open)\n"
    )


def test_anonymous_sub_is_refused_with_405(broker, capsys):
    assert main(["ssmp", "sub", "t", "--id", ".", "--port", str(broker.port)]) == 1
    assert capsys.readouterr().err == "msgbroker: error: not allowed as . (405)\n"


def test_oversized_message_is_refused_before_connecting(capsys):
    assert main(["ssmp", "pub", "t", "x" * 1025, "--port", "1"]) == 1
    assert capsys.readouterr().err == (
        "msgbroker: error: a message must be 1 to 1024 bytes, not 1025\n"
    )


def test_bad_topic_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["ssmp", "pub", "no spaces!", "x"])
    assert exit_.value.code == 2
    assert "is not an SSMP id" in capsys.readouterr().err


def test_help_lists_the_protocol_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "ssmp" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        (b"plain text", "plain text"),
        ("caf\u00e9 \u2603".encode(), "caf\u00e9 \u2603"),
        (b"tab\there\nnewline", "tab\\there\\nnewline"),
        (b"\x00\x01\x7f", "\\x00\\x01\\x7f"),
        (b"back\\slash", "back\\\\slash"),
        (b"bad \xff\xfe utf8", "bad \\xff\\xfe utf8"),
        ("zero\u200bwidth".encode(), "zero\\u200bwidth"),
    ],
)
def test_render_payload_is_one_unambiguous_line(payload, shown):
    assert render_payload(payload) == shown
