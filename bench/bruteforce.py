"""Brute force: how many LOGIN attempts per second one address can make with wrong passwords.

Starts ``twistd msgbroker`` with the users plugin (``--users``, one user ``alice``), then
``--connections`` clients on 127.0.0.1 — one address — each in a loop: connect, ``LOGIN
alice password <guess>``, read the answer, close; for ``--seconds``. Every guess is wrong.

Reported:

- **answered**: LOGINs answered per second (every answer is ``401 password``, whether the
  password was checked or the address's throttle refused it unheard: the client cannot
  tell, which is the point);
- **checked**: of those, the guesses the broker actually checked against the hash per
  second (its log's ``... (password): wrong password`` lines): the rate at which the
  attacker learns anything;
- and, after the attack, whether the right password is refused (the address's bucket is
  empty) and how long until it is accepted.

Only the standard library; the broker runs on ``--python`` (default: this interpreter)::

    python bench/bruteforce.py --python .venv/bin/python
    python bench/bruteforce.py --connections 200 --seconds 20 --broker-arg=--login-attempts=1
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import procs

HOST = procs.HOST
PASSWORD = "correct horse battery staple"


def users_file(python: str, directory: Path) -> Path:
    """A users file with alice, made by ``msgbroker users add`` (the real command)."""
    import subprocess

    path = directory / "users"
    subprocess.run(
        [python, "-m", "msgbroker.cli", "users", "add", str(path), "alice"],
        input=f"{PASSWORD}\n",
        text=True,
        check=True,
        capture_output=True,
    )
    return path


def checked_guesses(text: str) -> int:
    """The guesses the broker checked against the hash, from its log's rate-limited
    ``login refused ... (password): wrong password`` lines (each one, and the ``N more
    like it`` it counts)."""
    lines = re.findall(
        r"login refused for 'alice' .*\(password\): wrong password"
        r"(?: \(and (\d+) more like it since the last line\))?",
        text,
    )
    return sum(1 + int(more or 0) for more in lines)


def attempt(port: int, guess: bytes, timeout: float = 30.0) -> bytes:
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(b"LOGIN alice password " + guess + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(256)
            if not chunk:
                break
            answer += chunk
        return answer


def attack(port: int, connections: int, seconds: float) -> tuple[int, dict[bytes, int], float]:
    """Guesses from ``connections`` loops for ``seconds``: (answered, answers, elapsed)."""
    answers: dict[bytes, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(number: int) -> None:
        count = 0
        while time.monotonic() < deadline:
            answer = attempt(port, b"guess-%d-%d" % (number, count))
            count += 1
            with lock:
                answers[answer] = answers.get(answer, 0) + 1

    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(answers.values()), answers, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--connections", type=int, default=50, help="concurrent loops [50]")
    parser.add_argument("--seconds", type=float, default=10.0, help="attack length [10]")
    parser.add_argument(
        "--broker-arg",
        action="append",
        default=[],
        help="extra twistd msgbroker argument, repeatable",
    )
    args = parser.parse_args(argv)
    if os.sep in args.python:  # the broker runs elsewhere: a relative path would not do
        args.python = os.path.abspath(args.python)
    procs.raise_nofile(args.connections + 1000)
    with tempfile.TemporaryDirectory(prefix="bruteforce") as tmp:
        directory = Path(tmp)
        users = users_file(args.python, directory)
        log = directory / "broker.log"
        extra = ["--users", str(users), *args.broker_arg]
        with procs.Broker(args.python, log, None, extra) as broker:
            answered, answers, elapsed = attack(broker.port, args.connections, args.seconds)
            # the bucket is empty now: how long until the right password gets in?
            started = time.monotonic()
            refused_right = 0
            while attempt(broker.port, PASSWORD.encode()) != b"200\n":
                refused_right += 1
            waited = time.monotonic() - started
            problems = broker.log_problems()
            command = " ".join(broker.argv[3:])  # after "python -c '...run()'"
        # read once the broker stopped: refusals are logged one line per address per 10 s,
        # each saying how many more like it there were, and what is pending is said at exit
        checked = checked_guesses(log.read_text(errors="replace"))
    print(f"broker: twistd {command}")
    print(f"{args.connections} connections from {HOST} for {elapsed:.1f} s, every guess wrong")
    print(
        f"answered: {answered} LOGINs, {answered / elapsed:.1f}/s; answers: "
        + ", ".join(f"{a.decode().strip()!r} x{n}" for a, n in answers.items())
    )
    print(f"checked:  {checked} guesses, {checked / elapsed:.2f}/s (the rest refused unheard)")
    print(f"then the right password: refused {refused_right} times, accepted after {waited:.2f} s")
    if problems:
        print("broker log problems:", *problems[:5], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
