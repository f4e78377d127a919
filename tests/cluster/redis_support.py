"""A real ``redis-server`` for the cluster tests, on a free loopback port, stopped by PID.

Minimal on purpose: the i15-infra branch brings shared fixtures (``tests/cluster/servers.py``)
that this will give way to.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.clientkit.testing import WAIT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process; :meth:`restart` stops it and starts a fresh (empty) one
    on the same port, as a restarted Redis without persistence would be."""

    def __init__(self, directory: Path, *extra: str, tls: bool = False) -> None:
        self.directory = directory
        self.port = free_port()
        self.extra = extra
        #: TLS only (the options in ``extra`` name the files): ready when its log says so
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://localhost:{self.port}"
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (scripts/setup installs it)")
        log = self.directory / f"redis-{self.port}.log"
        log.unlink(missing_ok=True)  # a restart's log starts afresh
        ports = ["--port", "0", "--tls-port", str(self.port)] if self.tls else [
            "--port", str(self.port)
        ]
        self.process = subprocess.Popen(
            [
                binary, *ports, "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.directory), "--logfile", str(log),
                *self.extra,
            ],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # wait on the port, or the log's line (TLS)
            if self._ready(log):
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {log.read_text()[-2000:]}")
            time.sleep(0.02)  # polling with a deadline, not a fixed sleep
        raise TimeoutError("redis-server did not start")

    def _ready(self, log: Path) -> bool:
        if self.tls:
            return log.exists() and "Ready to accept connections" in log.read_text()
        with contextlib.suppress(OSError), socket.create_connection(
            ("127.0.0.1", self.port), timeout=1
        ) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()  # by PID; as abrupt as a crash
            process.wait(WAIT)

    def restart(self) -> None:
        self.stop()
        self.start()

    def command(self, *args: str) -> bytes:
        """One command over a plain socket; the raw reply."""
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT) as s:
            s.sendall(b"".join(parts))
            return s.recv(65536)


@contextlib.contextmanager
def redis_server(directory: Path, *extra: str, tls: bool = False) -> Iterator[RedisServer]:
    server = RedisServer(directory, *extra, tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(check: object, what: str, timeout: float = WAIT) -> None:
    """Poll ``check()`` (a callable) until it is true, within a deadline."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"still waiting for {what}")
        time.sleep(0.01)
