"""Which client library should the cluster engine use? Measured, against a real local
redis-server and nats-server, in one invocation (issue 15; see bench/README.md).

    python bench/engine_clients.py --python .venv/bin/python     # every variant, 3 runs each
    python bench/engine_clients.py --quick --variants hiredis,twisted-nats

For each variant (bench/engine_roles.py says what each is) a subscriber process subscribes to
one channel, then a publisher process sends ``--count`` messages of 64-200 B in batches of
``--batch`` (one write each); both on the candidate library, both pinned to the client core,
the server to the server core. Figures: msgs/s at the publisher and end to end (publisher's
first batch to the subscriber's last message), client CPU µs per message for publishing and
for receiving, and the server's CPU (share of its core, µs per message): a server near 100%
is the limit, not the client. Runs are interleaved (each repeat runs every variant once);
medians of ``--repeat`` runs. Needs only the standard library; the variants' libraries must
be importable by ``--python`` (the ``bench`` extra has them), variants whose library is
missing are skipped with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import procs
from engine_roles import NATS_VARIANTS, REDIS_VARIANTS, payloads

HERE = Path(__file__).resolve().parent
ROLES = HERE / "engine_roles.py"
DEFAULT_VARIANTS = "hiredis,txredisapi,redispy,natspy,twisted-nats"
#: what each variant's processes import (checked with --python before running)
IMPORTS = {
    "hiredis": "twisted, hiredis",
    "txredisapi": "twisted, txredisapi",
    "redispy": "twisted, redis.asyncio",
    "redispy-asyncio": "redis.asyncio",
    "natspy": "twisted, nats",
    "natspy-asyncio": "nats",
    "twisted-nats": "twisted",
}
TIMEOUT = 180.0


class BenchError(RuntimeError):
    pass


def find_binary(name: str, explicit: str | None) -> str | None:
    return explicit or shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


def pinned(cpus: set[int] | None):
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return pin


def wait_answering(port: int, proc: subprocess.Popen, hello: bytes, expect: bytes) -> None:
    """Poll until the server answers ``hello`` with a line starting with ``expect``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"server exited with status {proc.returncode} at start-up")
        with contextlib.suppress(OSError), socket.create_connection((procs.HOST, port), 1) as s:
            if hello:
                s.sendall(hello)
            if s.makefile("rb").readline().startswith(expect):
                return
        time.sleep(0.02)
    raise BenchError(f"nothing answered on port {port}")


@contextlib.contextmanager
def redis_server(binary: str, directory: Path, cpus: set[int] | None) -> Iterator[tuple[int, int]]:
    """(port, pid) of a redis-server without persistence; a subscriber that lags is never
    disconnected (``client-output-buffer-limit pubsub 0 0 0``): the figure is its pace."""
    port = procs.free_port()
    argv = [
        binary, "--port", str(port), "--bind", procs.HOST, "--save", "", "--appendonly", "no",
        "--dir", str(directory), "--client-output-buffer-limit", "pubsub 0 0 0",
    ]
    proc = procs.spawn(argv, log=directory / "redis.log", cpus=cpus)
    try:
        wait_answering(port, proc, b"*1\r\n$4\r\nPING\r\n", b"+PONG")
        yield port, proc.pid
    finally:
        procs.stop_process(proc)


@contextlib.contextmanager
def nats_server(binary: str, directory: Path, cpus: set[int] | None) -> Iterator[tuple[int, int]]:
    """(port, pid) of a nats-server whose slow-consumer limits a lagging bench subscriber
    does not reach (256 MiB pending, 60 s write deadline)."""
    port = procs.free_port()
    conf = directory / "nats.conf"
    conf.write_text(
        f'listen: "{procs.HOST}:{port}"\nmax_pending: 268435456\nwrite_deadline: "60s"\n'
    )
    proc = procs.spawn([binary, "-c", str(conf)], log=directory / "nats.log", cpus=cpus)
    try:
        wait_answering(port, proc, b"", b"INFO ")
        yield port, proc.pid
    finally:
        procs.stop_process(proc)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of ``proc``'s stdout, waiting at most ``timeout`` for it."""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise BenchError(f"no line from {proc.args[2:4]} in {timeout:.0f} s")
    return proc.stdout.readline().decode()


def role(args: argparse.Namespace, name: str, variant: str, port: int, pid: int) -> list[str]:
    return [
        args.python, str(ROLES), name, variant, "--port", str(port), "--count", str(args.count),
        "--batch", str(args.batch), "--window", str(args.window), "--server-pid", str(pid),
        "--min-size", str(args.min_size), "--max-size", str(args.max_size),
    ]


