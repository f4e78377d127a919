"""Generate a realistic journal for the analytics benchmark (bench/analytics.py).

    python bench/journal_rows.py /tmp/journal5m                 # 5,000,000 message rows
    python bench/journal_rows.py /tmp/j --rows 200000 --seed 7

Writes the journal plugin's layout (docs/journal.md):
``DIR/messages/date=.../seg-NODE-N.parquet`` and ``DIR/sessions/...``, each segment written
under a ``.``-name and renamed, as the journal does, as one node (``--node``, default
``bench:4444``; ``--node ""``: a journal from before node names, without node columns).
The traffic is shaped like a busy broker's, not uniform noise, because the aggregations'
cost depends on it: 4 protocols, a few hundred senders and a few thousand
topics whose activity follows a Zipf-like law (a handful of topics and senders carry most
messages), fan-out per topic from its popularity, log-normal payload sizes, timestamps over
24 hours (from noon, so two ``date=`` partitions) with a day/night swing, a few drops and
skips, and session events with logins, auth failures and sessions left open.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

try:  # the journal's own schema when the plugin is installed, else the readers' view of it
    from msgbroker.plugins.journal.schema import MESSAGES_SCHEMA, SESSIONS_SCHEMA
except ImportError:
    from msgbroker.analytics.journal_files import MESSAGES_COLUMNS as MESSAGES_SCHEMA
    from msgbroker.analytics.journal_files import SESSIONS_COLUMNS as SESSIONS_SCHEMA

PROTOCOLS = np.array(["ssmp", "stmp", "mm2", "sbus"])
PROTOCOL_WEIGHTS = np.array([0.45, 0.2, 0.2, 0.15])
START = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
DAY_US = 86_400_000_000


def zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def timestamps(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` sorted microsecond offsets over a day, busier in the (UTC) afternoon."""
    # rejection sampling of a sinusoidal rate: 1 + 0.6 sin(...) peaks 6 hours after START
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
        t = rng.integers(0, DAY_US, size=2 * n)
        keep = rng.random(2 * n) < (1 + 0.6 * np.sin(2 * np.pi * t / DAY_US)) / 1.6
        out = np.concatenate([out, t[keep]])
    ts = np.sort(out[:n])
    return ts + int(START.timestamp() * 1_000_000)


def messages(
    rng: np.random.Generator, n: int, n_topics: int, n_senders: int, node: str = ""
) -> pa.Table:
    sender_protocol = rng.choice(PROTOCOLS, size=n_senders, p=PROTOCOL_WEIGHTS)
    sender_names = np.array([f"{p}-user{i:03d}" for i, p in enumerate(sender_protocol)])
    topic_names = np.array([f"app{i % 37}.topic{i:04d}" for i in range(n_topics)])
    sender = rng.choice(n_senders, size=n, p=zipf_weights(n_senders, 1.1))
    topic = rng.choice(n_topics, size=n, p=zipf_weights(n_topics, 1.05))
    kind = rng.choice(
        np.array(["mcast", "ucast", "bcast", "subscribe", "unsubscribe"]),
        size=n,
        p=[0.90, 0.06, 0.005, 0.025, 0.01],
    )
    # subscribers per topic: popular topics have more, across the protocols
    audience = 1 + 40 * zipf_weights(n_topics, 0.6) / zipf_weights(n_topics, 0.6)[0]
    lam = np.outer(audience[topic], PROTOCOL_WEIGHTS)
    lam[kind == "ucast"] = PROTOCOL_WEIGHTS / PROTOCOL_WEIGHTS.sum() * 1.0
    lam[kind == "bcast"] = PROTOCOL_WEIGHTS * 60
    per_protocol = rng.poisson(lam).astype(np.int32)
    per_protocol[kind == "ucast"] = 0
    ucast_rows = np.flatnonzero(kind == "ucast")
    per_protocol[ucast_rows, rng.choice(4, size=ucast_rows.size, p=PROTOCOL_WEIGHTS)] = 1
    delivered = per_protocol.sum(axis=1, dtype=np.int32)
    nonzero = per_protocol > 0
    offsets = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))]).astype(np.int32)
    rows_idx, proto_idx = np.nonzero(nonzero)
    recipients = pa.MapArray.from_arrays(
        pa.array(offsets),
        pc.take(pa.array(PROTOCOLS.tolist()), pa.array(proto_idx)),
        pa.array(per_protocol[rows_idx, proto_idx], pa.int32()),
    )
    topic_col = topic_names[topic].astype(object)
    topic_col[kind == "ucast"] = sender_names[rng.choice(n_senders, size=ucast_rows.size)]
    topic_mask = kind == "bcast"
    # a row is a pipelined run of `count` messages now and then (mcast only)
    count = np.where(
        (kind == "mcast") & (rng.random(n) < 0.1), rng.geometric(0.3, size=n), 1
    ).astype(np.int32)
    payload_size = np.clip(rng.lognormal(5.3, 1.1, size=n), 0, 65_000).astype(np.int64) * count
    payload_size[(kind == "subscribe") | (kind == "unsubscribe")] = 0
    skipped = rng.binomial(1, 0.01, size=n).astype(np.int32)
    dropped = (rng.binomial(delivered * count, 0.002)).astype(np.int32)
    columns = {
        "ts": pa.array(timestamps(rng, n), pa.timestamp("us", tz="UTC")),
        "protocol": pa.array(sender_protocol[sender]),
        "sender": pa.array(sender_names[sender]),
        "kind": pa.array(kind),
        "topic": pa.array(topic_col, pa.string(), mask=topic_mask),
        "count": pa.array(count),
        "payload_size": pa.array(payload_size),
        "recipients": recipients,
        "delivered": pa.array(delivered),
        "skipped": pa.array(skipped),
        "dropped": pa.array(dropped),
        "payload": pa.nulls(n, pa.binary()),
        "escaped": pa.nulls(n, pa.list_(pa.string())),  # every generated name is UTF-8
        "node": pa.repeat(pa.scalar(node, pa.string()), n),
        "origin_node": pa.nulls(n, pa.string()),  # one node: all published on it
    }
    return _as_written(columns, MESSAGES_SCHEMA, node)


