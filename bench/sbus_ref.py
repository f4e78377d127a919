"""The C reference sbus daemon (``sbusd`` of https://codeberg.org/maandree/sbus, mirrored at
github.com/maandree/sbus) as the extra kind ``sbusd`` of the sbus scenarios, beside
``sbus`` (msgbroker's sbus listener) and the relay floor (bench/sbus_floor.py).

Nothing of the reference is in this repository: ``--sbusd PATH`` names a built binary, or
``--sbusd-src DIR`` a checkout of its sources, which the harness copies into the results
directory and builds there (``make sbusd``, or ``gcc`` with its config.mk's flags when
there is no make). Without either, or if it does not build, the ``sbusd`` kind is left out
with a one-line note.

What the reference does per packet (sbusd.c, for reading its figures): one ``epoll_wait``,
one ``recv`` (level-triggered: a socket with 100 packets waiting costs 100 ``epoll_wait``
calls), and for a ``MSG`` a walk over every client, matching the key against each of that
client's patterns (libsbusd_issubed: its own wildcard matcher, no index), and one blocking
``send`` to each client that matches. No credentials check per packet (only on ``SUB
!/cred/...``), no flood control (its ``CMSG blocking/...`` are remembered and ignored: a
full subscriber blocks the whole bus in ``send``), no queues, no counters.

It is started the way socket activation would: the harness binds and listens on a fresh
``/tmp/sbXXXX/bus`` and hands the socket over as ``sbusd -f -a /dev/fd/N`` (the reference
reads an inherited listening socket), so the socket accepts before sbusd runs, and a
``CMSG !/cred/whoami`` round trip then shows that sbusd serves it. sbusd runs pinned to
the server core; its CPU is measured like the broker's.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import procs
from sbus_clients import WHOAMI, _whoami_answer, connect

KIND = "sbusd"
#: the flags of the reference's config.mk (what ``make`` would use), for the gcc fallback
CFLAGS = ["-std=c99", "-Wall", "-O2"]
CPPFLAGS = ["-D_DEFAULT_SOURCE", "-D_BSD_SOURCE", "-D_XOPEN_SOURCE=700", "-D_GNU_SOURCE"]
#: the binary, once :func:`prepare` found or built it
_binary: Path | None = None


def add_options(p) -> None:
    p.add_argument(
        "--sbusd",
        metavar="PATH",
        help="the C reference sbusd (maandree/sbus), built: run as kind 'sbusd' in the sbus "
        "scenarios (12-15, 24, 25)",
    )
    p.add_argument(
        "--sbusd-src",
        metavar="DIR",
        help="the reference's sources (a checkout of maandree/sbus): built into the results "
        "directory and run as kind 'sbusd'",
    )


def build(src: Path, out_dir: Path) -> Path | str:
    """Copy ``src`` to ``out_dir/sbusd-src`` and build ``sbusd`` there: its path, or why not."""
    if not (src / "sbusd.c").is_file():
        return f"no sbusd.c in {src}"
    work = out_dir / "sbusd-src"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git", "*.o", "*.a", "sbusd"))
    make, gcc = shutil.which("make"), shutil.which("gcc") or shutil.which("cc")
    if make and (work / "Makefile").is_file():
        argv = [make, "-C", str(work), "sbusd"]
    elif gcc:
        sources = [str(work / name) for name in ("sbusd.c", "libsbusd.c")]
        argv = [gcc, *CFLAGS, *CPPFLAGS, "-o", str(work / "sbusd"), *sources]
    else:
        return "neither make nor gcc found"
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"build failed: {e}"
    binary = work / "sbusd"
    if done.returncode != 0 or not binary.is_file():
        first = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"build failed ({done.returncode}): {first}"
    return binary


def prepare(kinds_of: dict[str, list[str]], args, out_dir: Path) -> None:
    """Find or build sbusd when some scenario runs it; else drop the ``sbusd`` kind from
    every scenario (in place), with a one-line note when that was not asked for."""
    global _binary
    if not any(KIND in kinds for kinds in kinds_of.values()):
        return
    why = "no --sbusd PATH or --sbusd-src DIR given"
    if args.sbusd:
        binary = Path(args.sbusd).resolve()
        if os.access(binary, os.X_OK) and binary.is_file():
            _binary = binary
            return
        why = f"{args.sbusd} is not an executable file"
    elif args.sbusd_src:
        built = build(Path(args.sbusd_src).resolve(), out_dir)
        if isinstance(built, Path):
            _binary = built
            return
        why = built
    print(f"note: no C reference sbusd in the sbus scenarios: {why}")
    for kinds in kinds_of.values():
        if KIND in kinds:
            kinds.remove(KIND)


class Sbusd(procs.Server):
    """The reference sbusd serving a listening socket the harness bound at ``sbus_path``
    (a fresh short directory under /tmp, removed when it stops), with the attributes
    ``sbus.publish_sbus`` reads of a broker."""

    kind = KIND
    sbus_kind = KIND
    policy = "the C reference: blocking sends, no queues, no flood control"

    def __init__(self, binary: Path, log: Path, cpus, timeout: float = 30.0) -> None:
        self.log = log
        self.sbus_dir = tempfile.mkdtemp(prefix="sb", dir="/tmp")
        self.sbus_path = os.path.join(self.sbus_dir, "bus")
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listening.bind(self.sbus_path)
            listening.listen(socket.SOMAXCONN)
            fd = listening.fileno()
            self.argv = [str(binary), "-f", "-a", f"/dev/fd/{fd}"]
            self.proc = procs.spawn(self.argv, log=log, cpus=cpus, pass_fds=(fd,))
            listening.close()  # sbusd has its own copy
            self._wait_serving(timeout)
        except BaseException:
            listening.close()
            if hasattr(self, "proc"):
                self.stop()
            shutil.rmtree(self.sbus_dir, ignore_errors=True)
            raise

    def _wait_serving(self, timeout: float) -> None:
        """The socket accepts already (it was bound and listening before sbusd started): a
        whoami answered shows that sbusd reads it (a kernel timeout bounds the wait)."""
        sock = connect(self.sbus_path, timeout)
        try:
            sock.send(WHOAMI)
            _whoami_answer(sock, timeout)
        except Exception as e:
            tail = self.log.read_text(errors="replace")[-300:]
            raise RuntimeError(f"sbusd does not answer ({self.log}): {e} {tail}") from e
        finally:
            sock.close()

    def stop(self) -> int:
        try:
            return super().stop()
        finally:
            shutil.rmtree(self.sbus_dir, ignore_errors=True)


def start_sbusd(log: Path, cpus) -> Sbusd:
    if _binary is None:
        raise RuntimeError("sbusd was not found or built (sbus_ref.prepare)")
    return Sbusd(_binary, log, cpus)
