"""Time ``msgbroker analytics report`` on a big journal, beside the same aggregations in DuckDB.

    python bench/journal_rows.py /tmp/journal5m          # once: 5,000,000 rows
    python bench/analytics.py /tmp/journal5m             # Spark and DuckDB, one run each
    python bench/analytics.py /tmp/journal5m --repeat 3 --master 'local[2]'

Each engine runs as its own process, timed from outside like ``/usr/bin/time`` (wall clock,
the children's user and system CPU, peak RSS), so the figures include everything a person
waits for: interpreter start, imports, JVM start for Spark, reading, aggregating, writing.
The Spark side is the real command (tables, charts and index.html); the DuckDB side computes
the same tables with SQL and writes them as Parquet, without charts, whose cost is shown on
its own line (drawn from the Spark report's tables). A check compares the two engines'
``topics`` tables, so the comparison is between equal answers.

DuckDB (``pip install duckdb``) is optional: without it, the pandas line computes the
same tables in-process with pyarrow + pandas.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))

DUCKDB_TABLES = {
    "kinds": """
        SELECT kind, sum(n) AS messages, sum(payload_size) AS bytes,
               sum(delivered * n) AS delivered, sum(skipped * n) AS skipped,
               sum(dropped) AS dropped, min(ts) AS first, max(ts) AS last
        FROM m GROUP BY kind ORDER BY messages DESC, kind""",
    "protocols": """
        SELECT protocol, sum(n) AS messages, sum(payload_size) AS bytes,
               sum(delivered * n) AS delivered, sum(skipped * n) AS skipped,
               sum(dropped) AS dropped
        FROM t GROUP BY protocol ORDER BY messages DESC, protocol""",
    "traffic_by_minute": """
        SELECT date_trunc('minute', ts) AS minute, protocol, sum(n) AS messages,
               sum(payload_size) AS bytes
        FROM t GROUP BY ALL ORDER BY minute, protocol""",
    "senders_by_minute": """
        SELECT date_trunc('minute', ts) AS minute, sender, sum(n) AS messages,
               sum(payload_size) AS bytes
        FROM t GROUP BY ALL ORDER BY minute, sender""",
    "top_talkers": """
        SELECT sender, sum(n) AS messages, sum(payload_size) AS bytes,
               count(DISTINCT protocol) AS protocols
        FROM t GROUP BY sender ORDER BY messages DESC, bytes DESC, sender""",
    "topics": """
        SELECT topic, sum(n) AS messages, sum(payload_size) AS bytes,
               sum(delivered * n) AS delivered, sum(skipped * n) AS skipped,
               sum(dropped) AS dropped
        FROM t WHERE kind = 'mcast' GROUP BY topic
        ORDER BY messages DESC, bytes DESC, topic""",
    "fanout": """
        SELECT delivered, sum(n) AS messages FROM t GROUP BY delivered ORDER BY delivered""",
    "recipient_protocols": """
        SELECT protocol, sum(k * n) AS deliveries FROM (
            SELECT n, unnest(map_keys(recipients)) AS protocol,
                   unnest(map_values(recipients)) AS k FROM t)
        GROUP BY protocol ORDER BY deliveries DESC, protocol""",
    "topics_by_minute": """
        SELECT date_trunc('minute', ts) AS minute, topic, sum(n) AS messages,
               sum(payload_size) AS bytes
        FROM t WHERE kind = 'mcast' AND topic IN (
            SELECT topic FROM t WHERE kind = 'mcast' GROUP BY topic
            ORDER BY sum(n) DESC, sum(payload_size) DESC, topic LIMIT 10)
        GROUP BY ALL ORDER BY minute, topic""",
    "auth_failures_by_identity": """
        SELECT identity, count(*) AS failures, count(DISTINCT host) AS hosts, max(ts) AS last
        FROM s WHERE event = 'auth_failure' GROUP BY identity
        ORDER BY failures DESC, identity""",
    "auth_failures_by_host": """
        SELECT host, count(*) AS failures, count(DISTINCT identity) AS identities,
               max(ts) AS last
        FROM s WHERE event = 'auth_failure' GROUP BY host ORDER BY failures DESC, host""",
    "sessions": """
        SELECT session_id, min(ts) FILTER (WHERE event = 'open') AS opened,
               max(ts) FILTER (WHERE event = 'close') AS closed,
               epoch(closed) - epoch(opened) AS duration_s
        FROM s WHERE session_id IS NOT NULL GROUP BY session_id ORDER BY opened, session_id""",
}


def duckdb_child(journal: Path, out: Path) -> None:
    """The DuckDB process: the same tables, as Parquet under ``out``."""
    import duckdb

    from msgbroker.analytics.journal_files import MESSAGES, SESSIONS, list_table

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    files = {t: [str(p) for p in list_table(journal, t).segments] for t in (MESSAGES, SESSIONS)}

    def listed(paths: list[str]) -> str:  # views cannot take parameters
        return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"

    con.execute(
        'CREATE VIEW m AS SELECT * EXCLUDE (payload), coalesce("count", 1) AS n '
        f"FROM read_parquet({listed(files[MESSAGES])}, union_by_name = true)"
    )
    con.execute("CREATE VIEW t AS SELECT * FROM m WHERE kind IN ('mcast', 'ucast', 'bcast')")
    con.execute(f"CREATE VIEW s AS SELECT * FROM read_parquet({listed(files[SESSIONS])})")
    for name, sql in DUCKDB_TABLES.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(con.execute(sql).to_arrow_table(), out / name / "part-00000.parquet")


def timed(argv: list[str]) -> dict[str, float]:
    """Run ``argv`` to completion: its wall clock, and the CPU time and peak RSS of it and
    the descendants it waited for (``wait4``; a JVM that PySpark leaves to exit on its own
    is not among them, so Spark's CPU figures are its Python side only)."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        if process.returncode != 0:
            err.seek(0)
            sys.exit(f"{argv[:3]} failed ({process.returncode}):\n{err.read()}")
    return {
        "wall": wall,
        "user": usage.ru_utime,
        "sys": usage.ru_stime,
        "maxrss_mb": usage.ru_maxrss / 1024,
    }


def show(label: str, t: dict[str, float]) -> None:
    print(
        f"{label:<34} {t['wall']:6.1f} s wall  {t['user']:6.1f} s user  {t['sys']:5.1f} s sys  "
        f"(peak RSS {t['maxrss_mb']:.0f} MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("journal", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--duckdb-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.duckdb_child:
        duckdb_child(args.journal, args.duckdb_child)
        return

    rows = sum(
        pq.read_metadata(p).num_rows for p in (args.journal / "messages").rglob("seg-*.parquet")
    )
    print(f"journal: {args.journal} ({rows:,} message rows), {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-analytics-") as tmp:
        spark_out = Path(tmp, "spark")
        for i in range(args.repeat):
            t = timed(
                [MSGBROKER, "analytics", "report", str(args.journal), "--out", str(spark_out),
                 "--master", args.master]
            )  # fmt: skip
            show(f"spark: msgbroker analytics report #{i + 1}", t)
        try:
            import duckdb  # noqa: F401
        except ImportError:
            print("duckdb: not installed (pip install duckdb)")
        else:
            for i in range(args.repeat):
                out = Path(tmp, f"duckdb{i}")
                t = timed([sys.executable, __file__, str(args.journal), "--duckdb-child", str(out)])
                show(f"duckdb: same tables, no charts #{i + 1}", t)
            spark_topics = pq.read_table(spark_out / "tables" / "topics")
            duck_topics = pq.read_table(out / "topics").cast(spark_topics.schema)
            same = spark_topics.equals(duck_topics)
            print(f"topics tables equal: {same}")

        from msgbroker.analytics import charts

        tables = {p.name: pq.read_table(p) for p in (spark_out / "tables").iterdir() if p.is_dir()}
        started = time.perf_counter()
        charts.render_all(tables, Path(tmp, "charts"))
        print(f"{'charts alone (in this process)':<34} {time.perf_counter() - started:6.1f} s")
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
