"""Real ``redis-server`` and ``nats-server`` processes for the cluster tests.

Each server runs from Debian's binary (scripts/setup installs them) as a child process on a
free loopback port, in its own temporary directory, with no persistence unless a test asks
for it. Start-up is waited for on the server's own word: its output is read as a stream (and
copied to its log file) until it says it is ready (Redis "Ready to accept connections", NATS
"Server is ready") or exits, never by sleeping or polling; a server is stopped by its PID
(SIGTERM, then SIGKILL); a pause returns once the kernel reports the process stopped::

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

What happens inside Redis is waited on as an event too: :meth:`RedisServer.until` looks
again each time Redis runs one of the named commands (seen on a ``MONITOR`` connection),
:meth:`RedisServer.until_gone` wakes on the key's deletion or expiry (keyspace
notifications)::

    redis.until(lambda: pending(redis) == 0, "every entry acknowledged", after=("XACK",))
    redis.until_gone(stream, "the stream to expire")

A server dies with the thread that started it (``PR_SET_PDEATHSIG``), so a crashed or killed
test run leaves no engine behind: start servers from the test's own thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from attrs import define, field

from tests.certs import PKI, Issued

#: how long a start, a stop or a reply may take before the test fails
WAIT = 15.0
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
    #: the line of its output that says it serves (searched for in each line)
    ready_line = re.compile(b"")

    def __init__(self, directory: Path, pki: PKI | None = None) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pki = pki
        self.port = free_port()
        self.log_path = directory / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        #: what the running process's output said so far
        self._output = _Output()

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
        self.process = subprocess.Popen(
            self.command_line(),
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - one prctl call, bound beforehand
        )
        self.paused = False
        output = self._output = _Output()
        threading.Thread(
            target=self._copy_output, args=(self.process, output),
            name=f"{self.name}-{self.port}-output", daemon=True,
        ).start()  # fmt: skip

    def _copy_output(self, process: subprocess.Popen[bytes], output: _Output) -> None:
        """Copy the process's output to its log file line by line, noting its ready line."""
        assert process.stdout is not None
        with process.stdout as lines, self.log_path.open("ab") as log:
            for line in lines:
                log.write(line)
                log.flush()
                if not output.ready and self.ready_line.search(line):
                    output.ready = True
                    output.said.set()
        output.said.set()  # the output ended: it exited (or is about to)
        output.ended.set()

    def _wait_ready(self) -> None:
        """Wait for the ready line (or the end of the output); then it must answer its
        probe."""
        if not self._output.said.wait(WAIT):
            self.kill()
            raise ServerFailed(f"{self.name} did not say it is ready within {WAIT} s:\n"
                               f"{self.log_text()}")
        if not self._output.ready:
            self._reap()  # its output ended: it exits, and the log is whole
            raise ServerFailed(f"{self.name} exited at start-up:\n{self.log_text()}")
        try:  # ready by its word: it must answer as a ready server does
            with self.connect(timeout=WAIT) as sock:
                answered = self.probe(sock)
        except OSError as e:
            self.kill()
            raise ServerFailed(f"{self.name} said it is ready, then: {e}\n{self.log_text()}"
                               ) from e
        if not answered:
            self.kill()
            raise ServerFailed(f"{self.name} said it is ready, then answered otherwise:\n"
                               f"{self.log_text()}")

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
        """SIGSTOP: connections stay open but nothing is answered, until :meth:`resume`.
        Returns once every thread of the server has stopped (a signal is delivered
        asynchronously: a thread on the other core could still answer for a moment)."""
        self._signal(signal.SIGSTOP)
        self.paused = True
        # the kernel reports a child stopped once its whole thread group is (waitid
        # WSTOPPED); WNOWAIT leaves that report for nobody else to miss. In a helper
        # thread, so that the wait has a deadline.
        pid = self.pid
        stopped = threading.Event()

        def wait_stopped() -> None:
            # ChildProcessError: it exited meanwhile (the check below says so)
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOWAIT)
            stopped.set()

        threading.Thread(target=wait_stopped, name=f"{self.name}-stop", daemon=True).start()
        if not stopped.wait(WAIT) or not self._all_threads_stopped():
            raise ServerFailed(f"{self.name} did not stop on SIGSTOP")

    def _all_threads_stopped(self) -> bool:
        for stat in Path(f"/proc/{self.pid}/task").glob("*/stat"):
            try:
                text = stat.read_text()
            except FileNotFoundError:  # a thread that just ended
                continue
            if text[text.rindex(")") + 2] not in "Tt":
                return False
        return True

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
        self._output.ended.wait(WAIT)  # the log is whole (a stop's last lines too)

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
            if self.client_certificate is not None:
                context.load_cert_chain(self.client_certificate.cert,
                                        self.client_certificate.key)
            try:
                return context.wrap_socket(sock, server_hostname="localhost")
            except BaseException:
                sock.close()
                raise
        return sock

    tls_from_first_byte = True
    #: what the fixture's own connections present when the server asks for a certificate
    client_certificate: Issued | None = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@define
