"""Login+PING latency of a healthy STMP WebSocket client while N connections trickle
endless request headers at the stmp-ws listener.

usage: .venv/bin/python bench/ws_trickle.py [--tricklers 20] [--rounds 60] [--pythonpath DIR]
(--pythonpath: run the broker with PYTHONPATH=DIR, e.g. an older checkout's package, to
compare; the interpreter is the one running this script)

"login+PING": a new TCP connection, the WebSocket handshake, the login request, then the
version check as a ping that is answered (STMP pings are not); the time until its reply.
"""

import argparse
import base64
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.interop.peers import ws_client_frame  # noqa: E402

PORT = 47446


def start_broker(pythonpath: str | None):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "twistd"),
            "-n",
            "--pidfile=",
            "msgbroker",
            "--listen",
            f"stmp-ws=tcp:{PORT}:interface=127.0.0.1",
            "--auth",
            "open",
            "--login-timeout",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:
        if "stmp-ws" in line and "127.0.0.1" in line:
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc


def recv_until(sock, marker, buf=b""):
    while marker not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def login_ping(i):
    started = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", PORT))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16))
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    buf = recv_until(sock, b"\r\n\r\n")
    buf = buf.partition(b"\r\n\r\n")[2]
    sock.sendall(ws_client_frame(1, b'1|2|1|257|{"id":"healthy%d","scheme":"open"}' % i))
    buf = recv_until(sock, b"3|0|1|0", buf)
    sock.sendall(ws_client_frame(1, b"1|5|0|0|01"))
    recv_until(sock, b"3|5|0|0|01", buf)
    elapsed = time.perf_counter() - started
    sock.close()
    return elapsed


class Trickler(threading.Thread):
    def __init__(self, count):
        super().__init__(daemon=True)
        self.count = count
        self.stop = False
        self.sent = 0
        self.cut = 0

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", PORT))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        return sock

    def run(self):
        socks = [self.connect() for _ in range(self.count)]
        line = b"X-Filler: " + b"a" * 40 + b"\r\n"
        while not self.stop:
            for i, sock in enumerate(socks):
                try:
                    sock.send(line)
                    self.sent += len(line)
                except OSError:
                    self.cut += 1
                    sock.close()
                    socks[i] = self.connect()
            time.sleep(0.0005)  # a trickle: about 2000 lines/s over all connections
        for sock in socks:
            sock.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tricklers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--pythonpath", default=None)
    args = parser.parse_args()
    broker = start_broker(args.pythonpath)
    try:
        idle = [login_ping(i) for i in range(20)]
        trickler = Trickler(args.tricklers)
        if args.tricklers:
            trickler.start()
            time.sleep(args.warmup)  # (a benchmark, not a test) let the heads grow
        times = [login_ping(100 + i) for i in range(args.rounds)]
        trickler.stop = True
        q = statistics.quantiles(times, n=20)
        print(
            f"{args.pythonpath or 'this checkout'}: tricklers={args.tricklers} "
            f"idle p50={statistics.median(idle) * 1e3:.2f} ms; "
            f"during p50={statistics.median(times) * 1e3:.2f} ms p95={q[18] * 1e3:.2f} ms "
            f"max={max(times) * 1e3:.1f} ms; trickled {trickler.sent / 1e6:.1f} MB, "
            f"{trickler.cut} heads cut"
        )
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(20)


if __name__ == "__main__":
    main()
