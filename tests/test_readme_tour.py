"""The README's five-minute tour, walked in order as a new user walks it: every command of
its client blocks is read from README.md and run as written (only pointed at this test's
broker: its ports and sbus socket are free ones, not the embedded defaults), the
subscribers as processes of their own, and what they print is what the README's comments
say. The hand-typed SSMP session (``nc``) is replayed line by line and must get the
answers shown. The journal and Spark part is left out (it takes minutes of Spark; its
commands are those of tests/analytics)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ssmp.e2e_support import WAIT, LineReader, parse_address, stop_process, twistd_command

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent


def tour() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## A five-minute tour")
    return text[start : text.index("\n## ", start + 1)]


def blocks(text: str) -> list[list[str]]:
    """The ``sh`` blocks' lines, joined where a line is only a comment continuing the one
    before it."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        lines: list[str] = []
        for line in block.splitlines():
            if line.strip().startswith("#") and lines:
                lines[-1] += "  " + line.strip()
            else:
                lines.append(line)
        found.append(lines)
    return found


def command_and_comment(line: str) -> tuple[list[str], str]:
    words = shlex.split(line, comments=True)
    comment = line.partition("  #")[2].strip()
    return words, comment


class Broker:
    """``twistd -n msgbroker`` on free ports, every protocol of the tour."""

    def __init__(self, directory: Path) -> None:
        self.sbus = str(directory / "sbus.socket")
        self.process = subprocess.Popen(
            twistd_command(
                "--listen",
                "ssmp=tcp:0:interface=127.0.0.1",
                "--listen",
                "stmp=tcp:0:interface=127.0.0.1",
                "--listen",
                "stmp-ws=tcp:0:interface=127.0.0.1",
                "--listen",
                f"sbus=unix:{self.sbus}",
                "--auth",
                "open",
            ),
            cwd=directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.log = LineReader(self.process.stdout)
        self.ports = {}
        for _ in range(4):
            found = self.log.wait_for(r"(\S+) listening on (\S+)")
            if found.group(1) != "sbus":
                self.ports[found.group(1)] = parse_address(found.group(2))[1]

    def where(self, words: list[str]) -> list[str]:
        """``words`` (a README command) pointed at this broker instead of the defaults."""
        program = Path(words[0]).name
        words = [str(BIN / program), *words[1:]]
        if program == "sbusd":
            return words
        protocol = words[1]
        if protocol == "ssmp":
            return [*words, "--port", str(self.ports["ssmp"])]
        if protocol == "stmp":
            port = self.ports["stmp-ws" if "--ws" in words else "stmp"]
            return [*words, "--port", str(port)]
        return words  # sbus: $SBUS_ADDRESS


@pytest.fixture
def broker(tmp_path) -> Iterator[Broker]:
    running = Broker(tmp_path)
    try:
        yield running
    finally:
        stop_process(running.process, signal.SIGTERM)


class Subscriber:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.out = LineReader(self.process.stdout)
        self.err = LineReader(self.process.stderr)
        self.err.wait_for("subscribed to")  # on stderr, once the broker has the subscription

    def printed(self, line: str) -> None:
        self.out.wait_for("^" + re.escape(line) + "$")


def said(comment: str, text: str) -> None:
    """The README's comment on a command says ``text``."""
    assert text in comment, (comment, text)


def test_the_tour_walked_in_order(broker, tmp_path):
    env = {**os.environ, "SBUS_ADDRESS": broker.sbus}
    subs: dict[str, Subscriber] = {}
    walked = blocks(tour())
    session_at = next(i for i, block in enumerate(walked) if block[0].startswith("$ nc "))
    lines = [line for block in walked[:session_at] for line in block]  # up to the journal
    assert lines[0] == "scripts/run"
    client = (".venv/bin/msgbroker", ".venv/bin/sbusd")
    commands = [line for line in lines if line.startswith(client)]
    assert len(commands) == 10
    cli_id = r"cli-\d+-[0-9a-f]+"
    try:
        for line in commands:
            words, comment = command_and_comment(line)
            command = broker.where(words)
            if words[2:3] == ["sub"]:
                name = "sbus" if words[1] == "sbus" else words[words.index("--id") + 1]
                subs[name] = Subscriber(command, env)
                if name == "alice":
                    said(comment, "prints: bob news hello")
                elif name == "sbus":
                    said(comment, "prints KEY PAYLOAD: alerts/fire get out")
                continue
            if words[0].endswith("sbusd"):
                assert command[-2:] == ["-a", "/tmp/bus"]
                sbusd = subprocess.Popen(
                    [*command[:-1], str(tmp_path / "bus")],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                assert LineReader(sbusd.stdout).rest() == ""  # -f: stdout closes when ready
                said(comment, "Ctrl-C stops it")
                assert stop_process(sbusd, signal.SIGINT) == 0
                continue
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=WAIT, env=env, check=False
            )
            assert done.returncode == 0, (line, done.stderr)
            # where each publish shows up, as the README says
            shows: dict[str, str] = {}
            if words[1:3] == ["ssmp", "pub"] and words[4] == "hello":
                shows = {"alice": "bob news hello"}
            elif words[1:3] == ["ssmp", "ucast"]:
                said(comment, "alice's sub: cli-PID-XXXX @alice just for you")
                shows = {"alice": cli_id + " @alice just for you"}
            elif words[1:3] == ["stmp", "pub"]:
                said(comment, "over WebSocket: alice's and carol's subs print it")
                shows = dict.fromkeys(("alice", "carol"), cli_id + " news from stmp")
            elif words[1:3] == ["stmp", "call"]:
                said(comment, "0x00 Ok; both subs: dave news raw request")
                assert done.stdout.startswith("0x00 Ok\n")
                shows = dict.fromkeys(("alice", "carol"), "dave news raw request")
            elif words[1:3] == ["sbus", "pub"]:
                shows = {"sbus": "alerts/fire get out"}
            elif words[1:3] == ["ssmp", "pub"]:
                said(comment, "every sub prints it (sbus: news hello again)")
                shows = {
                    "alice": "bob news hello again",
                    "carol": "bob news hello again",
                    "sbus": "news hello again",
                }
            else:
                raise AssertionError(f"a command the test does not know: {line}")
            for name, printed in shows.items():
                subs[name].out.wait_for("^" + printed + "$")
        assert set(subs) == {"alice", "carol", "sbus"}

        # the SSMP session typed into nc, with its answers
        session = next(block for block in blocks(tour()) if block[0].startswith("$ nc "))
        assert session[0] == "$ nc 127.0.0.1 4444"
        typed = [line for line in session[1:] if not re.match(r"\d{3}\b", line)]
        shown = [line for line in session[1:] if re.match(r"\d{3}\b", line)]
        with socket.create_connection(("127.0.0.1", broker.ports["ssmp"]), timeout=WAIT) as nc:
            reader = nc.makefile("r")
            answers: list[str] = []
            for line in typed:
                nc.sendall(line.encode() + b"\n")
                answers.append(reader.readline().rstrip("\n"))
                while answers[-1].startswith("000 "):  # presence: the answer follows
                    answers.append(reader.readline().rstrip("\n"))
            if len(answers) < len(shown):  # the presence after SUBSCRIBE's 200
                nc.settimeout(WAIT)
                answers += [reader.readline().rstrip("\n") for _ in shown[len(answers) :]]
        assert sorted(answers) == sorted(shown)
        for name in ("alice", "carol"):
            subs[name].printed("erin news hi everyone")
        subs["sbus"].printed("news hi everyone")
        # erin took no one's identity: every subscriber is still there
        assert all(sub.process.poll() is None for sub in subs.values())
    finally:
        for sub in subs.values():
            stop_process(sub.process, signal.SIGINT)
