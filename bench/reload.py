"""Reload under load: messages lost during a SIGHUP while 1,000 clients publish (target 0).

Starts ``twistd msgbroker --config FILE`` (an SSMP listener, ``[auth]`` with the users
plugin's password file), logs in ``--publishers`` SSMP publishers (each with its own
identity and password, 1,000 by default) and one subscriber, and has the publishers send
``MCAST load <publisher>:<seq>`` at ``--rate`` messages a second in all for ``--seconds``.
Halfway through it replaces the users file (made by ``msgbroker users add``: a new user,
and a new password for a publisher that is logged in) and sends the broker SIGHUP, while
the load goes on.

At the end it counts, per publisher, the MCASTs the broker accepted (its ``200`` replies,
in order) and the ones the subscriber received, and reports lost (accepted, never
received), duplicated and unexpected messages, connections closed, and the accepted rate
in the second around the SIGHUP against the rest. Only the standard library::

    python bench/reload.py --python .venv/bin/python
    python bench/reload.py --publishers 1000 --rate 20000 --seconds 10
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import procs

HOST = procs.HOST
PASSWORD = b"load-password"


def make_users(python: str, path: Path, count: int) -> None:
    """``pub-0`` .. ``pub-N`` and ``sub``, all with :data:`PASSWORD`: one hash made by
    ``msgbroker users add`` (the real command), copied (the same salt, which a bench may)."""
    subprocess.run(
        [python, "-m", "msgbroker.cli", "users", "add", str(path), "sub"],
        input=PASSWORD + b"\n",
        check=True,
        capture_output=True,
    )
    line = path.read_text().strip()
    hashed = line.rpartition(":")[2]
    path.write_text(line + "\n" + "".join(f"pub-{i}:{hashed}\n" for i in range(count)))


def write_config(path: Path, users: Path) -> None:
    path.write_text(
        'listen = ["ssmp=tcp:0:interface=127.0.0.1"]\n'
        "max-connections = 0\nmax-connections-per-address = 0\n"
        # 1,000 password checks of ~30 ms on two threads take longer than the default 10 s,
        # and the first connections logged in stay silent meanwhile (no PONG to a PING)
        "login-timeout = 300\nkeepalive = 600\n"
        f'[auth]\nschemes = ["password"]\nusers = "{users}"\n'
    )


class Broker(procs.Broker):
    """twistd msgbroker --config FILE (the listeners are the file's)."""

    def __init__(self, python: str, log: Path, config: Path, timeout: float = 60.0) -> None:
        self.log = log
        self.argv = [
            python,
            "-c",
            "from twisted.scripts.twistd import run; run()",
            "-n",
            "--pidfile=",
            "msgbroker",
            "--config",
            str(config),
        ]
        self.proc = procs.spawn(self.argv, log=log, cpus=None)
        self.ports = {"ssmp": self._wait_for_port(timeout)}
        self.port = self.ports["ssmp"]
        procs.wait_connectable(self.port, self.proc, timeout)


def log_in(port: int, identities: list[str], timeout: float) -> list[socket.socket]:
    """Connections logged in as ``identities`` (the LOGINs all sent, then the answers read:
    the broker checks the passwords in its threads meanwhile)."""
    socks = []
    for identity in identities:
        sock = socket.create_connection((HOST, port), timeout=timeout)
        sock.sendall(b"LOGIN %s password %s\n" % (identity.encode(), PASSWORD))
        socks.append(sock)
    for identity, sock in zip(identities, socks, strict=True):
        answer = sock.recv(16)
        if answer != b"200\n":
            raise RuntimeError(f"login of {identity} answered {answer!r}")
    return socks


class Subscriber(threading.Thread):
    """Reads everything the subscriber gets into one buffer."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.chunks: list[bytes] = []
        self.received = 0  # lines
        self.stop = False

    def run(self) -> None:
        self.sock.settimeout(0.5)
        while not self.stop:
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                break
            self.chunks.append(chunk)
            self.received += chunk.count(b"\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--publishers", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20_000.0, help="MCASTs/s in all [20000]")
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time [10]")
    args = parser.parse_args(argv)
    if os.sep in args.python:  # the broker runs elsewhere: a relative path would not do
        args.python = os.path.abspath(args.python)
    nofile = procs.raise_nofile(args.publishers + 1000)
    if nofile < args.publishers + 100:
        print(f"RLIMIT_NOFILE is {nofile}: too few for {args.publishers} publishers")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="reload"))
    users, config, log = tmp / "users", tmp / "broker.toml", tmp / "broker.log"
    make_users(args.python, users, args.publishers)
    write_config(config, users)
    # what SIGHUP will find: a new user, and pub-0 (logged in meanwhile) with a new password
    changed = tmp / "users.new"
    changed.write_text(users.read_text())
    for identity, password in (("newcomer", b"new"), ("pub-0", b"changed")):
        subprocess.run(
            [args.python, "-m", "msgbroker.cli", "users", "add", str(changed), identity],
            input=password + b"\n",
            check=True,
            capture_output=True,
        )
    with Broker(args.python, log, config) as broker:
        started = time.monotonic()
        (sub,) = log_in(broker.port, ["sub"], 60.0)
        sub.sendall(b"SUBSCRIBE load\n")
        assert sub.recv(16) == b"200\n"
        pubs = log_in(broker.port, [f"pub-{i}" for i in range(args.publishers)], 120.0)
        print(
            f"{args.publishers} publishers and a subscriber logged in (password) "
            f"in {time.monotonic() - started:.1f} s"
        )
        reader = Subscriber(sub)
        reader.start()
        selector = selectors.DefaultSelector()
        for index, sock in enumerate(pubs):
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, index)
        sent = [0] * len(pubs)
        accepted = [0] * len(pubs)
        sent_total = accepted_total = 0
        closed: set[int] = set()
        per_second: list[tuple[float, int]] = []  # (time, accepted so far)
        total = int(args.rate * args.seconds)
        tick = 0.01
        per_tick = max(1, int(args.rate * tick))
        hup_at = started_load = time.monotonic()
        hup_at += args.seconds / 2
        hup_sent = reloaded_at = None
        next_publisher = 0
        while sent_total < total or accepted_total < sent_total - len(closed):
            now = time.monotonic()
            if hup_sent is None and now >= hup_at:
                os.replace(changed, users)  # the new users file, atomically
                hup_sent = now
                os.kill(broker.pid, signal.SIGHUP)
            if reloaded_at is None and hup_sent is not None:
                text = log.read_text(errors="replace")
                if "SIGHUP: reloaded" in text or "SIGHUP: reload refused" in text:
                    reloaded_at = now
            goal = min(total, int((now - started_load) * args.rate) + per_tick)
            while sent_total < goal:
                i = next_publisher
                next_publisher = (next_publisher + 1) % len(pubs)
                if i in closed:
                    continue
                try:
                    pubs[i].send(b"MCAST load %d:%d\n" % (i, sent[i]))
                    sent[i] += 1
                    sent_total += 1
                except BlockingIOError:
                    break
            for key, _ in selector.select(tick):
                i = key.data
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    closed.add(i)
                    selector.unregister(key.fileobj)
                    continue
                replies = data.count(b"200\n")
                accepted[i] += replies
                accepted_total += replies
            if not per_second or now - per_second[-1][0] >= 0.25:
                per_second.append((now, accepted_total))
            if now - started_load > args.seconds + 60:
                print("gave up waiting for replies")
                break
        elapsed = time.monotonic() - started_load
        # every accepted MCAST is in the subscriber's stream: wait for its end
        expected = accepted_total
        deadline = time.monotonic() + 30
        while reader.received < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.stop = True
        reader.join()
        alive = broker.alive()
        problems = broker.log_problems()
        hup_lines = re.findall(r".*SIGHUP: .*", log.read_text(errors="replace"))
    stream = b"".join(reader.chunks)
    got: dict[int, list[int]] = {}
    unexpected = 0
    for match in re.finditer(rb"000 pub-(\d+) MCAST load (\d+):(\d+)\n", stream):
        publisher, owner, seq = int(match[1]), int(match[2]), int(match[3])
        if publisher != owner:
            unexpected += 1
        got.setdefault(owner, []).append(seq)
    lost = duplicated = 0
    for i, count in enumerate(accepted):
        seqs = got.get(i, [])
        lost += len(set(range(count)) - set(seqs))
        duplicated += len(seqs) - len(set(seqs))
        unexpected += len([s for s in seqs if s >= sent[i]])
    print(
        f"published {sum(sent)} MCASTs in {elapsed:.1f} s from {len(pubs)} connections "
        f"({sum(sent) / elapsed:.0f}/s); accepted {sum(accepted)}; received {reader.received}"
    )
    print(
        f"SIGHUP at {hup_sent - started_load:.2f} s; log: {hup_lines}"
        if hup_sent
        else "SIGHUP not sent"
    )
    if reloaded_at and hup_sent:
        window = [(t, n) for t, n in per_second if hup_sent - 0.5 <= t <= hup_sent + 0.5]
        if len(window) >= 2:
            rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
            print(f"accepted around the SIGHUP (±0.5 s): {rate:.0f}/s")
    print(
        f"lost: {lost}  duplicated: {duplicated}  unexpected: {unexpected}  "
        f"publisher connections closed: {len(closed)}  broker alive: {alive}"
    )
    if problems:
        print("broker log problems:", *problems[:5], sep="\n  ")
    for sock in pubs:
        sock.close()
    sub.close()
    return 0 if lost == 0 and not closed else 1


if __name__ == "__main__":
    sys.exit(main())
