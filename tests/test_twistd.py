"""``twistd msgbroker`` as a user runs it: a real process, real sockets."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time

import pytest

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


def twistd(*args, twistd_args=(), **kwargs):
    return subprocess.Popen(
        [TWISTD, "--nodaemon", "--pidfile=", *twistd_args, "msgbroker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,
    )


def wait_for_line(proc, pattern, timeout=30.0):
    """Read the process's output until a line matches ``pattern``; return the match. The
    lines read after it wait for the next call (kept on ``proc``)."""
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen = []
    lines = proc.__dict__.setdefault("unread_lines", [])
    buffered = proc.__dict__.get("unread_bytes", b"")
    while True:
        while lines:
            text = lines.pop(0).decode(errors="replace")
            seen.append(text)
            match = re.search(pattern, text)
            if match:
                proc.unread_bytes = buffered
                return match
        if time.monotonic() >= deadline or not selector.select(deadline - time.monotonic()):
            break
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buffered += chunk
        *new, buffered = buffered.split(b"\n")
        lines.extend(new)
    raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(seen))


def recv_until(sock, expected):
    data = b""
    while not data.endswith(expected):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_twistd_help_lists_msgbroker():
    out = subprocess.run([TWISTD, "--help"], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\s+msgbroker\s", out, re.MULTILINE)


@pytest.mark.parametrize(
    ("twistd_args", "reactor"),
    [
        ((), "msgbroker.reactor.BrokerReactor"),  # msgbroker's own when none is chosen
        (("--reactor=poll",), "twisted.internet.pollreactor.PollReactor"),
    ],
)
def test_runs_logs_the_real_port_serves_ssmp_and_stops_on_sigterm(twistd_args, reactor):
    proc = twistd(
        "--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open", twistd_args=twistd_args
    )
    try:
        assert wait_for_line(proc, r"reactor class: (\S+)\.$").group(1) == reactor
        port = int(wait_for_line(proc, r"ssmp listening on tcp:127\.0\.0\.1:(\d+)").group(1))
        assert port != 0
        watcher = socket.create_connection(("127.0.0.1", port), timeout=10)
        watcher.sendall(b"LOGIN w open\nSUBSCRIBE t PRESENCE\n")
        assert recv_until(watcher, b"200\n200\n") == b"200\n200\n"
        member = socket.create_connection(("127.0.0.1", port), timeout=10)
        member.sendall(b"LOGIN m open\nSUBSCRIBE t\nMCAST t hello\n")
        assert recv_until(member, b"200\n200\n200\n") == b"200\n200\n200\n"
        assert recv_until(watcher, b"hello\n") == b"000 m SUBSCRIBE t\n000 m MCAST t hello\n"
        proc.send_signal(signal.SIGTERM)
        # twistd shuts down cleanly, then re-raises the signal to report it (exit -15)
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
        rest = b""
        while chunk := watcher.recv(4096):
            rest += chunk
        assert rest == b"000 m UNSUBSCRIBE t\n"
        watcher.close()
        member.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slow-consumer", "pray"], "bad slow-consumer policy 'pray'"),
        (["--bogus"], "option --bogus not recognized"),
        (["--listen", "smtp=tcp:0"], "unknown protocol 'smtp'"),
        (["--listen", "ssmp=tcp:0", "--auth", "kerberos"], "unknown auth scheme 'kerberos'"),
        (["--listen", "ssmp=nonsense:0"], "bad endpoint in --listen ssmp=nonsense:0"),
    ],
)
def test_bad_options_exit_non_zero_with_one_line(args, message):
    result = subprocess.run(
        [TWISTD, "--nodaemon", "--pidfile=", "msgbroker", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]


def test_port_in_use_exits_non_zero_with_one_line():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = twistd("--listen", f"ssmp=tcp:{port}:interface=127.0.0.1", "--auth", "open")
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode != 0
        errors = [line for line in out.decode().splitlines() if "error" in line.lower()]
        assert any(f"cannot listen on ssmp=tcp:{port}" in line for line in errors), out
        assert "Traceback" not in out.decode()
    finally:
        holder.close()


def test_the_started_broker_freezes_its_heap_out_of_full_collections():
    proc = twistd(
        "--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open", "--log-level", "debug"
    )
    try:
        frozen = int(wait_for_line(proc, r"(\d+) objects of the started broker frozen").group(1))
        assert frozen > 10_000  # modules, classes, plugins: what lives as long as the process
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
