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
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attrs import frozen

from msgbroker import BrokerConfig, Listener

# the client kit's; tests everywhere import them from here
from msgbroker.clientkit.testing import WAIT, Inbox, ReactorThread  # noqa: F401
from msgbroker.service import BrokerService

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
    ``config`` are further :class:`BrokerConfig` fields. Stopped (clients closed) on exit,
    within a 3-second shutdown grace unless ``shutdown_grace`` says otherwise: a test that
    leaves a connection unread waits that long."""
    thread = reactor_thread()
    config.setdefault("shutdown_grace", 3.0)
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
            thread.call(service.stopService, timeout=broker_config.shutdown_grace + WAIT)


class RestartableBroker:
    """A broker in the shared reactor thread that :meth:`stop` stops and :meth:`start`
    starts again on the same addresses, as a restarted broker would be (the TCP ports bound
    first are kept: ``tcp:0`` and ``tls:0`` become the port they got)."""

    def __init__(self, listeners: tuple[str, ...], config: dict[str, Any]) -> None:
        self.thread = reactor_thread()
        self.listeners = listeners
        self.config = config
        self.service: BrokerService | None = None
        #: where each listener is bound, by protocol: (host, port) or a unix path
        self.addresses: dict[str, Any] = {}

    @property
    def reactor(self) -> Any:
        return self.thread.reactor

    @property
    def running(self) -> bool:
        return self.service is not None and self.service.running

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = WAIT, **kwargs: Any) -> Any:
        return self.thread.call(fn, *args, timeout=timeout, **kwargs)

    def port(self, protocol: str = "ssmp") -> int:
        port: int = self.addresses[protocol][1]
        return port

    def start(self) -> None:
        config = BrokerConfig(
            listeners=tuple(Listener.parse(text) for text in self.listeners), **self.config
        ).validate()

        def start() -> BrokerService:
            service = BrokerService(config, self.thread.reactor)
            service.startService()
            return service

        self.service = self.thread.call(start)
        fixed = []
        bound = zip(self.service.broker.listening, self.listeners, strict=True)
        for (listener, address), text in bound:
            match = _ADDRESS.search(address)
            if match is None:
                self.addresses[listener.protocol] = address.partition(":")[2]
                fixed.append(text)
                continue
            host, port = match["host"].strip("[]"), int(match["port"])
            self.addresses[listener.protocol] = (host, port)
            fixed.append(re.sub(r"=(tcp|tls):0(?=:|$)", rf"=\g<1>:{port}", text))
        self.listeners = tuple(fixed)

    def stop(self) -> None:
        if self.running:
            assert self.service is not None
            self.thread.call(self.service.stopService)


@contextlib.contextmanager
def restartable_broker(
    listeners: tuple[str, ...] = ("ssmp=tcp:0:interface=127.0.0.1",), **config: Any
) -> Iterator[RestartableBroker]:
    """A started :class:`RestartableBroker`, stopped on exit."""
    broker = RestartableBroker(listeners, {"auth": ("open",), **config})
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


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


class RawSSMP:
    """A raw SSMP client: bytes out, lines in."""

    def __init__(self, broker: RunningBroker) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=WAIT)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        line = self.file.readline()
        assert line, "the broker closed the connection"
        return line

    def request(self, data: bytes, reply: bytes = b"200\n") -> None:
        """Send ``data``; read as many lines as ``reply`` has, which must be it."""
        self.send(data)
        got = b"".join(self.line() for _ in range(reply.count(b"\n")))
        assert got == reply

    def until(self, wanted: bytes) -> None:
        """Read lines until ``wanted`` comes."""
        while self.line() != wanted:
            pass

    def eof(self) -> bool:
        return self.file.readline() == b""

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def raw_login(broker: RunningBroker, name: str) -> RawSSMP:
    """A :class:`RawSSMP` logged in as ``name`` with ``open``."""
    client = RawSSMP(broker)
    client.request(b"LOGIN %s open\n" % name.encode())
    return client
