"""End-to-end test support: a real broker on real sockets, without pytest-twisted.

One private reactor (not the global one, so it cannot clash with tests that use the global
reactor or ``trial``) runs in a daemon thread for the whole test session. Tests in the main
thread talk to it through :meth:`ReactorThread.call`, which runs a function in the reactor
thread and waits for its result (unwrapping Deferreds) with a timeout, never a sleep::

    with running_broker(auth=("open",)) as broker:
        client = BlockingSSMPClient(broker.host, broker.port, "alice")
        proto = broker.call(connect, broker.reactor, broker.host, broker.port, identity="bob")

``twistd_broker(...)`` runs ``twistd -n msgbroker`` in a subprocess instead and reads the bound
port from its log.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attrs import frozen
from twisted.internet import defer
from twisted.python.failure import Failure

from msgbroker import BrokerConfig, Listener
from msgbroker.service import BrokerService

#: how long a test waits for anything the broker or a client should do promptly
WAIT = 10.0


class ReactorThread:
    """A private reactor running in a daemon thread."""

    def __init__(self) -> None:
        from twisted.internet.selectreactor import SelectReactor

        # a SelectReactor instance that is never installed as the global reactor
        self.reactor: Any = SelectReactor()
        self._thread = threading.Thread(
            target=self.reactor.run,
            kwargs={"installSignalHandlers": False},
            name="e2e-reactor",
            daemon=True,
        )
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = WAIT, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in the reactor thread; return its (Deferred's) result or
        raise its exception. Raises ``TimeoutError`` if it takes longer than ``timeout``."""
        results: queue.Queue[Any] = queue.Queue()

        def run() -> None:
            defer.maybeDeferred(fn, *args, **kwargs).addBoth(results.put)

        self.reactor.callFromThread(run)
        try:
            result = results.get(timeout=timeout)
        except queue.Empty:
            name = getattr(fn, "__name__", fn)
            raise TimeoutError(f"{name} took more than {timeout} s") from None
        if isinstance(result, Failure):
            result.raiseException()
        return result


_shared: ReactorThread | None = None
_shared_lock = threading.Lock()


