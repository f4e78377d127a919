"""The abuse suite's harness: a real ``twistd msgbroker`` process with every protocol on
loopback, its memory read from /proc, and a healthy pair of clients whose traffic must go
on whatever the attack.

Sizes: the suite runs a short version by default (CI); ``MSGBROKER_ABUSE=full`` runs the
attacks at the sizes the issue measured. Figures (memory before, peak, after; the healthy
pair's rate) are collected in :data:`FIGURES` and printed at the end of the run
(``tests/abuse/conftest.py``); ``bench/abuse.py`` runs the full version and reports them.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.ssmp.e2e_support import LineReader, parse_address, stop_process, twistd_command

FULL = os.environ.get("MSGBROKER_ABUSE") == "full"
#: how long anything the broker should do promptly may take here
WAIT = 30.0
#: figures per test, printed at the end of the run
FIGURES: dict[str, dict[str, Any]] = {}

LISTENERS = (
    "ssmp=tcp:0:interface=127.0.0.1",
    "stmp=tcp:0:interface=127.0.0.1",
    "stmp-ws=tcp:0:interface=127.0.0.1",
    "mm2=tcp:0:interface=127.0.0.1",
)


def scale(short: int, full: int) -> int:
    return full if FULL else short


def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Ask again until ``condition`` holds or ``timeout`` passes. Each question is a round
    trip to the broker (its status line), so this waits on the broker's answers, not on
    the clock."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
    return True


class BrokerProcess:
    """``twistd -n msgbroker`` with SSMP, STMP (TCP and WebSocket), Micromessage2 and sbus
    on loopback, ``open`` login, and ``options``."""

    def __init__(self, *options: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="ab", dir="/tmp")  # AF_UNIX paths are short
        listen = [f"--listen={text}" for text in LISTENERS]
        listen.append(f"--listen=sbus=unix:{self.folder}/bus")
        self.process = subprocess.Popen(
            twistd_command(*listen, "--auth", "open", *options),
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.log = LineReader(self.process.stdout)
        self.addresses: dict[str, str] = {}
        try:
            for _ in range(len(LISTENERS) + 1):
                match = self.log.wait_for(r"(\S+) listening on (\S+)", timeout=WAIT)
                self.addresses[match.group(1)] = match.group(2)
        except BaseException:
            self.stop()
            raise
        self.pid = self.process.pid

    def tcp(self, protocol: str) -> tuple[str, int]:
        return parse_address(self.addresses[protocol])

    # -- memory --------------------------------------------------------------------------

    def _status_field(self, name: str) -> int:
        text = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(rf"^{name}:\s+(\d+) kB", text, re.MULTILINE)
        assert match is not None, name
        return int(match.group(1)) << 10

    def rss(self) -> int:
        """Resident memory now (bytes)."""
        return self._status_field("VmRSS")

    def peak(self) -> int:
        """The most resident memory the process has had (bytes)."""
        return self._status_field("VmHWM")

    def reset_peak(self) -> None:
        """Start measuring the peak from now (writing 5 to clear_refs resets VmHWM)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def trimmed_below(self, bound: int) -> int:
        """Wait for the broker to say it handed memory back with its resident size under
        ``bound`` bytes (it trims a second after a large release, at most every 10 s);
        returns that size."""
        deadline = time.monotonic() + WAIT
        while True:
            match = self.log.wait_for(
                r"memory handed back .* -> (\d+) MiB", timeout=max(0.1, deadline - time.monotonic())
            )
            after = int(match.group(1)) << 20
            if after < bound:
                return after

    def status(self) -> dict[str, int]:
        """The broker's own SIGUSR1 status line, as numbers."""
        self.process.send_signal(signal.SIGUSR1)
        line = self.log.wait_for(r"status: (.*)$", timeout=WAIT).group(1)
        numbers = {
            name.replace(" ", "_"): int(value)
            for value, name in re.findall(
                r"(\d+) (connections|identities|topics|patterns|bytes queued)", line
            )
        }
        for name in ("routed", "delivered", "dropped", "skipped", "refused"):
            numbers[name] = int(re.search(rf"{name} (\d+)", line).group(1))
        return numbers

    def assert_no_traceback(self) -> None:
        text = "".join(self.log.lines)
        assert "Traceback" not in text and "Unhandled" not in text, text[-3000:]

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        stop_process(self.process, signal.SIGTERM)
        self.process.stdout.close()  # type: ignore[union-attr]
        subprocess.run(["rm", "-rf", self.folder], check=False)


# -- clients -------------------------------------------------------------------------------


def ssmp_connect(
    address: tuple[str, int], identity: bytes | None = None, source: str | None = None
) -> socket.socket:
    """An SSMP connection (from ``source``, a loopback address); logged in when
    ``identity`` is given."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(WAIT)
    if source is not None:
        sock.bind((source, 0))
    sock.connect(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if identity is not None:
        sock.sendall(b"LOGIN %s open\n" % identity)
        assert read_exactly(sock, 4) == b"200\n"
    return sock


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(1 << 20, size - len(data)))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes: {bytes(data)!r}")
        data += chunk
    return bytes(data)


def read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before {end!r}: {data[-200:]!r}")
        data += chunk
    return data


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker closed ``sock`` (EOF or reset) rather than answering."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


class HealthyPair:
    """An SSMP publisher and subscriber on their own topic: :meth:`exchange` sends
    ``count`` messages and waits for every one to arrive, returning messages per second."""

    def __init__(self, broker: BrokerProcess, name: str = "healthy") -> None:
        address = broker.tcp("ssmp")
        self.topic = name.encode()
        self.subscriber = ssmp_connect(address, b"%s-sub" % self.topic)
        self.subscriber.sendall(b"SUBSCRIBE %s\n" % self.topic)
        assert read_exactly(self.subscriber, 4) == b"200\n"
        self.publisher = ssmp_connect(address, b"%s-pub" % self.topic)
        self.sender = b"%s-pub" % self.topic

    def exchange(self, count: int = 2000, payload: bytes = b"p" * 100) -> float:
        line = b"MCAST %s %s\n" % (self.topic, payload)
        event = b"000 %s MCAST %s %s\n" % (self.sender, self.topic, payload)
        start = time.perf_counter()
        sent = 0
        while sent < count:
            batch = min(100, count - sent)
            self.publisher.sendall(line * batch)
            sent += batch
            assert read_exactly(self.publisher, 4 * batch) == b"200\n" * batch
        assert read_exactly(self.subscriber, len(event) * count) == event * count
        return count / (time.perf_counter() - start)

    def close(self) -> None:
        self.publisher.close()
        self.subscriber.close()


def mib(value: float) -> float:
    return round(value / (1 << 20), 1)