def _as_written(columns: dict[str, object], schema: pa.Schema, node: str) -> pa.Table:
    """The columns the journal writes (the plugin's schema, or without the plugin the
    readers' view of it); without a node, as before node names (no node columns)."""
    kept = [f for f in schema if f.name in columns and (node or "node" not in f.name)]
    return pa.Table.from_pydict({f.name: columns[f.name] for f in kept}, schema=pa.schema(kept))


def sessions(rng: np.random.Generator, n_sessions: int, n_senders: int, node: str = "") -> pa.Table:
    rows: list[dict[str, object]] = []
    hosts = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(200)]
    base = int(START.timestamp() * 1_000_000)
    for sid in range(1, n_sessions + 1):
        protocol = str(rng.choice(PROTOCOLS, p=PROTOCOL_WEIGHTS))
        host = "" if protocol == "sbus" else hosts[int(rng.integers(len(hosts)))]
        opened = base + int(rng.integers(0, DAY_US))
        identity = f"{protocol}-user{int(rng.integers(n_senders)):03d}"
        rows.append(_event(opened, "open", protocol, sid, None, host))
        t = opened + int(rng.integers(1_000, 50_000))
        if rng.random() < 0.05:
            rows.append(_event(t, "auth_failure", protocol, sid, identity, host, "secret", "bad"))
            rows.append(_event(t + 1000, "close", protocol, sid, None, host, None, "auth"))
            continue
        rows.append(_event(t, "login", protocol, sid, identity, host, "open"))
        if rng.random() < 0.9:
            closed = t + int(rng.lognormal(17, 2))
            rows.append(_event(closed, "close", protocol, sid, identity, host, None, "done"))
    rows.sort(key=lambda r: r["ts"])  # type: ignore[arg-type,return-value]
    for r in rows:
        r["ts"] = dt.datetime.fromtimestamp(r["ts"] / 1e6, dt.UTC)  # type: ignore[operator]
    table = pa.Table.from_pylist(rows)
    columns = {name: table.column(name) for name in table.column_names}
    columns["escaped"] = pa.nulls(table.num_rows, pa.list_(pa.string()))
    columns["node"] = pa.repeat(pa.scalar(node, pa.string()), table.num_rows)
    return _as_written(columns, SESSIONS_SCHEMA, node)


def _event(ts, event, protocol, sid, identity, host, scheme=None, reason=None):
    return {
        "ts": ts,
        "event": event,
        "protocol": protocol,
        "session_id": sid,
        "identity": identity,
        "host": host,
        "scheme": scheme,
        "reason": reason,
    }


def write_segments(table: pa.Table, directory: Path, segment_rows: int, node: str = "") -> int:
    """Split ``table`` (sorted by ts) by date and into ``segment_rows`` pieces, written like
    the journal writes them (temporary name, then rename; named after ``node``). Returns
    the number of files."""
    prefix = "seg-" + (node.replace(":", "~") + "-" if node else "")
    days = pc.strftime(table.column("ts"), format="%Y-%m-%d", locale="C")
    seq = 0
    for day in sorted(set(days.to_pylist())):
        part = table.filter(pc.equal(days, day))
        target = directory / f"date={day}"
        target.mkdir(parents=True, exist_ok=True)
        for start in range(0, part.num_rows, segment_rows):
            seq += 1
            temp = target / f".{prefix}{seq:08d}.parquet.tmp"
            pq.write_table(part.slice(start, segment_rows), temp)
            os.replace(temp, target / f"{prefix}{seq:08d}.parquet")
    return seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--segment-rows", type=int, default=250_000)
    parser.add_argument("--topics", type=int, default=3000)
    parser.add_argument("--senders", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--node", default="bench:4444", help='the node that wrote it ("": none)')
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    node = args.node
    table = messages(rng, args.rows, args.topics, args.senders, node)
    n_msg = write_segments(table, args.dir / "messages", args.segment_rows, node)
    n_ses = write_segments(
        sessions(rng, args.sessions, args.senders, node),
        args.dir / "sessions",
        args.segment_rows,
        node,
    )
    print(
        f"{args.rows:,} message rows in {n_msg} segments, {args.sessions:,} sessions in "
        f"{n_ses}, under {args.dir} ({time.perf_counter() - started:.1f} s)"
    )


if __name__ == "__main__":
    main()