def reactor_thread() -> ReactorThread:
    """The session-wide reactor thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ReactorThread()
        return _shared


@frozen(eq=False)
class RunningBroker:
    """A started :class:`BrokerService` and where its first listener is bound."""

    service: BrokerService
    host: str
    port: int
    thread: ReactorThread

    @property
    def reactor(self) -> Any:
        return self.thread.reactor

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = WAIT, **kwargs: Any) -> Any:
        return self.thread.call(fn, *args, timeout=timeout, **kwargs)


_ADDRESS = re.compile(r"(?:tcp|tls):(?P<host>[0-9.]+|\[[0-9a-f:]+\]):(?P<port>\d+)$")


def parse_address(text: str) -> tuple[str, int]:
    """``tcp:127.0.0.1:4444`` (or ``tls:...``) -> ("127.0.0.1", 4444)."""
    match = _ADDRESS.search(text)
    if match is None:
        raise ValueError(f"not a tcp address: {text!r}")
    return match["host"].strip("[]"), int(match["port"])


@contextlib.contextmanager
def running_broker(
    listeners: tuple[str, ...] = ("ssmp=tcp:0:interface=127.0.0.1",), **config: Any
) -> Iterator[RunningBroker]:
    """A broker in the shared reactor thread, listening on ``listeners`` (``PROTO=ENDPOINT``);
    ``config`` are further :class:`BrokerConfig` fields. Stopped (clients closed) on exit."""
    thread = reactor_thread()
    broker_config = BrokerConfig(
        listeners=tuple(Listener.parse(text) for text in listeners), **config
    ).validate()

    def start() -> BrokerService:
        service = BrokerService(broker_config, thread.reactor)
        service.startService()
        return service

    service = thread.call(start)
    try:
        host, port = parse_address(service.broker.listening[0][1])
        yield RunningBroker(service, host, port, thread)
    finally:
        if service.running:
            thread.call(service.stopService)


# -- a broker in a subprocess: twistd -n msgbroker --------------------------------------------



class LineReader:
    """Reads a text stream line by line in a daemon thread (so a chatty process never blocks
    on a full pipe); :meth:`wait_for` waits for a matching line, with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._ended = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        try:
            for line in stream:
                self._queue.put(line)
        except ValueError:  # closed under us
            pass
        self._queue.put(None)

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float = WAIT) -> re.Match[str]:
        """The first line not yet consumed that matches ``pattern`` (earlier ones are kept in
        ``lines``); fails if the stream ends or ``timeout`` passes first."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        while True:
            if self._ended:
                raise AssertionError(f"output ended before {regex.pattern!r}: {self.lines!r}")
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {regex.pattern!r} within {timeout} s: {self.lines!r}"
                ) from None
            if line is None:
                self._ended = True
                continue
            self.lines.append(line)
            match = regex.search(line)
            if match:
                return match

    def rest(self, timeout: float = WAIT) -> str:
        """Everything until the stream ends (the process exited)."""
        out = []
        while not self._ended:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"output did not end within {timeout} s") from None
            if line is None:
                self._ended = True
            else:
                self.lines.append(line)
                out.append(line)
        return "".join(out)


@frozen(eq=False)
class TwistdBroker:
    process: subprocess.Popen[str]
    host: str
    port: int
    log: LineReader


def twistd_command(*options: str) -> list[str]:
    twistd = Path(sys.executable).with_name("twistd")
    return [str(twistd), "-n", "--pidfile=", "msgbroker", *options]


@contextlib.contextmanager
def twistd_broker(directory: Path, *options: str) -> Iterator[TwistdBroker]:
    """``twistd -n msgbroker OPTIONS`` (default: SSMP on a free loopback port, open login),
    started in ``directory``; yields once its log says where SSMP listens."""
    options = options or ("--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open")
    process = subprocess.Popen(
        twistd_command(*options),
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log = LineReader(process.stdout)
    try:
        address = log.wait_for(r"ssmp listening on ((?:tcp|tls):\S+)")
        host, port = parse_address(address.group(1))
        yield TwistdBroker(process, host, port, log)
    finally:
        stop_process(process, signal.SIGTERM)


def stop_process(process: subprocess.Popen[Any], sig: int) -> int:
    """Send ``sig`` if it still runs, wait for the exit (kill after :data:`WAIT`), return
    the exit status."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


# -- helpers for clients ------------------------------------------------------------------------


class Inbox:
    """A callable that collects what it is called with; :meth:`get` is a Deferred of the
    next item (use it in the reactor thread, e.g. as ``on_message=inbox``)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waiters: list[defer.Deferred[Any]] = []
        self._next = 0

    def __call__(self, item: Any) -> None:
        self.items.append(item)
        if self._waiters:
            self._next += 1
            self._waiters.pop(0).callback(item)

    def get(self) -> defer.Deferred[Any]:
        if self._next < len(self.items):
            item = self.items[self._next]
            self._next += 1
            return defer.succeed(item)
        d: defer.Deferred[Any] = defer.Deferred()
        self._waiters.append(d)
        return d


class ScriptedServer:
    """A fake SSMP server on a real loopback socket, in a thread: it accepts one connection,
    answers its first line (the LOGIN) with ``200`` followed by ``script``, then records what
    the client sends until the client closes (:attr:`closed` is set)."""

    def __init__(self, script: bytes = b"") -> None:
        import socket

        self.script = script
        self.received = b""
        self.closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        self._listener.close()
        with conn:
            answered = False
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                self.received += data
                if not answered and b"\n" in self.received:
                    answered = True
                    conn.sendall(b"200\n" + self.script)
        self.closed.set()

    def wait_closed(self, timeout: float = WAIT) -> bytes:
        """Wait until the client closed the connection; what it sent."""
        if not self.closed.wait(timeout):
            raise AssertionError(f"the client did not close within {timeout} s")
        return self.received
