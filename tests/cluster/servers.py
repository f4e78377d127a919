"""Real ``redis-server`` and ``nats-server`` processes for the cluster tests.

Each server runs from Debian's binary (scripts/setup installs them) as a child process on a
free loopback port, in its own temporary directory, with no persistence unless a test asks
for it. Start-up is waited for by connecting (Redis must answer PING, NATS must send its
INFO), never by sleeping; a server is stopped by its PID (SIGTERM, then SIGKILL)::

    with RedisServer(tmp_path / "redis") as redis:
        redis.command("SET", "k", "v")
        redis.restart()   # same port; the data survives only with durable=True
        redis.kill()      # SIGKILL: "the engine went away"
        redis.pause()     # SIGSTOP: "a slow engine", until resume()

    def test_something(redis_server, nats_server): ...   # the pytest fixtures below

``RedisServer(password=...)`` sets ``requirepass``; ``RedisServer(pki=make_pki(...))`` serves
TLS only (``--tls-port``, ``--port 0``) with tests/certs.py's server certificate, and
``NatsServer`` takes the same two options (``--user``/``--pass``, ``--tls``).
``NatsServer(jetstream=True)`` turns JetStream on (off by default).

A server dies with the thread that started it (``PR_SET_PDEATHSIG``), so a crashed or killed
test run leaves no engine behind: start servers from the test's own thread.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from tests.certs import PKI

#: how long a start, a stop or a reply may take before the test fails
WAIT = 15.0
#: how often a start-up is polled (a connect attempt; not a sleep standing in for an event)
_POLL = 0.005
_PR_SET_PDEATHSIG = 1


class ServerFailed(RuntimeError):
    """The server exited or did not become ready; the message ends with its log."""


class RedisError(Exception):
    """An error reply (``-ERR ...``) from Redis."""


def find_binary(name: str) -> str:
    """``name``'s path: on PATH, or in /usr/sbin (Debian's nats-server is there)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/setup test (it installs it with apt)")
    return found


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# looked up here, not in the child: between fork and exec (other threads may be running,
# a test's reactor thread) the child only makes this one call
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_SIGKILL = int(signal.SIGKILL)


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, _SIGKILL)


class EngineServer:
    """A server process on ``127.0.0.1:port`` with its own directory; see the subclasses."""

    name = "server"
    host = "127.0.0.1"

    def __init__(self, directory: Path, pki: PKI | None = None) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pki = pki
        self.port = free_port()
        self.log_path = directory / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    # -- what a subclass says

    def command_line(self) -> list[str]:
        raise NotImplementedError

    def probe(self, sock: socket.socket) -> bool:
        """Whether the server answering on ``sock`` is ready (False: not yet, ask again)."""
        raise NotImplementedError

    # -- life cycle

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServerFailed(f"{self.name} is not running")
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the server and return once it answers; a port taken meanwhile is replaced
        by another on the first start (a restart keeps its port, or fails)."""
        if self.running:
            raise ServerFailed(f"{self.name} is already running (pid {self.pid})")
        first = self.process is None
        for _attempt in range(3):
            self._spawn()
            try:
                self._wait_ready()
                return
            except ServerFailed:
                in_use = "address already in use" in self.log_text().lower()
                self._reap()
                if not (first and in_use):
                    raise
                self.port = free_port()
        raise ServerFailed(f"{self.name} found no free port")

    def _spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command_line(),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - one prctl call, bound beforehand
            )
        self.paused = False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise ServerFailed(f"{self.name} exited at start-up:\n{self.log_text()}")
            try:
                with self.connect(timeout=1.0) as sock:
                    if self.probe(sock):
                        return
            except OSError:
                pass
            time.sleep(_POLL)
        raise ServerFailed(f"{self.name} did not answer within {WAIT} s:\n{self.log_text()}")

    def stop(self) -> None:
        """SIGTERM (a clean shutdown: Redis writes its append-only file), then SIGKILL."""
        if self.running:
            self._signal(signal.SIGTERM)
            if self.paused:
                self.resume()  # a stopped process handles SIGTERM only once continued
        self._reap()

    def kill(self) -> None:
        """SIGKILL: the engine disappears without a word."""
        if self.running:
            self._signal(signal.SIGKILL)
        self._reap()

    def restart(self) -> None:
        """Stop (SIGTERM) and start again on the same port."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered, until :meth:`resume`."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def _signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def _reap(self) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(WAIT)
        self.paused = False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill() if self.paused else self.stop()

    # -- talking to it

    def connect(self, timeout: float = WAIT) -> socket.socket:
        """A connected socket (TLS-wrapped when the server serves TLS from the first byte)."""
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        if self.pki is not None and self.tls_from_first_byte:
            context = ssl.create_default_context(cafile=str(self.pki.ca.cert_path))
            try:
                return context.wrap_socket(sock, server_hostname="localhost")
            except BaseException:
                sock.close()
                raise
        return sock

    tls_from_first_byte = True

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class RedisServer(EngineServer):
    """``redis-server`` on a free port; ``durable=True`` keeps an append-only file across
    restarts (off: ``--save ''``, ``--appendonly no``, nothing is written)."""

    name = "redis"

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        pki: PKI | None = None,
        durable: bool = False,
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(directory, pki)
        self.password = password
        self.durable = durable
        self.extra = extra

    @property
    def url(self) -> str:
        """``redis://`` (``rediss://`` with TLS) address; the password is never in it."""
        scheme = "rediss" if self.pki is not None else "redis"
        return f"{scheme}://{self.host}:{self.port}"

    def command_line(self) -> list[str]:
        line = [
            find_binary("redis-server"),
            "--bind", self.host,
            "--dir", str(self.directory),
            "--logfile", "",  # stdout, which is the log file
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self.durable else "no",
        ]
        if self.pki is None:
            line += ["--port", str(self.port)]
        else:
            server = self.pki.server
            line += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(server.cert),
                "--tls-key-file", str(server.key),
                "--tls-ca-cert-file", str(self.pki.ca.cert_path),
                "--tls-auth-clients", "no",
            ]
        if self.password is not None:
            line += ["--requirepass", self.password]
        return [*line, *self.extra]

    def probe(self, sock: socket.socket) -> bool:
        sock.sendall(encode_command("PING"))
        reply = RespReader(sock).read_raw()
        # NOAUTH: up, and refusing us as it should; LOADING: still reading its file
        return reply == b"+PONG" or reply.startswith(b"-NOAUTH")

    def command(self, *args: str | bytes | int, password: str | None = None) -> Any:
        """One command on a fresh connection (AUTH first with this server's password, or
        ``password``): its reply, RESP2-decoded; an error reply raises :class:`RedisError`."""
        secret = password if password is not None else self.password
        with self.connect() as sock:
            reader = RespReader(sock)
            if secret is not None:
                sock.sendall(encode_command("AUTH", secret))
                reader.read()
            sock.sendall(encode_command(*args))
            return reader.read()


