"""The servers under test (msgbroker, Mosquitto) and py-spy, as child processes.

Every process started here is remembered and ended by its own pid (SIGTERM, then SIGKILL
after a timeout) when its ``with`` block ends, and again at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
_started: dict[int, subprocess.Popen] = {}


def _cleanup_all() -> None:
    for proc in list(_started.values()):
        stop_process(proc, timeout=3.0)


atexit.register(_cleanup_all)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """End ``proc`` (ours) by pid: ``sig``, wait up to ``timeout``, then SIGKILL."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5.0)
    finally:
        _started.pop(proc.pid, None)
    return proc.returncode


def spawn(argv: list[str], *, log: Path, cpus: set[int] | None, **kw) -> subprocess.Popen:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    # run in the log's directory: a server started from a source checkout would otherwise
    # find that checkout on sys.path ('' for ``python -c``), with its *.egg-info entry
    # points and its twisted/plugins, instead of only what its interpreter has installed
    kw.setdefault("cwd", log.parent)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=pin, **kw,  # noqa: PLW1509 (no threads here)
        )
    _started[proc.pid] = proc
    return proc


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB (VmRSS from /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (from /proc/PID/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def sched_ns(pid: int) -> tuple[int, int]:
    """(time on a CPU, time waiting on a run queue) of ``pid``'s threads so far, in ns
    (/proc/PID/task/*/schedstat: exact, where /proc/PID/stat counts 10 ms ticks). The
    second says how long the process was ready to run but its core was busy with others."""
    run = wait = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            ran, waited, _ = (task / "schedstat").read_text().split()
            run += int(ran)
            wait += int(waited)
    return run, wait


def core_times() -> dict[int, tuple[int, int]]:
    """Per core: (busy, total) jiffies from /proc/stat (busy excludes idle and iowait)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *values = line.split()
            numbers = [int(v) for v in values[:8]]
            total = sum(numbers)
            out[int(name[3:])] = (total - numbers[3] - numbers[4], total)
    return out


def core_busy(before: dict, after: dict) -> dict[int, float]:
    """Share of each core's time spent busy between two :func:`core_times` readings."""
    shares = {}
    for core, (busy, total) in after.items():
        b0, t0 = before.get(core, (0, 0))
        shares[core] = (busy - b0) / (total - t0) if total > t0 else 0.0
    return shares


def background_load(seconds: float = 1.0) -> float:
    """Cores' worth of CPU busy over ``seconds`` (everything on the machine)."""
    before = core_times()
    time.sleep(seconds)
    return sum(core_busy(before, core_times()).values())


def wait_quiet(threshold: float, patience: float) -> tuple[float, float]:
    """Wait (up to ``patience`` s) until the machine's load over one second is below
    ``threshold`` cores. Returns (the last load seen, seconds waited)."""
    start = time.monotonic()
    load = background_load()
    while load > threshold and time.monotonic() - start < patience:
        load = background_load()
    return load, time.monotonic() - start


def tcp_send_queue(local_port: int, remote_port: int) -> int | None:
    """Bytes queued in the kernel (unsent + unacknowledged) on the 127.0.0.1 socket
    ``local_port`` -> ``remote_port``, from /proc/net/tcp; None if there is none."""
    want_local = f"0100007F:{local_port:04X}"
    want_remote = f"0100007F:{remote_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want_local and fields[2] == want_remote:
            return int(fields[4].split(":")[0], 16)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_connectable(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before listening")
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {HOST}:{port} after {timeout:.0f} s")


class Server:
    """A running server: ``kind`` (``ssmp`` or ``mosquitto``), ``port``, ``pid``, ``log``."""

    kind: str
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def port_for(self, protocol: str) -> int:
        """The port of the listener for ``protocol`` (a wire protocol's ``name``)."""
        return self.port

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def sched_ns(self) -> tuple[int, int]:
        return sched_ns(self.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        return stop_process(self.proc, timeout=20.0)

    def log_problems(self) -> list[str]:
        """Lines of the server's log that look like errors (tracebacks, unhandled errors)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        pattern = re.compile(r"Traceback|Unhandled|CRITICAL|\bError\b")
        return [line for line in text.splitlines() if pattern.search(line)]

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Broker(Server):
    """``twistd -n msgbroker`` with an SSMP listener on loopback (and with ``stmp``, an STMP
    binary TCP one too; with ``mm2``, a Micromessage2 one) and ``open`` login."""

    kind = "ssmp"
    #: the /metrics scraper (``scrape_admin``); a class default, for subclasses with an
    #: ``__init__`` of their own (bench/reload.py)
    scraper: subprocess.Popen | None = None

    def __init__(
        self, python: str, log: Path, cpus: set[int] | None, extra: list[str],
        timeout: float = 30.0, stmp: bool = False, mm2: bool = False,
        scrape_admin: bool = False,
    ) -> None:
        self.log = log
        listeners = ["ssmp"] + (["stmp"] if stmp else []) + (["mm2"] if mm2 else [])
        argv = [
            python, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "msgbroker",
            *[arg for name in listeners for arg in ("--listen", f"{name}=tcp:0:interface={HOST}")],
            "--auth", "open",
            # scenario 5 opens 10,000 connections from one address: past the defaults
            "--max-connections", "0", "--max-connections-per-address", "0",
            *extra,
        ]
        self.argv = argv
        self.proc = spawn(argv, log=log, cpus=cpus)
        self.ports = {name: self._wait_for_port(timeout, name) for name in listeners}
        self.port = self.ports["ssmp"]
        for port in self.ports.values():
            wait_connectable(port, self.proc, timeout)
        if scrape_admin:
            admin = self._wait_for_port(timeout, "admin")
            wait_connectable(admin, self.proc, timeout)
            # a separate process (on the clients' cores, like them), as Prometheus would be
            self.scraper = spawn(
                [sys.executable, "-c", SCRAPER, f"http://{HOST}:{admin}/metrics"],
                log=log.with_name(log.stem + "-scraper.log"), cpus=None,
            )

    def stop(self) -> int:
        if self.scraper is not None:
            stop_process(self.scraper, timeout=5.0)
            self.scraper = None
        return super().stop()

    def port_for(self, protocol: str) -> int:
        return self.ports[protocol]

    def _wait_for_port(self, timeout: float, name: str = "ssmp") -> int:
        pattern = re.compile(rb"%s listening on tcp:127\.0\.0\.1:(\d+)" % name.encode())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = pattern.search(self.log.read_bytes())
            if match:
                return int(match.group(1))
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"broker exited ({self.proc.returncode}):\n{tail}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(
            f"broker did not log its {name} port within {timeout:.0f} s ({self.log})"
        )


#: scrapes a URL once a second (at most an hour) and logs how many scrapes and bytes
SCRAPER = """
import sys, time, urllib.request
url, scrapes, size, start = sys.argv[1], 0, 0, time.monotonic()
while time.monotonic() - start < 3600:
    size += len(urllib.request.urlopen(url, timeout=10).read())
    scrapes += 1
    print(f"{scrapes} scrapes, {size} bytes", flush=True)
    time.sleep(1.0 - (time.monotonic() - start) % 1.0)
"""


def find_mosquitto(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)),
        None,
    )


class Mosquitto(Server):
    """``mosquitto -c CONFIG``: one listener on loopback, anonymous allowed, no persistence."""

    kind = "mosquitto"

    def __init__(
        self, binary: str, workdir: Path, cpus: set[int] | None, queue_limit: int,
        timeout: float = 30.0,
    ) -> None:
        self.port = free_port()
        self.log = workdir / "mosquitto.log"
        self.config = workdir / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} {HOST}\n"
            "allow_anonymous true\n"
            "persistence false\n"
            # 0 = no limit: QoS 0 messages to a subscriber that is behind are queued rather
            # than silently dropped past 1000 (mosquitto's default), so every scenario
            # measures complete delivery, as it does for msgbroker
            f"max_queued_messages {queue_limit}\n"
            "log_dest stdout\n"
            "log_type error\nlog_type warning\n"
        )
        self.argv = [binary, "-c", str(self.config)]
        self.proc = spawn(self.argv, log=self.log, cpus=cpus)
        wait_connectable(self.port, self.proc, timeout)


class Profiler:
    """``py-spy record --pid PID`` around one measurement; collapsed stacks (``raw``)."""

    def __init__(self, pid: int, out: Path, rate: int, timeout: float = 20.0) -> None:
        # the one installed beside the harness's interpreter (a venv's bin/), or on PATH
        beside = Path(sys.executable).parent / "py-spy"
        binary = str(beside) if beside.exists() else shutil.which("py-spy")
        if binary is None:
            raise RuntimeError("py-spy not found (pip install py-spy)")
        self.out = out
        self.console = out.with_suffix(".console")
        argv = [
            binary, "record", "--pid", str(pid), "--rate", str(rate), "--idle", "--threads",
            "--nonblocking", "--format", "raw", "--output", str(out),
        ]
        self.proc = spawn(argv, log=self.console, cpus=None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.console.read_text(errors="replace")
            if "Sampling process" in text:
                time.sleep(0.2)  # let it take its first samples
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"py-spy exited ({self.proc.returncode}): {text.strip()}")
            time.sleep(0.05)
        stop_process(self.proc, timeout=5.0)
        raise TimeoutError("py-spy did not start sampling")

    def stop(self) -> Path:
        """Stop recording (SIGINT makes py-spy write its output) and return the file."""
        stop_process(self.proc, timeout=30.0, sig=signal.SIGINT)
        if not self.out.exists():
            text = self.console.read_text(errors="replace")
            raise RuntimeError(f"py-spy wrote no output: {text.strip()}")
        return self.out


def raise_nofile(wanted: int) -> int:
    """Raise RLIMIT_NOFILE (soft, up to the hard limit) for this process and its children;
    as root, the hard limit too when it is below ``wanted`` (up to fs.nr_open)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        with contextlib.suppress(ValueError, OSError):  # not root: keep the hard limit
            nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
            hard = min(wanted, nr_open)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(wanted, soft)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def set_autogroup_nice(nice: int) -> None:
    """With sched_autogroup on, niceness only ranks processes within their session's group;
    the group's own nice (``/proc/self/autogroup``) ranks it against other sessions."""
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text(f"{nice}\n")


def pin_self(cpus: set[int] | None) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def default_python() -> str:
    return sys.executable
