"""Micromessage2 queue groups across two cluster nodes (Redis streams), against one node.

    python bench/cluster_queues.py --python .venv/bin/python [--messages 100000]
        [--members 2] [--window 100] [--repeat 3] [--redis redis-server]

In one invocation, ``--repeat`` times each, interleaved:

- ``cluster``: ``redis-server`` on a free loopback port (no persistence), two brokers
  (``twistd msgbroker --cluster redis://...``); ``--members`` members of the queue group
  ``workers`` of topic ``bench`` on *each* node, and one publisher on the first node;
- ``single``: one broker, no cluster (the memory engine), with all the members.

Every client is a raw socket (bench/wire.py's Micromessage2 frames). The publisher
(bench/senders.WindowedPublisher, a forked process) sends ``--messages`` 64-byte messages
with ``batch-ack:max-count=--window``; the members, read by this process with epoll,
acknowledge what they read with one cumulative ack per read (their window is ``--window``
too). The figure is messages delivered per second, from the publisher's start to the moment
the members together have every message (each exactly once: the byte counts say so), with
the share each node's members got and the CPU seconds of each broker and of Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import procs
from senders import WindowedPublisher
from wire import MM2, payload

TOPIC, GROUP = "bench", "workers"
SIZE = 64


def start_redis(binary: str, workdir: Path) -> tuple[object, int]:
    port = procs.free_port()
    proc = procs.spawn(
        [binary, "--port", str(port), "--bind", procs.HOST, "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        log=workdir / "redis.log", cpus=None,
    )  # fmt: skip
    procs.wait_connectable(port, proc, 15.0)
    return proc, port


def redis_command(port: int, *args: str) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    with socket.create_connection((procs.HOST, port), timeout=5) as s:
        s.sendall(b"".join(parts))
        return s.recv(65536)


def member(port: int, identity: str, window: int) -> socket.socket:
    """A member of the group: logged in, subscribed, its step 2 read."""
    proto = MM2(window)
    login, hello = proto.subscriber_setup(identity)
    command = MM2.command(b"subscribe;destination=%s,queue=%s" % (TOPIC.encode(), GROUP.encode()))
    sock = socket.create_connection((procs.HOST, port), timeout=15)
    sock.sendall(login + command)
    got = b""
    while len(got) < len(hello):
        chunk = sock.recv(len(hello) - len(got))
        if not chunk:
            raise RuntimeError(f"{identity}: closed during the handshake")
        got += chunk
    if got != hello:
        raise RuntimeError(f"{identity}: unexpected step 2 {got!r}")
    return sock


def publisher(port: int, window: int) -> socket.socket:
    proto = MM2(window)
    login, hello = proto.publisher_setup("pub")
    sock = socket.create_connection((procs.HOST, port), timeout=15)
    sock.sendall(login)
    got = b""
    while len(got) < len(hello):
        got += sock.recv(len(hello) - len(got))
    return sock


def wait_for_queue_fields(redis_port: int, nodes: int, timeout: float = 15.0) -> None:
    """Until every node's state in Redis lists its queue group (the others read it from
    the announcement that carried it), then a moment for that announcement to arrive."""
    deadline = time.monotonic() + timeout
    marker = b"\x93\xa1q"  # msgpack ["q", ...]: a queue group field
    while time.monotonic() < deadline:
        names = [n for n in redis_command(redis_port, "SMEMBERS", "msgbroker:nodes").split(b"\r\n")
                 if n and not n.startswith((b"*", b"$"))]
        if len(names) == nodes and all(
            marker in redis_command(redis_port, "HKEYS", f"msgbroker:state:{n.decode()}")
            for n in names
        ):
            time.sleep(0.5)
            return
        time.sleep(0.05)
    raise TimeoutError("the nodes did not announce their queue groups")


def run_once(kind: str, args, workdir: Path) -> dict:
    frame_len = len(MM2.delivered("pub", TOPIC, payload(0, SIZE)))
    data = b"".join(MM2.publish(TOPIC, payload(i, SIZE)) for i in range(args.messages))
    with contextlib.ExitStack() as stack:
        brokers = []
        redis_proc, redis_port = None, None
        if kind == "cluster":
            redis_proc, redis_port = start_redis(args.redis, workdir)
            stack.callback(procs.stop_process, redis_proc)
            extra = ["--cluster", f"redis://{procs.HOST}:{redis_port}"]
            for n in range(2):
                broker = procs.Broker(args.python, workdir / f"node{n}.log", None, extra,
                                      mm2=True)
                stack.enter_context(broker)
                brokers.append(broker)
        else:
            broker = procs.Broker(args.python, workdir / "single.log", None, [], mm2=True)
            stack.enter_context(broker)
            brokers.append(broker)
        socks, where = [], []
        for n in range(2):
            broker = brokers[n % len(brokers)]
            for m in range(args.members):
                socks.append(member(broker.port_for("mm2"), f"m{n}-{m}", args.window))
                where.append(n)
        if redis_port is not None:
            wait_for_queue_fields(redis_port, len(brokers))
        cpu0 = [b.cpu_seconds() for b in brokers]
        redis_cpu0 = procs.cpu_seconds(redis_proc.pid) if redis_proc else 0.0
        pub_sock = publisher(brokers[0].port_for("mm2"), args.window)
        start = time.perf_counter()
        pub = WindowedPublisher(pub_sock, data, frame_len, args.window, MM2.ack(1)[:-2],
                                args.timeout)
        counts = read_members(socks, frame_len, args.messages, args.timeout)
        elapsed = time.perf_counter() - start
        result_pub = pub.finish()
        cpu = [b.cpu_seconds() - c for b, c in zip(brokers, cpu0, strict=True)]
        redis_cpu = procs.cpu_seconds(redis_proc.pid) - redis_cpu0 if redis_proc else 0.0
        for sock in socks:
            sock.close()
    delivered = sum(counts)
    by_node = [sum(c for c, w in zip(counts, where, strict=True) if w == n) for n in range(2)]
    return {
        "kind": kind,
        "messages": args.messages,
        "delivered": delivered,
        "msgs_per_s": delivered / elapsed,
        "elapsed_s": elapsed,
        "by_node": by_node,
        "broker_cpu_s": [round(c, 2) for c in cpu],
        "redis_cpu_s": round(redis_cpu, 2),
        "publisher_error": result_pub.get("error"),
    }


def read_members(socks: list[socket.socket], frame_len: int, total: int,
                 timeout: float) -> list[int]:
    """Read every member until they have ``total`` messages together, acknowledging what
    each read (cumulative); each member's count of messages."""
    ep = select.epoll()
    index = {s.fileno(): i for i, s in enumerate(socks)}
    nbytes = [0] * len(socks)
    acked = [0] * len(socks)
    for s in socks:
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
    buf = bytearray(1 << 20)
    deadline = time.monotonic() + timeout
    got = 0
    try:
        while got < total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {got} of {total} messages delivered")
            for fd, _ in ep.poll(0.5):
                i = index[fd]
                try:
                    n = socks[i].recv_into(buf)
                except BlockingIOError:
                    continue
                if n <= 0:
                    raise RuntimeError(f"member {i} closed after {nbytes[i]} bytes")
                nbytes[i] += n
                k = nbytes[i] // frame_len
                if k > acked[i]:
                    socks[i].send(MM2.ack((k - 1) % MM2.SEQ_CYCLE + 1))
                    got += k - acked[i]
                    acked[i] = k
    finally:
        ep.close()
    if got != total:
        raise RuntimeError(f"{got} messages delivered for {total} published")
    return [n // frame_len for n in nbytes]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--redis", default="redis-server")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--members", type=int, default=2, help="members on each node [2]")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--kinds", default="cluster,single")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-queues-") as tmp:
        for r in range(args.repeat):
            for kind in args.kinds.split(","):
                workdir = Path(tmp) / f"{kind}-{r}"
                workdir.mkdir()
                result = run_once(kind, args, workdir)
                print(json.dumps(result), flush=True)
                results.setdefault(kind, []).append(result)
    for kind, runs in results.items():
        rate = statistics.median(r["msgs_per_s"] for r in runs)
        print(f"{kind}: median {rate:,.0f} msgs/s delivered over {len(runs)} runs "
              f"({args.messages} messages, {args.members} members per node, window "
              f"{args.window})")
    if "cluster" in results and "single" in results:
        ratio = statistics.median(r["msgs_per_s"] for r in results["cluster"]) / statistics.median(
            r["msgs_per_s"] for r in results["single"])
        print(f"cluster/single: {ratio:.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