class NatsServer(EngineServer):
    """``nats-server`` on a free port (no monitoring port); ``jetstream=True`` turns
    JetStream on with its store in this server's directory."""

    name = "nats"
    # NATS sends its INFO in clear, then the client upgrades to TLS
    tls_from_first_byte = False

    def __init__(
        self,
        directory: Path,
        *,
        user: str | None = None,
        password: str | None = None,
        pki: PKI | None = None,
        jetstream: bool = False,
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(directory, pki)
        self.user = user
        self.password = password
        self.jetstream = jetstream
        self.extra = extra

    @property
    def url(self) -> str:
        scheme = "tls" if self.pki is not None else "nats"
        return f"{scheme}://{self.host}:{self.port}"

    def command_line(self) -> list[str]:
        line = [
            find_binary("nats-server"),
            "--addr", self.host,
            "--port", str(self.port),
        ]
        if self.jetstream:
            line += ["--jetstream", "--store_dir", str(self.directory / "jetstream")]
        if self.user is not None:
            line += ["--user", self.user]
        if self.password is not None:
            line += ["--pass", self.password]
        if self.pki is not None:
            server = self.pki.server
            line += ["--tls", "--tlscert", str(server.cert), "--tlskey", str(server.key)]
        return [*line, *self.extra]

    def probe(self, sock: socket.socket) -> bool:
        return self.info(sock) is not None

    @staticmethod
    def info(sock: socket.socket) -> bytes | None:
        """The server's ``INFO {...}`` line, the first thing it sends."""
        line = sock.makefile("rb").readline()
        return line if line.startswith(b"INFO ") else None


# -- a minimal RESP2 client, enough to look inside Redis from a test


def encode_command(*args: str | bytes | int) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class RespReader:
    """Reads RESP2 replies from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.stream = sock.makefile("rb")

    def _line(self) -> bytes:
        line = self.stream.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError(f"connection closed mid-reply: {line!r}")
        return line[:-2]

    def read_raw(self) -> bytes:
        """The first line of a reply, as it came (``+PONG``, ``-NOAUTH ...``)."""
        return self._line()

    def read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self.stream.read(size + 2)
            return data[:-2]
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self.read() for _ in range(count)]
        raise ConnectionError(f"not RESP2: {line!r}")


# -- pytest fixtures (tests/cluster/conftest.py makes them visible to the cluster tests)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A plain Redis (no password, no TLS, no persistence), stopped after the test."""
    with RedisServer(tmp_path / "redis") as server:
        assert isinstance(server, RedisServer)
        yield server


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A plain NATS (no auth, no TLS, no JetStream), stopped after the test."""
    with NatsServer(tmp_path / "nats") as server:
        assert isinstance(server, NatsServer)
        yield server
