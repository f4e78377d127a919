"""Where a broker's memory per idle logged-in connection goes (tracemalloc, by line).

usage: .venv/bin/python bench/memprobe.py [--protocol ssmp|stmp|mm2] [--connections 1000]
                                          [--top 25] [--frames 1]

Starts ``twistd -n msgbroker`` (``--auth open``) under tracemalloc, takes a snapshot, opens
N connections that each log in with their own id and subscribe to one topic (scenario 5's
setup), takes a second snapshot and prints the difference per allocating line, in bytes
per connection, and the VmRSS difference per connection beside it. The snapshots are
taken in the broker by SIGUSR1 (a handler this wrapper installs; the broker knows nothing
of it). Python's own accounting: the kernel's socket buffers and the allocator's slack are
not in it (compare with the RSS figure).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clients
import procs
import wire

WRAPPER = """
import signal, sys, tracemalloc, pickle
tracemalloc.start(int(sys.argv.pop(1)))
dump_to = sys.argv.pop(1)
count = [0]
def dump(signum, frame):
    import gc
    gc.collect()
    snap = tracemalloc.take_snapshot()
    with open(f"{dump_to}.{count[0]}", "wb") as f:
        pickle.dump(snap, f)
    count[0] += 1
    with open(f"{dump_to}.done", "w") as f:
        f.write(str(count[0]))
signal.signal(signal.SIGUSR1, dump)
def walk(signum, frame):
    # the objects one connection owns: reachable from its transport and not from another's
    import gc, sys, collections
    from twisted.internet import abstract
    conns = [o for o in gc.get_objects() if isinstance(o, abstract.FileDescriptor)
             and getattr(o, "protocol", None) is not None and hasattr(o, "sessionno")]
    conns.sort(key=lambda o: o.sessionno)
    import types
    shared_types = {"Broker", "Hub", "EPollReactor", "Port", "StreamFactory", "Batcher",
                    "Topic", "HubStats", "BrokerConfig", "Listener", "OutputPolicy",
                    "OutputBudget", "PluginManager", "PluginFacade", "Service", "Membership",
                    "Logger", "LogPublisher", "Limits", "IdCache", "TimerQueue"}
    blocked = (types.ModuleType, type, types.FunctionType, types.CodeType,
               types.BuiltinFunctionType)
    def reach(root):
        seen = {id(root): root}
        todo = [root]
        while todo:
            for ref in gc.get_referents(todo.pop()):
                if (isinstance(ref, blocked) or type(ref).__name__ in shared_types
                        or (isinstance(ref, abstract.FileDescriptor) and ref is not root)):
                    continue
                if type(ref).__name__ == "StreamProtocol" and ref is not root.protocol:
                    continue
                if id(ref) not in seen:
                    seen[id(ref)] = ref
                    todo.append(ref)
        return seen
    a, b = reach(conns[-2]), reach(conns[-1])
    own = [o for k, o in a.items() if k not in b]
    by_type = collections.Counter()
    count = collections.Counter()
    for o in own:
        by_type[type(o).__qualname__] += sys.getsizeof(o)
        count[type(o).__qualname__] += 1
    ctxs = [o for o in gc.get_objects() if isinstance(o, dict) and "system" in o
            and "StreamProtocol" in str(o.get("system"))]
    with open(f"{dump_to}.ctx", "w") as f:
        f.write(f"{len(ctxs)} log contexts\\n")
        for ctx in ctxs[:3]:
            f.write(repr(ctx)[:300] + "\\n")
            for r in gc.get_referrers(ctx):
                f.write("  <- " + type(r).__qualname__ + " " + repr(r)[:300] + "\\n")
    with open(f"{dump_to}.walk", "w") as f:
        f.write(f"{sum(by_type.values())} B in {len(own)} objects\\n")
        for name, size in by_type.most_common():
            f.write(f"{size:6d} B {count[name]:3d}  {name}\\n")
        for o in own:
            f.write(f"  {sys.getsizeof(o):5d} {type(o).__qualname__} {repr(o)[:100]}\\n")
