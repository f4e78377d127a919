"""``msgbroker PROTOCOL sub`` survives a broker restart, as a person sees it: a real broker
process (``twistd -n msgbroker``) is stopped by its PID and started again on the same
address, and the ``sub`` process prints what was published before and after (one line each)
and says on stderr that it lost the broker and reconnected."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgbroker.plugins.mm2.client import BlockingMM2Client
from msgbroker.plugins.sbus.client import BlockingSbusClient
from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from msgbroker.plugins.stmp.client import BlockingSTMPClient
from tests.ssmp.e2e_support import (
    WAIT,
    LineReader,
    parse_address,
    stop_process,
    twistd_command,
)

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))

#: protocol: (the listener, the command and its options, a topic, what sub prints for a
#: message published as "pub" with payload P, as a regular expression)
CASES = {
    "ssmp": ("ssmp=tcp:{port}:interface=127.0.0.1", ("ssmp",), "news", r"^pub news {}$"),
    "stmp": ("stmp=tcp:{port}:interface=127.0.0.1", ("stmp",), "news", r"^pub news {}$"),
    "stmp-ws": (
        "stmp-ws=tcp:{port}:interface=127.0.0.1", ("stmp", "--ws"), "news", r"^pub news {}$"
    ),
    "mm2": ("mm2=tcp:{port}:interface=127.0.0.1", ("mm2",), "news", r"^news {}$"),
    "sbus": ("sbus=unix:{path}", ("sbus",), "news/today", r"^news/today {}$"),
}


def command(options: tuple[str, ...], action: str, *args: str) -> list[str]:
    """``msgbroker COMMAND ACTION ARGS OPTIONS`` (options go after the action)."""
    return [MSGBROKER, options[0], action, *args, *options[1:]]


class BrokerProcess:
    """``twistd -n msgbroker`` with one listener, which :meth:`restart` stops by PID
    (SIGTERM) and starts again on the same address."""

    def __init__(self, directory: Path, protocol: str) -> None:
        self.directory = directory
        self.protocol = protocol
        self.listener = CASES[protocol][0]
        self.port = 0
        self.path = str(directory / "bus")
        self.process: subprocess.Popen[str] | None = None
        self.log: LineReader | None = None

    def start(self) -> None:
        listener = self.listener.format(port=self.port, path=self.path)
        self.process = subprocess.Popen(
            twistd_command("--listen", listener, "--auth", "open"),
            cwd=self.directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self.log = LineReader(self.process.stdout)
        address = self.log.wait_for(rf"{self.protocol} listening on (\S+)").group(1)
        if address.startswith(("tcp:", "tls:")):
            self.port = parse_address(address)[1]

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            os.kill(process.pid, signal.SIGTERM)  # by its PID, as an operator would
            process.wait(timeout=WAIT)
            assert process.stdout is not None
            process.stdout.close()

    def where(self) -> tuple[str, ...]:
        """The options that reach it."""
        if self.protocol == "sbus":
            return ("-a", self.path)
        return ("--port", str(self.port))

    def shown(self) -> str:
        return self.path if self.protocol == "sbus" else f"127.0.0.1:{self.port}"


@pytest.fixture
def directory() -> Iterator[Path]:
    # short: a unix socket path is at most 107 bytes
    path = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def running(command: list[str]) -> Iterator[tuple[subprocess.Popen[str], LineReader, LineReader]]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = LineReader(process.stdout), LineReader(process.stderr)
    try:
        yield process, out, err
    finally:
        stop_process(process, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def pub(broker: BrokerProcess, topic: str, payload: str) -> None:
    """Publish ``payload`` to ``topic`` as ``pub`` (in this process: only sub's process
    matters here)."""
    data = payload.encode()
    if broker.protocol == "sbus":
        with BlockingSbusClient(broker.path, timeout=WAIT) as sbus:
            sbus.publish(topic.encode(), data)
            sbus.sync()
    elif broker.protocol == "ssmp":
        with BlockingSSMPClient("127.0.0.1", broker.port, "pub", timeout=WAIT) as ssmp:
            ssmp.mcast(topic, data)
    elif broker.protocol == "mm2":
        with BlockingMM2Client("127.0.0.1", broker.port, "pub", timeout=WAIT) as mm2:
            mm2.publish(topic, data)
            assert mm2.wait_acked()
    else:
        ws = broker.protocol == "stmp-ws"
        with BlockingSTMPClient("127.0.0.1", broker.port, "pub", ws=ws, timeout=WAIT) as stmp:
            stmp.publish(topic, data)


@pytest.mark.parametrize("protocol", sorted(CASES))
def test_sub_survives_a_broker_restart(directory, protocol):
    _, options, topic, shown = CASES[protocol]
    broker = BrokerProcess(directory, protocol)
    broker.start()
    try:
        sub_command = [*command(options, "sub", topic), *broker.where()]
        with running(sub_command) as (sub, out, err):
            err.wait_for(r"^msgbroker: subscribed to ")
            pub(broker, topic, "before")
            out.wait_for(shown.format("before"))

            broker.stop()
            assert err.wait_for("lost").string == (
                f"msgbroker: lost the connection to {broker.shown()} "
                f"({_closed(protocol)}); reconnecting\n"
            )
            broker.start()
            assert err.wait_for("reconnected").string == (
                f"msgbroker: reconnected to {broker.shown()}; subscribed to {topic} again\n"
            )
            pub(broker, topic, "after")
            out.wait_for(shown.format("after"))

            assert stop_process(sub, signal.SIGINT) == 0
            assert len(out.lines) == 2 and out.rest() == ""
            stderr = "".join(err.lines) + err.rest()
        assert "Traceback" not in stderr and "error" not in stderr
    finally:
        broker.stop()


def _closed(protocol: str) -> str:
    return "the server closed the connection" if protocol == "mm2" else (
        "the broker closed the connection"
    )
