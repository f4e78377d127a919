"""``twistd msgbroker`` as an operator runs it: SIGHUP reloads and does not end it (what it
reloads: tests/users/test_sighup.py), SIGUSR1 logs a status line, and the log holds info
and above without per-listener noise."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import time

import pytest

from tests.test_twistd import recv_until, twistd


class Log:
    """A twistd process's output, read line by line up to a matching one."""

    def __init__(self, proc):
        self.proc = proc
        self.lines: list[str] = []
        self._buffered = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ)

    def until(self, pattern, timeout=30.0):
        """Every line up to and including the first new one matching ``pattern``."""
        deadline = time.monotonic() + timeout
        start = len(self.lines)
        while time.monotonic() < deadline:
            for index in range(start, len(self.lines)):
                if re.search(pattern, self.lines[index]):
                    taken = self.lines[start : index + 1]
                    del self.lines[start : index + 1]
                    return taken
            start = len(self.lines)
            if not self._selector.select(deadline - time.monotonic()):
                break
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            self._buffered += chunk
            *lines, self._buffered = self._buffered.split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in lines)
        raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines))


@pytest.fixture
def broker_process():
    procs = []

    def start(*args):
        proc = twistd("--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open", *args)
        procs.append(proc)
        log = Log(proc)
        lines = log.until(r"ssmp listening on tcp:127\.0\.0\.1:(\d+)")
        port = int(re.search(r":(\d+)$", lines[-1]).group(1))
        return proc, log, port, lines

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def login(port, identity, *requests):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    payload = b"LOGIN %s open\n" % identity + b"".join(r + b"\n" for r in requests)
    sock.sendall(payload)
    expected = b"200\n" * (1 + len(requests))
    assert recv_until(sock, expected) == expected
    return sock


def test_sighup_neither_stops_the_broker_nor_loses_a_message(broker_process):
    proc, log, port, _ = broker_process()
    subscriber = login(port, b"sub", b"SUBSCRIBE news")
    publisher = login(port, b"pub")
    for i in range(100):
        publisher.sendall(b"MCAST news m%d\n" % i)
    proc.send_signal(signal.SIGHUP)
    log.until(r"SIGHUP: reloaded the configuration")
    for i in range(100, 200):
        publisher.sendall(b"MCAST news m%d\n" % i)
    expected = b"".join(b"000 pub MCAST news m%d\n" % i for i in range(200))
    assert recv_until(subscriber, expected) == expected
    assert recv_until(publisher, b"200\n" * 200) == b"200\n" * 200
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) in (0, -signal.SIGTERM)


def test_sigusr1_logs_one_status_line(broker_process):
    proc, log, port, _ = broker_process()
    alice = login(port, b"alice", b"SUBSCRIBE a", b"SUBSCRIBE b")
    proc.send_signal(signal.SIGUSR1)
    status = log.until(r"status: ")[-1]
    assert re.search(r"status: 1 connections, 1 identities, 2 topics, 0 patterns", status)
    assert re.search(r"resident memory \d+ MiB", status)
    alice.close()


def test_the_log_holds_no_debug_lines_and_no_listener_noise_by_default(broker_process):
    proc, log, port, startup = broker_process()
    bad = socket.create_connection(("127.0.0.1", port), timeout=10)
    bad.sendall(b"NOT A LOGIN\n")
    assert recv_until(bad, b"400\n") == b"400\n"  # the debug line, if any, came before
    bad.close()
    proc.send_signal(signal.SIGUSR1)
    lines = startup + log.until(r"status: ")
    assert not [line for line in lines if "#debug]" in line]
    assert not [line for line in lines if re.search(r"starting on|Starting factory", line)]


def test_log_level_debug_shows_a_clients_grammar_error(broker_process):
    proc, log, port, _ = broker_process("--log-level", "debug")
    bad = socket.create_connection(("127.0.0.1", port), timeout=10)
    bad.sendall(b"NOT A LOGIN\n")
    assert recv_until(bad, b"400\n") == b"400\n"
    line = log.until(r"#debug\] ssmp .*400")[-1]
    assert "first request is not LOGIN" in line
    bad.close()
