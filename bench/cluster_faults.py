"""Fault timings of a cluster engine, with real processes (issue 15):

- kill -9 of a node: from the kill to the UNSUBSCRIBE presence event another node's
  watcher gets for the dead node's member (target: under 2 heartbeats);
- the engine server killed and started again on its port: from the start to the first
  publication that crosses from node A to a subscriber on node B again.

    python bench/cluster_faults.py --engine nats --heartbeat 1 --repeat 3
    python bench/cluster_faults.py --engine redis

Each run starts a fresh engine server (``nats-server`` or ``redis-server`` on loopback) and
``twistd msgbroker`` nodes joined to it (``--cluster-heartbeat``), SSMP clients on raw
sockets. Times are wall-clock, measured by this process.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import procs
from clients import BenchError, open_client
from cluster_cross import engine_server


def read_line(sock, deadline: float) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(1)
        if not chunk:
            raise BenchError("closed")
        data += chunk
    return data


def kill_to_presence(args: argparse.Namespace, directory: Path) -> float:
    with contextlib.ExitStack() as stack:
        server, url = engine_server(args.engine, directory)
        stack.callback(procs.stop_process, server)
        options = [f"--cluster={url}", f"--cluster-heartbeat={args.heartbeat}"]
        a = stack.enter_context(procs.Broker(args.python, directory / "a.log", None, options))
        doomed = procs.Broker(args.python, directory / "b.log", None, options)
        stack.callback(doomed.stop)
        watcher = stack.enter_context(open_client(
            a.port, b"LOGIN watcher open\nSUBSCRIBE room PRESENCE\n", b"200\n200\n"))
        victim = stack.enter_context(open_client(
            doomed.port, b"LOGIN victim open\nSUBSCRIBE room\n", b"200\n200\n"))
        deadline = time.monotonic() + 30
        while b"victim SUBSCRIBE room" not in read_line(watcher, deadline):
            pass
        killed = time.monotonic()
        doomed.proc.send_signal(signal.SIGKILL)
        while b"victim UNSUBSCRIBE room" not in read_line(watcher, killed + 30):
            pass
        seen = time.monotonic() - killed
        victim.close()
        return seen


def restart_to_delivery(args: argparse.Namespace, directory: Path) -> float:
    with contextlib.ExitStack() as stack:
        server, url = engine_server(args.engine, directory)
        options = [f"--cluster={url}", f"--cluster-heartbeat={args.heartbeat}"]
        a = stack.enter_context(procs.Broker(args.python, directory / "a.log", None, options))
        b = stack.enter_context(procs.Broker(args.python, directory / "b.log", None, options))
        sub = stack.enter_context(open_client(b.port, b"LOGIN sub open\nSUBSCRIBE t\n",
                                              b"200\n200\n"))
        pub = stack.enter_context(open_client(a.port, b"LOGIN pub open\n", b"200\n"))

        def crossed(until: float) -> bool:
            pub.sendall(b"MCAST t x\n")
            read_line(pub, until)
            with contextlib.suppress(TimeoutError):
                sub.settimeout(0.01)
                return bool(sub.recv(4096))
            return False

        deadline = time.monotonic() + 30
        while not crossed(deadline):
            pass
        server.kill()
        server.wait()
        port = int(url.rsplit(":", 1)[1])
        with contextlib.suppress(TimeoutError):  # drain what crossed before the kill
            sub.settimeout(0.2)
            while sub.recv(65536):
                pass
        started = time.monotonic()
        server, _ = engine_server(args.engine, directory, port)
        stack.callback(procs.stop_process, server)
        while not crossed(started + 30):
            pass
        return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=procs.default_python())
    p.add_argument("--engine", choices=["nats", "redis"], default="nats")
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    kills, restarts = [], []
    with tempfile.TemporaryDirectory(prefix="cluster-faults-") as tmp:
        for rep in range(args.repeat):
            directory = Path(tmp) / f"kill-{rep}"
            directory.mkdir()
            kills.append(kill_to_presence(args, directory))
            directory = Path(tmp) / f"restart-{rep}"
            directory.mkdir()
            restarts.append(restart_to_delivery(args, directory))
            print(f"run {rep + 1}: kill -9 -> presence event {kills[-1]:.2f} s; "
                  f"{args.engine} restart -> delivery {restarts[-1]:.2f} s", flush=True)
    print(f"{args.engine}, heartbeat {args.heartbeat:g} s: kill -9 -> UNSUBSCRIBE median "
          f"{statistics.median(kills):.2f} s ({statistics.median(kills) / args.heartbeat:.2f} "
          f"heartbeats), restart -> delivery median {statistics.median(restarts):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
