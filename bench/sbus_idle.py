"""Resident memory of an sbusd (msgbroker) with N idle sbus connections.

usage: .venv/bin/python bench/sbus_idle.py N [N...]
prints N and the server's VmRSS growth over 0 clients (sbusd next to this interpreter).
"""

import os
import resource
import socket
import subprocess
import sys
import tempfile

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError


def run(n: int) -> tuple[int, int]:
    d = tempfile.mkdtemp(prefix="idle", dir="/tmp")
    path = os.path.join(d, "bus")
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "sbusd"), "-f", "-a", path],
        stdout=subprocess.PIPE,
    )
    proc.stdout.read()  # closed once it listens
    clients = []
    try:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.connect(path)
        probe.send(b"CMSG !/cred/whoami")
        probe.recv(100)
        base = rss(proc.pid)
        for _ in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path)
            clients.append(s)
        # every client accepted and set up: each answers a whoami (in order)
        for s in clients:
            s.send(b"CMSG !/cred/whoami")
        for s in clients:
            s.recv(100)
        return base, rss(proc.pid)
    finally:
        for s in clients:
            s.close()
        proc.terminate()
        proc.wait()


for arg in sys.argv[1:]:
    n = int(arg)
    base, after = run(n)
    print(
        f"{n} idle clients: base {base / 2**20:.1f} MiB, with them {after / 2**20:.1f} MiB, "
        f"+{(after - base) / 2**20:.1f} MiB = {(after - base) / max(n, 1):.0f} B each"
    )
