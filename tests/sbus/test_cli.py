"""``msgbroker sbus ...`` as a person uses it: against ``twistd -n msgbroker`` in a
subprocess, ``sub`` in a subprocess read line by line and stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import frozen

from msgbroker.cli import main
from msgbroker.plugins.sbus.cli import render_key, render_message
from msgbroker.plugins.sbus.codec import Publish
from tests.sbus.server_support import running_bus
from tests.ssmp.e2e_support import WAIT, LineReader, TwistdBroker, stop_process, twistd_broker

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))


@frozen
class Bus:
    twistd: TwistdBroker
    path: str


@pytest.fixture(scope="module")
def bus(tmp_path_factory) -> Iterator[Bus]:
    directory = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    path = os.path.join(directory, "bus")
    options = ("--listen", f"sbus=unix:{path}", "--listen", "ssmp=tcp:0:interface=127.0.0.1")
    try:
        with twistd_broker(tmp_path_factory.mktemp("twistd"), *options, "--auth", "open") as b:
            if not any(f"sbus listening on unix:{path}" in line for line in b.log.lines):
                b.log.wait_for(f"sbus listening on unix:{re.escape(path)}")
            yield Bus(b, path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def credentials(pid: int) -> str:
    return f"!/cred/{os.getgid()}/{os.getuid()}/{pid}"


def msgbroker(bus, *args, stdin=None):
    """Run ``msgbroker sbus ARGS -a PATH`` to completion."""
    return subprocess.run(
        [MSGBROKER, "sbus", *args, "-a", bus.path],
        input=stdin, capture_output=True, timeout=30, check=False,
    )  # fmt: skip


class Sub:
    """A running ``msgbroker sbus sub``, its stdout read line by line."""

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
def running_sub(path: str, *patterns: str) -> Iterator[Sub]:
    """``msgbroker sbus sub PATTERNS -a PATH``; returns once it is subscribed."""
    process = subprocess.Popen(
        [MSGBROKER, "sbus", "sub", *patterns, "-a", path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sub = Sub(process)
    try:
        sub.err.wait_for(r"^msgbroker: subscribed to ")
        yield sub
    finally:
        stop_process(process, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_sub_prints_what_pub_sends_and_exits_0_on_ctrl_c(bus):
    with running_sub(bus.path, "t1/*", "t1/other") as sub:
        done = msgbroker(bus, "pub", "t1/news", "hello world")
        assert done.returncode == 0, done.stderr
        assert done.stdout == done.stderr == b""
        assert sub.expect(r"hello world").string == "t1/news hello world\n"
        status, stderr = sub.interrupt()
    assert status == 0
    assert stderr == (
        f"msgbroker: subscribed to t1/* t1/other as {credentials(sub.process.pid)} "
        f"on {bus.path}; Ctrl-C to stop\n"
    )


def test_sub_shows_spaces_in_keys_and_binary_payloads_escaped(bus):
    with running_sub(bus.path, "t2/") as sub:
        key, payload = os.fsdecode(b"t2/a key"), os.fsdecode(b"caf\xc3\xa9 \xff\n")
        assert msgbroker(bus, "pub", key, payload).returncode == 0
        assert sub.expect(r"caf").string == "t2/a\\x20key caf\u00e9 \\xff\\n\n"


def test_pub_dash_sends_one_message_per_stdin_line(bus):
    with running_sub(bus.path, "t3") as sub:
        done = msgbroker(bus, "pub", "t3", "-", stdin=b"first\n\nsecond line\r\nlast\n")
        assert done.returncode == 0, done.stderr
        sub.expect(r"^t3 last$")
        assert sub.out.lines == ["t3 first\n", "t3 second line\n", "t3 last\n"]


def test_whoami_prints_the_credentials_of_its_process(bus):
    process = subprocess.Popen(
        [MSGBROKER, "sbus", "whoami", "-a", bus.path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (0, b"")
    assert out.decode() == credentials(process.pid) + "\n"


def test_ssmp_mcast_reaches_sub_and_pub_reaches_ssmp(bus):
    twistd = bus.twistd
    sock = socket.create_connection((twistd.host, twistd.port), timeout=WAIT)
    with sock, sock.makefile("rb") as reader:
        sock.sendall(b"LOGIN t4-peer open\nSUBSCRIBE t4/to-ssmp\n")
        assert reader.readline() == reader.readline() == b"200\n"
        with running_sub(bus.path, "t4/to-sbus") as sub:
            sock.sendall(b"MCAST t4/to-sbus from ssmp\n")
            assert reader.readline() == b"200\n"
            assert sub.expect(r"from ssmp").string == "t4/to-sbus from ssmp\n"
        process = subprocess.Popen(
            [MSGBROKER, "sbus", "pub", "t4/to-ssmp", "from sbus", "-a", bus.path],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert process.wait(timeout=30) == 0
        assert reader.readline() == (
            b"000 sbus:%d:%d MCAST t4/to-ssmp from sbus\n" % (os.getuid(), process.pid)
        )


def test_sub_says_it_lost_the_broker_keeps_trying_and_exits_0_on_ctrl_c():
    # tests/test_reconnect_cli.py restarts a real broker under it
    with running_bus() as bus, running_sub(bus.path, "t5") as sub:
        bus.broker.call(bus.broker.service.stopService)
        assert sub.err.wait_for("lost").string == (
            f"msgbroker: lost the connection to {bus.path} (the broker closed the "
            "connection); reconnecting\n"
        )
        assert sub.process.poll() is None
        status, stderr = sub.interrupt()
    assert status == 0
    assert "Traceback" not in stderr and "error" not in stderr


# -- in process, through main() ----------------------------------------------------------------


def test_whoami_in_process_uses_sbus_address(bus, monkeypatch, capsys):
    monkeypatch.setenv("SBUS_ADDRESS", bus.path)
    assert main(["sbus", "whoami"]) == 0
    assert capsys.readouterr().out == credentials(os.getpid()) + "\n"


def test_missing_socket_is_one_line_and_status_1(capsys):
    missing = os.path.join(tempfile.gettempdir(), f"sbus-missing-{os.getpid()}")
    assert main(["sbus", "pub", "k", "x", "-a", missing]) == 1
    assert capsys.readouterr().err == (
        f"msgbroker: error: cannot connect to {missing}: No such file or directory\n"
    )


def test_socket_nobody_accepts_on_is_refused(capsys):
    directory = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    path = os.path.join(directory, "dead")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as bound:
            bound.bind(path)  # bound, never listening
            assert main(["sbus", "sub", "k", "--address", path]) == 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert capsys.readouterr().err == (
        f"msgbroker: error: cannot connect to {path}: Connection refused\n"
    )


def test_bad_address_is_one_line(capsys):
    assert main(["sbus", "whoami", "-a", "/dev/unix/abstract/xyz"]) == 1
    assert capsys.readouterr().err == (
        "msgbroker: error: bad abstract address '/dev/unix/abstract/xyz': not hexadecimal\n"
    )


def test_sub_to_someone_elses_secret_key_is_one_line_with_the_reason(bus, capsys):
    assert main(["sbus", "sub", "!/cred/0/0/1/", "-a", bus.path]) == 1
    assert capsys.readouterr().err == (
        f"msgbroker: error: {bus.path}: the broker closed the connection "
        "(a !/cred/ pattern must carry this process's credentials: see whoami)\n"
    )


def test_help_lists_sbus(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "sbus" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("key", "shown"),
    [(b"a/b", "a/b"), (b"a key", "a\\x20key"), (b"", ""), (b"\xff/\t", "\\xff/\\t")],
)
def test_render_key_has_no_spaces(key, shown):
    assert render_key(key) == shown


def test_render_message_splits_at_the_first_space():
    assert render_message(Publish(b"k k", b"p p")) == "k\\x20k p p"
