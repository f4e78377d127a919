"""sd_notify: a real ``twistd msgbroker`` tells a real unix datagram socket (as systemd's
``NOTIFY_SOCKET``) READY=1 once every listener accepts, and STOPPING=1 when it stops."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from msgbroker.plugins.systemd import notify
from tests.ssmp.e2e_support import WAIT, LineReader, parse_address, stop_process, twistd_command

UNIT = Path(__file__).parents[2] / "deploy" / "msgbroker.service"


@pytest.fixture
def notify_socket():
    """A bound datagram socket in a fresh directory, and its path."""
    folder = tempfile.mkdtemp(prefix="sd", dir="/tmp")  # AF_UNIX paths are short
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(WAIT)
    yield sock, path
    sock.close()
    os.unlink(path)
    os.rmdir(folder)


def test_notify_sends_one_datagram_to_a_path(notify_socket):
    sock, path = notify_socket
    assert notify("READY=1\nSTATUS=up", {"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_notify_reaches_the_abstract_namespace():
    name = f"msgbroker-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(WAIT)
        assert notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"STOPPING=1"


def test_notify_without_systemd_does_nothing(tmp_path):
    assert not notify("READY=1", {})
    assert not notify("READY=1", {"NOTIFY_SOCKET": "vsock:2:1234"})
    # a socket that is gone: logged, not raised
    assert not notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")})


def test_twistd_says_ready_once_listening_and_stopping_when_it_stops(notify_socket):
    sock, path = notify_socket
    listen = ["--listen=ssmp=tcp:0:interface=127.0.0.1", "--listen=stmp=tcp:0:interface=127.0.0.1"]
    process = subprocess.Popen(
        twistd_command(*listen, "--auth", "open"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": path},
    )
    log = LineReader(process.stdout)
    try:
        ready = sock.recv(4096).decode()
        assert ready.startswith("READY=1\n")
        # both listeners accept by now, and the status names them
        status = re.search(r"^STATUS=listening: (.*)$", ready, re.MULTILINE).group(1)
        addresses = dict(part.split(" ") for part in status.split(", "))
        assert set(addresses) == {"ssmp", "stmp"}
        for address in addresses.values():
            socket.create_connection(parse_address(address), timeout=WAIT).close()
        log.wait_for(r"ssmp listening on")
        process.send_signal(signal.SIGTERM)
        stopping = sock.recv(4096).decode()
        assert stopping.startswith("STOPPING=1\n")
        assert process.wait(timeout=WAIT) in (0, -signal.SIGTERM)
    finally:
        stop_process(process, signal.SIGTERM)


def test_the_unit_file_runs_it_as_a_hardened_notify_service():
    text = UNIT.read_text()
    settings: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    assert settings["Type"] == ["notify"]
    exec_start = settings["ExecStart"][0]
    assert "twistd" in exec_start and "--nodaemon" in exec_start and "msgbroker" in exec_start
    assert settings["User"] == ["msgbroker"]
    for directive, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RuntimeDirectory": "msgbroker",
        "StateDirectory": "msgbroker",
        "ExecReload": "/bin/kill -HUP $MAINPID",
    }.items():
        assert settings.get(directive) == [value], directive
    # systemd waits longer than the broker's own grace before it kills
    grace = re.search(r"--shutdown-grace[ =](\d+)", exec_start)
    assert grace is not None
    assert int(settings["TimeoutStopSec"][0]) > int(grace.group(1))


def test_systemd_accepts_every_line_of_the_unit_file(tmp_path):
    """``systemd-analyze verify`` (where systemd is installed) knows every directive: a
    misspelt one would be ignored by systemd, silently weakening the hardening."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = UNIT.read_text()
    twistd = Path(sys.executable).with_name("twistd")
    unit = tmp_path / "msgbroker.service"
    unit.write_text(text.replace("/opt/msgbroker/bin/twistd", str(twistd)))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result
