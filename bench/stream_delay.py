"""End-to-end delay of ``msgbroker analytics stream``: message routed -> its stats delivered.

::

    python bench/stream_delay.py --seconds 40 --rotate 1 --window 1 --watermark 0

Runs a broker (in process, SSMP on loopback) journaling with ``--rotate`` second segments, the
stats query over that journal, a publisher sending ``--rate`` MCASTs per second to one topic
and a subscriber of its ``_stats/topic/...`` topic. A message's delay is from its journal
``ts`` (when the broker routed it) to the arrival, at the subscriber, of the stats message
of its window (published once, when the watermark passes the window's end). Messages in the
windows still open when the run ends are not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.ssmp.e2e_support

import pyarrow.dataset as ds

from msgbroker.analytics.session import start_session
from msgbroker.analytics.stream import run_stream, seconds
from msgbroker.plugins.ssmp.client import BlockingSSMPClient
from tests.ssmp.e2e_support import running_broker

TOPIC = "bench"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to publish")
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second")
    parser.add_argument("--rotate", type=float, default=1.0, help="journal rotation, seconds")
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--watermark", type=float, default=0.0)
    parser.add_argument("--trigger", type=float, default=0.25)
    parser.add_argument("--verbose", action="store_true", help="print each micro-batch")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="stream-delay-"))
    journal = work / "journal"
    spark = start_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
    with running_broker(
        ("ssmp=tcp:0:interface=127.0.0.1",),
        auth=("open",),
        sections={"journal": {"directory": str(journal), "rotate-seconds": args.rotate}},
    ) as broker:
        (journal / "messages").mkdir(parents=True, exist_ok=True)
        received: list[tuple[float, dict[str, object]]] = []
        subscriber = BlockingSSMPClient(broker.host, broker.port, "watcher", keepalive=None)
        subscriber.subscribe(f"_stats/topic/{TOPIC}")
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                event = subscriber.next_event(timeout=0.2)
                if event is not None:
                    received.append((time.time(), json.loads(event.payload)))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        query = run_stream(
            spark,
            journal,
            f"{broker.host}:{broker.port}",
            window=seconds(args.window),
            watermark=seconds(args.watermark),
            checkpoint=work / "checkpoint",
            trigger={"processingTime": seconds(args.trigger)},
        )
        # the first micro-batches start Spark's Python workers and JIT-compile: not the
        # steady state. Warm up on a first segment (another topic), then measure.
        with BlockingSSMPClient(broker.host, broker.port, "warmup") as warmup:
            warmup.mcast("warmup", b"x")
        while not list((journal / "messages").rglob("seg-*.parquet")):
            done.wait(0.1)  # the journal rotates within --rotate seconds
        query.processAllAvailable()
        publisher = BlockingSSMPClient(broker.host, broker.port, "publisher", keepalive=None)
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < args.seconds:
            if sent < elapsed * args.rate:
                publisher.mcast(TOPIC, b"x")
                sent += 1
            else:
                done.wait(1 / args.rate / 4)  # paces the publisher; nothing to wait for
        # let the last full windows close and be published
        deadline = time.monotonic() + args.window + args.watermark + args.rotate + 15
        while time.monotonic() < deadline and query.isActive:
            done.wait(0.5)
        batches = [
            p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]
        ]
        if args.verbose:
            for p in query.recentProgress:
                print(p["batchId"], p["timestamp"], p["numInputRows"], p["durationMs"])
        query.stop()
        done.set()
        watcher.join()
        publisher.close()
        subscriber.close()
    spark.stop()

    table = ds.dataset(journal / "messages", format="parquet", partitioning="hive").to_table(
        filter=(ds.field("kind") == "mcast") & (ds.field("topic") == TOPIC)
    )
    routed = sorted(t.timestamp() for t in table.column("ts").to_pylist())
    arrivals = {}
    for at, payload in received:
        arrivals.setdefault(str(payload["window_start"]), (at, payload))
    delays = []
    counted = 0
    for at, payload in arrivals.values():
        begin = _epoch(str(payload["window_start"]))
        end = _epoch(str(payload["window_end"]))
        window = [ts for ts in routed if begin <= ts < end]
        counted += int(payload["messages"])  # type: ignore[call-overload]
        assert len(window) == payload["messages"], (payload, len(window))
        delays.extend(at - ts for ts in window)
    delays.sort()
    if len(delays) < 2:
        print(f"too few windows published: {received}")
        return 1
    q = statistics.quantiles(delays, n=100)
    print(
        f"rotate {args.rotate:g} s, window {args.window:g} s, watermark {args.watermark:g} s, "
        f"trigger {args.trigger:g} s: {len(routed)} messages journaled, {counted} in "
        f"{len(arrivals)} published windows; delay p50 {q[49]:.2f} s, p95 {q[94]:.2f} s, "
        f"max {delays[-1]:.2f} s; micro-batches with data: {len(batches)}, median "
        f"{statistics.median(batches) / 1000:.2f} s each"
    )
    return 0


def _epoch(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
