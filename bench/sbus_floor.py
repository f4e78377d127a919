"""The "relay floor" of the sbus 1->1 scenarios (12-14): ``bench/sbus_relay.c``, a minimal
single-threaded relay over AF_UNIX SOCK_SEQPACKET, run as the extra kind ``relay`` beside
``sbus``, ``ssmp`` and ``mosquitto``.

It does what any relay must do per message (one ``recv`` from the publisher, one ``send``
to the subscriber, an epoll loop around them) and nothing more, so its msgs/s and its CPU
per delivery are what the kernel and the clients allow on this machine: the broker's figures
are read against it, measured in the same invocation with the same clients
(``sbus.publish_sbus``), pinned to the server core and measured like the broker.

The relay is compiled once per harness run with ``gcc -O2`` into the results directory;
without gcc (or if it fails to build) the ``relay`` kind is dropped with a one-line note.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import procs
from sbus_clients import wait_listening

KIND = "relay"
SOURCE = Path(__file__).resolve().parent / "sbus_relay.c"
#: the compiled relay, once :func:`prepare` has built it
_binary: Path | None = None


def build(out_dir: Path) -> Path | str:
    """Compile the relay into ``out_dir``: its path, or why it could not be built."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return "gcc not found"
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "sbus_relay"
    try:
        done = subprocess.run(
            [gcc, "-O2", "-Wall", "-o", str(binary), str(SOURCE)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"gcc failed: {e}"
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["?"])[0]
        return f"gcc failed ({done.returncode}): {first}"
    return binary


def prepare(kinds_of: dict[str, list[str]], out_dir: Path) -> None:
    """Build the relay if a scenario runs it; if it cannot be built, drop the ``relay``
    kind from every scenario (in place) with a one-line note instead of failing."""
    global _binary
    if not any(KIND in kinds for kinds in kinds_of.values()):
        return
    built = build(out_dir)
    if isinstance(built, Path):
        _binary = built
        return
    print(f"note: no relay floor in the sbus scenarios: {built}")
    for kinds in kinds_of.values():
        if KIND in kinds:
            kinds.remove(KIND)


class Relay(procs.Server):
    """The compiled relay listening on ``sbus_path`` (a fresh short directory under /tmp,
    removed when it stops), with the attributes ``sbus.publish_sbus`` reads of a broker."""

    kind = KIND
    sbus_kind = KIND
    policy = "relay floor: no queues, a full subscriber blocks it"

    def __init__(self, binary: Path, log: Path, cpus, timeout: float = 30.0) -> None:
        self.log = log
        self.sbus_dir = tempfile.mkdtemp(prefix="sb", dir="/tmp")
        self.sbus_path = os.path.join(self.sbus_dir, "bus")
        try:
            self.argv = [str(binary), self.sbus_path]
            self.proc = procs.spawn(self.argv, log=log, cpus=cpus)
            line = b"relay listening on " + self.sbus_path.encode()
            wait_listening(self.proc, self.log, line, self.sbus_path, timeout, "the relay")
        except BaseException:
            if hasattr(self, "proc"):
                self.stop()
            shutil.rmtree(self.sbus_dir, ignore_errors=True)
            raise

    def stop(self) -> int:
        try:
            return super().stop()
        finally:
            shutil.rmtree(self.sbus_dir, ignore_errors=True)


def start_relay(log: Path, cpus) -> Relay:
    if _binary is None:
        raise RuntimeError("the relay was not built (sbus_floor.prepare)")
    return Relay(_binary, log, cpus)
