"""The child process of :func:`msgbroker.analytics.classcache.prepare`: a Spark session
that lists the classes it loads while it runs a workload like the jobs'. Its own module, so
that the archive's bookkeeping (:mod:`.classcache`, which the session reads) does not import
the session."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def record() -> None:
    """The child process: start a session that lists the classes it loads, run a workload
    like the jobs', write the driver's classpath and options to ``argv[2]`` as JSON."""
    class_list, out = sys.argv[1], sys.argv[2]
    import pyspark.sql.functions as F

    from .session import start_session

    spark = start_session(
        "local[2]",
        quiet=True,
        **{
            "spark.driver.extraJavaOptions": f"-XX:DumpLoadedClassList={class_list}",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    try:
        jvm = spark._jvm
        assert jvm is not None
        df = spark.createDataFrame(
            [(i % 3, float(i), f"t{i % 2}", i * 1_000_000) for i in range(24)],
            "k int, v double, s string, us long",
        ).withColumn("ts", F.timestamp_micros("us"))
        df.groupBy("k", F.window("ts", "10 seconds")).agg(
            F.count("*").alias("n"),
            F.sum("v"),
            F.max("s"),
            F.min("ts"),
            F.first("s"),
        ).withColumn("j", F.to_json(F.struct("k", "n"))).toArrow()
        with tempfile.TemporaryDirectory(prefix="msgbroker-cds-") as tmp:
            df.write.parquet(f"{tmp}/t")
            spark.read.parquet(f"{tmp}/t").where(F.col("v") > 1).groupBy(
                F.date_trunc("hour", "ts")
            ).agg(F.sum(F.when(F.col("k") == 1, F.lit(1)).otherwise(0))).toArrow()

        def partition_sum(rows: Any) -> Any:
            yield sum(rows)

        spark.sparkContext.parallelize(range(8), 2).mapPartitions(partition_sum).collect()
        spark.sql("SELECT 1 AS x, 'a' AS y UNION ALL SELECT 2, 'b'").where("x > 1").collect()
        runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        info = {
            "classpath": str(jvm.java.lang.System.getProperty("java.class.path")),
            "java_home": str(jvm.java.lang.System.getProperty("java.home")),
            "options": [str(a) for a in runtime.getInputArguments()],
        }
    finally:
        spark.stop()
    Path(out).write_text(json.dumps(info))