class _Output:
    """What a server process's output said: ``said`` is set at its ready line (``ready``)
    or at its end; ``ended`` once all of it is in the log file."""

    said: threading.Event = field(factory=threading.Event)
    ready: bool = False
    #: set once all of it is in the log file
    ended: threading.Event = field(factory=threading.Event)


class RedisServer(EngineServer):
    """``redis-server`` on a free port; ``durable=True`` keeps an append-only file across
    restarts (off: ``--save ''``, ``--appendonly no``, nothing is written)."""

    name = "redis"
    ready_line = re.compile(b"Ready to accept connections")

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        pki: PKI | None = None,
        client_certificates: bool = False,
        durable: bool = False,
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(directory, pki)
        self.password = password
        self.durable = durable
        self.extra = extra
        #: TLS clients must present a certificate of the test CA (``--tls-auth-clients yes``;
        #: the fixture's own connections present one)
        self.client_certificates = client_certificates
        if client_certificates:
            if pki is None:
                raise ValueError("client_certificates needs pki")
            self.client_certificate = pki.client("redis-fixture")

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
                "--tls-auth-clients", "yes" if self.client_certificates else "no",
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

    def _session(self, timeout: float) -> tuple[socket.socket, RespReader]:
        """A connection, logged in, and its reader."""
        sock = self.connect(timeout=timeout)
        reader = RespReader(sock)
        if self.password is not None:
            sock.sendall(encode_command("AUTH", self.password))
            reader.read()
        return sock, reader

    def until(
        self, check: Callable[[], bool], what: str, *, after: tuple[str, ...],
        timeout: float = WAIT,
    ) -> None:
        """Wait until ``check()`` holds: now, or after one of the commands ``after`` (as
        ``XACK``) ran in Redis, from any client or script — seen on a ``MONITOR`` connection,
        so nothing is polled. ``check`` may ask Redis (its own commands do not wake it)."""
        verbs = [b'"%s"' % verb.upper().encode() for verb in after]
        deadline = time.monotonic() + timeout
        sock, reader = self._session(timeout)
        with sock:
            sock.sendall(encode_command("MONITOR"))
            if reader.read() != "OK":
                raise RedisError("MONITOR refused")
            # from here on, every command Redis runs is reported: none is missed
            if check():
                return
            while True:
                line = _read_before(sock, reader, deadline, what)
                upper = line.upper()
                if any(verb in upper for verb in verbs) and check():
                    return

    def until_gone(self, key: str, what: str, timeout: float = WAIT) -> None:
        """Wait until ``key`` does not exist: now, or at its deletion or expiry (keyspace
        notifications for generic commands and expiry, turned on here)."""
        deadline = time.monotonic() + timeout
        self.command("CONFIG", "SET", "notify-keyspace-events", "Kgx")
        sock, reader = self._session(timeout)
        with sock:
            sock.sendall(encode_command("SUBSCRIBE", f"__keyspace@0__:{key}"))
            reader.read()  # subscribed: from here on, no deletion is missed
            while int(self.command("EXISTS", key)) != 0:
                _read_before(sock, reader, deadline, what, raw=False)


def _read_before(
    sock: socket.socket, reader: RespReader, deadline: float, what: str, raw: bool = True
) -> Any:
    """The next reply (its first line with ``raw``), or TimeoutError naming ``what``."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"still waiting for {what}")
    sock.settimeout(remaining)
    try:
        return reader.read_raw() if raw else reader.read()
    except TimeoutError:
        raise TimeoutError(f"still waiting for {what}") from None


class NatsServer(EngineServer):
    """``nats-server`` on a free port (no monitoring port); ``jetstream=True`` turns
    JetStream on with its store in this server's directory."""

    name = "nats"
    ready_line = re.compile(b"Server is ready")
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