signal.signal(signal.SIGUSR2, walk)
from twisted.scripts.twistd import run
sys.argv[0] = "twistd"
run()
"""


def snapshot(pid: int, dump_to: str, index: int) -> object:
    import pickle

    os.kill(pid, signal.SIGUSR1)
    done = Path(f"{dump_to}.done")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if done.exists() and done.read_text() == str(index + 1):
            with open(f"{dump_to}.{index}", "rb") as f:
                return pickle.load(f)
        time.sleep(0.05)
    raise TimeoutError("no snapshot")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=str(Path(sys.executable)))
    p.add_argument("--protocol", default="ssmp", choices=["ssmp", "stmp", "mm2"])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--frames", type=int, default=1, help="traceback depth grouped by")
    args = p.parse_args()
    procs.raise_nofile(args.connections * 2 + 1000)
    work = Path(tempfile.mkdtemp(prefix="memprobe", dir="/tmp"))
    dump_to = str(work / "snap")
    listeners = ["ssmp"] + ([args.protocol] if args.protocol != "ssmp" else [])
    listen = [a for n in listeners for a in ("--listen", f"{n}=tcp:0:interface=127.0.0.1")]
    argv = [args.python, "-c", WRAPPER, str(args.frames), dump_to, "-n", "--pidfile=",
            "msgbroker", *listen,
            "--auth", "open", "--max-connections", "0", "--max-connections-per-address", "0"]
    proc = procs.spawn(argv, log=work / "broker.log", cpus=None)
    try:
        import re

        ports = {}
        deadline = time.monotonic() + 30
        while len(ports) < len(listeners) and time.monotonic() < deadline:
            for name in listeners:
                m = re.search(rb"%s listening on tcp:127\.0\.0\.1:(\d+)" % name.encode(),
                              (work / "broker.log").read_bytes())
                if m:
                    ports[name] = int(m.group(1))
            time.sleep(0.05)
        proto = wire.PROTOCOLS[args.protocol]
        port = ports[args.protocol]
        # one warm-up connection: first-use allocations (codec tables, caches) out of the diff
        warm = clients.open_many(port, [proto.subscriber_setup("warm", "idle")])
        time.sleep(0.3)
        before = snapshot(proc.pid, dump_to, 0)
        rss0 = procs.rss_kib(proc.pid)
        setups = [proto.subscriber_setup(f"idle{i}", "idle") for i in range(args.connections)]
        socks = clients.open_many(port, setups, timeout=120)
        time.sleep(0.5)
        rss1 = procs.rss_kib(proc.pid)
        after = snapshot(proc.pid, dump_to, 1)
        n = args.connections
        os.kill(proc.pid, signal.SIGUSR2)
        walk = Path(f"{dump_to}.walk")
        deadline = time.monotonic() + 60
        while not walk.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        print(walk.read_text())
        stats = after.compare_to(before, "traceback" if args.frames > 1 else "lineno")
        total = sum(s.size_diff for s in stats)
        print(f"{args.protocol}: {n} connections: RSS +{1024 * (rss1 - rss0) / n:,.0f} B/conn; "
              f"tracemalloc +{total / n:,.0f} B/conn")
        by_file: dict[str, int] = {}
        for s in stats:
            name = s.traceback[0].filename.split("site-packages/")[-1]
            name = name.split("msgbroker-0.1.0-py3-none-any/")[-1]
            by_file[name] = by_file.get(name, 0) + s.size_diff
        for name, size in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {size / n:8.1f} B  {name}")
        for s in stats[: args.top]:
            if abs(s.size_diff) < n * 8:
                continue
            where = s.traceback.format()
            print(f"  {s.size_diff / n:8.1f} B  {s.count_diff / n:5.2f} blocks  "
                  f"{' <- '.join(line.strip() for line in where if not line.startswith('    '))}")
        clients.close_all(socks)
        clients.close_all(warm)
    finally:
        procs.stop_process(proc, timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