def run_once(args: argparse.Namespace, variant: str, port: int, pid: int, log: Path) -> dict:
    client_cpus = None if args.no_pin else {args.client_cpu}
    started: list[subprocess.Popen] = []
    try:
        with open(log, "ab") as errors:
            sub = subprocess.Popen(
                role(args, "sub", variant, port, pid), stdout=subprocess.PIPE, stderr=errors,
                stdin=subprocess.DEVNULL, preexec_fn=pinned(client_cpus),  # noqa: PLW1509
            )
            started.append(sub)
            if read_line(sub, 60).strip() != "ready":
                raise BenchError(f"{variant}: the subscriber did not get ready (see {log})")
            pub = subprocess.Popen(
                role(args, "pub", variant, port, pid), stdout=subprocess.PIPE, stderr=errors,
                stdin=subprocess.DEVNULL, preexec_fn=pinned(client_cpus),  # noqa: PLW1509
            )
            started.append(pub)
            published = json.loads(read_line(pub, TIMEOUT) or "{}")
            received = json.loads(read_line(sub, TIMEOUT) or "{}")
    finally:
        for proc in started:
            procs.stop_process(proc, timeout=10)
    for side, result in (("publisher", published), ("subscriber", received)):
        if "t1" not in result:
            raise BenchError(f"{variant}: the {side} failed: {result.get('error')} (see {log})")
    return figures(args, variant, published, received)


def figures(args: argparse.Namespace, variant: str, pub: dict, sub: dict) -> dict:
    count = args.count
    expected = sum(len(m) for m in payloads(count, 15, args.min_size, args.max_size))
    if (sub["received"], sub["bytes"], sub["last"]) != (count, expected, f"{count - 1:08d}"):
        raise BenchError(f"{variant}: received {sub['received']} messages, {sub['bytes']} B")
    wall = sub["t1"] - pub["t0"]
    server = sub["server_cpu1"] - pub["server_cpu0"]
    pub_cpu = pub["cpu1"] - pub["cpu0"]
    # the subscriber's span starts when it is ready, before the publisher starts: an idle
    # epoll wait costs no CPU, so this is its cost of receiving
    sub_cpu = sub["cpu1"] - sub["cpu0"]
    return {
        "variant": variant,
        "publish_msgs_per_s": count / (pub["t1"] - pub["t0"]),
        "e2e_msgs_per_s": count / wall,
        "publish_us_per_msg": pub_cpu / count * 1e6,
        "receive_us_per_msg": sub_cpu / count * 1e6,
        "client_core_busy": (pub_cpu + sub_cpu) / wall,
        "server_core_busy": server / wall,
        "server_us_per_msg": server / count * 1e6,
    }


COLUMNS = [
    ("publish_msgs_per_s", "pub msgs/s", "{:>11,.0f}"),
    ("e2e_msgs_per_s", "e2e msgs/s", "{:>11,.0f}"),
    ("publish_us_per_msg", "pub µs/msg", "{:>10.2f}"),
    ("receive_us_per_msg", "recv µs/msg", "{:>11.2f}"),
    ("client_core_busy", "client core", "{:>11.0%}"),
    ("server_core_busy", "server core", "{:>11.0%}"),
    ("server_us_per_msg", "server µs/msg", "{:>13.2f}"),
]


def table(results: dict[str, list[dict]], repeat: int) -> str:
    header = f"{'variant':<16}" + "".join(f"{title:>{len(fmt.format(0)) + 1}}"
                                          for _, title, fmt in COLUMNS)
    lines = [header]
    for variant, runs in results.items():
        if not runs:
            continue
        cells = []
        for key, _title, fmt in COLUMNS:
            cells.append(" " + fmt.format(statistics.median(r[key] for r in runs)))
        lines.append(f"{variant:<16}" + "".join(cells))
        if repeat > 1:
            spread = ", ".join(f"{r['e2e_msgs_per_s']:,.0f}" for r in runs)
            lines.append(f"{'':<16} e2e msgs/s of each run: {spread}")
        loads = [r["background_cores"] for r in runs if r.get("background_cores") is not None]
        if loads:
            lines.append(f"{'':<16} background load before each run: "
                         + ", ".join(f"{load:.2f}" for load in loads) + " cores")
    return "\n".join(lines)


def available(python: str, variants: list[str]) -> tuple[list[str], list[str]]:
    ok, missing = [], []
    for variant in variants:
        check = subprocess.run(
            [python, "-c", f"import {IMPORTS[variant]}"], capture_output=True, check=False
        )
        (ok if check.returncode == 0 else missing).append(variant)
    return ok, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable,
                   help="interpreter with the variants' libraries [this one]")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"comma-separated, from {', '.join(IMPORTS)} [{DEFAULT_VARIANTS}]")
    p.add_argument("--count", type=int, default=200_000, help="messages per run [200,000]")
    p.add_argument("--batch", type=int, default=100, help="messages per write [100]")
    p.add_argument("--window", type=int, default=1,
                   help="batches unconfirmed at once (txredisapi, redis-py: always 1) [1]")
    p.add_argument("--min-size", type=int, default=64)
    p.add_argument("--max-size", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3, help="runs per variant; medians [3]")
    p.add_argument("--quick", action="store_true", help="a tenth of the count, one run")
    p.add_argument("--redis-server", help="redis-server binary [from PATH]")
    p.add_argument("--nats-server", help="nats-server binary [from PATH or /usr/sbin]")
    p.add_argument("--server-cpu", type=int, default=0, help="core for the server [0]")
    p.add_argument("--client-cpu", type=int, default=1, help="core for the clients [1]")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    p.add_argument("--nice", type=int, default=0,
                   help="the harness's (and so the servers' and clients') niceness and its "
                        "scheduler autogroup's, e.g. -10 as root on a shared machine [0]")
    p.add_argument("--quiet-below", type=float, default=0.3,
                   help="before each run, wait until the machine's load is below this many "
                        "cores [0.3]")
    p.add_argument("--quiet-wait", type=float, default=30.0,
                   help="wait at most this long for that, then run anyway [30 s]; 0 = never")
    args = p.parse_args(argv)
    if args.quick:
        args.count, args.repeat = args.count // 10, 1
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in IMPORTS]
    if unknown:
        p.error(f"unknown variants: {', '.join(unknown)}")
    variants, missing = available(args.python, variants)
    for variant in missing:
        print(f"skipped {variant}: {args.python} cannot import {IMPORTS[variant]}")
    servers = {"redis": find_binary("redis-server", args.redis_server),
               "nats": find_binary("nats-server", args.nats_server)}
    for kind, wanted in (("redis", REDIS_VARIANTS), ("nats", NATS_VARIANTS)):
        if servers[kind] is None and any(v in wanted for v in variants):
            print(f"skipped the {kind} variants: no {kind}-server (apt-get install {kind}-server)")
            variants = [v for v in variants if v not in wanted]
    if not variants:
        print("nothing to run")
        return 1
    server_cpus = None if args.no_pin else {args.server_cpu}
    if args.nice:
        os.nice(args.nice)
        procs.set_autogroup_nice(args.nice)
    print(f"{args.count:,} messages of {args.min_size}-{args.max_size} B, batches of "
          f"{args.batch}, window {args.window}; {args.repeat} run(s) per variant; server on "
          f"core {'-' if args.no_pin else args.server_cpu}, clients on core "
          f"{'-' if args.no_pin else args.client_cpu}")
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with contextlib.ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="engine-bench-")))
        ports: dict[str, tuple[int, int]] = {}
        if any(v in REDIS_VARIANTS for v in variants):
            ports["redis"] = stack.enter_context(
                redis_server(servers["redis"], directory, server_cpus))
        if any(v in NATS_VARIANTS for v in variants):
            ports["nats"] = stack.enter_context(
                nats_server(servers["nats"], directory, server_cpus))
        for rep in range(args.repeat):
            for variant in variants:
                port, pid = ports["redis" if variant in REDIS_VARIANTS else "nats"]
                log = directory / f"{variant}.log"
                load = None
                if args.quiet_wait > 0:
                    load, _waited = procs.wait_quiet(args.quiet_below, args.quiet_wait)
                try:
                    result = run_once(args, variant, port, pid, log)
                    result["background_cores"] = load
                    results[variant].append(result)
                except BenchError as error:
                    text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    print(f"run {rep + 1} {variant}: FAILED: {error}\n{text}")
                    return 1
        print(table(results, args.repeat))
        versions = subprocess.run(
            [args.python, "-c", "import importlib.metadata as m\n"
             "for n in ('hiredis','txredisapi','redis','nats-py','twisted'):\n"
             "  try: print(n, m.version(n))\n  except Exception: pass"],
            capture_output=True, text=True, check=False).stdout.split("\n")
        servers_versions = [
            subprocess.run([servers[k], "--version"], capture_output=True, text=True,
                           check=False).stdout.strip()
            for k in ports
        ]
        print("libraries: " + ", ".join(v for v in versions if v))
        print("servers: " + "; ".join(servers_versions))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
