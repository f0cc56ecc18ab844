"""Benchmark of homing.spark, in one run and one SparkSession (local[*]):

1. Reading: rows/s of the homing source vs Spark's JDBC reader on the same PostgreSQL table
   (homing_jobs) vs reading the same rows from Parquet.
2. Writing: rows/s of the homing sink (staged + one commit) vs Spark's JDBC writer into an
   identical homing_jobs table vs writing Parquet.
3. Fan-out: the replace writer turning 1 grabbed event into N children (default 1,000,000)
   on SQLite and on PostgreSQL, total and commit time.

Needs Java 17 and the PostgreSQL JDBC driver (Debian: apt-get install libpostgresql-jdbc-java,
which installs /usr/share/java/postgresql.jar). Run: .venv/bin/python bench/spark.py
Results: bench/results/spark.json. The machine is shared and noisy: compare within a run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import homing  # noqa: E402
import homing.spark  # noqa: E402
from homing.jobs import JobSpec  # noqa: E402

PG = os.environ.get("HOMING_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
JAR = os.environ.get("HOMING_JDBC_JAR", "/usr/share/java/postgresql.jar")


def session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[*]")
        .appName("homing-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "2g")
    )
    if Path(JAR).exists():
        builder = builder.config("spark.jars", JAR)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    homing.spark.register(spark)
    return spark


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rate(rows: int, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "rows_per_s": round(rows / seconds, 1)}


def fresh_schema(prefix: str) -> tuple[str, str]:
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    return f"{PG}?schema={schema}", schema


def drop_schema(schema: str) -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def fill(url: str, rows: int) -> None:
    db = homing.connect(url, durable=False)
    chunk = 20_000
    for start in range(0, rows, chunk):
        db.insert_many(
            [
                JobSpec("bench", {"n": i, "pad": "x" * 40})
                for i in range(start, min(rows, start + chunk))
            ]
        )
    db.close()


def jdbc_url(schema: str) -> str:
    return f"jdbc:postgresql://127.0.0.1:5432/test?user=postgres&currentSchema={schema}&stringtype=unspecified"


def rates(rows: int, runs: list[float]) -> dict[str, Any]:
    """The median of interleaved runs, and every run."""
    med = statistics.median(runs)
    return {
        "seconds": round(med, 3),
        "rows_per_s": round(rows / med, 1),
        "runs_rows_per_s": [round(rows / t, 1) for t in runs],
    }


def ratio(out: dict[str, Any], ours: str, theirs: str) -> None:
    """Per-pair ratios (homing / Spark's own, the same repetition) and their median."""
    if not isinstance(out.get(theirs), dict):
        return
    pairs = [
        a / b
        for a, b in zip(out[ours]["runs_rows_per_s"], out[theirs]["runs_rows_per_s"], strict=True)
    ]
    out["ratio_median"] = round(statistics.median(pairs), 3)
    out["ratios"] = [round(r, 3) for r in pairs]


def bench_read(spark: Any, rows: int, tmp: Path, reps: int) -> dict[str, Any]:
    """The homing source, Spark's JDBC reader and Parquet, each once per repetition, in turn."""
    url, schema = fresh_schema("bench_read")
    try:
        fill(url, rows)
        out: dict[str, Any] = {"rows": rows, "reps": reps}
        homing_df = (
            spark.read.format("homing")
            .option("url", url)
            .option("queue", "bench")
            .option("numPartitions", "4")
            .load()
        )
        homing_df.write.format("noop").mode("overwrite").save()  # warm-up (first Python query)
        jdbc_df = None
        if Path(JAR).exists():
            jdbc_df = (
                spark.read.format("jdbc")
                .option("url", jdbc_url(schema))
                .option("dbtable", "homing_jobs")
                .option("partitionColumn", "seq")
                .option("lowerBound", "1")
                .option("upperBound", str(rows))
                .option("numPartitions", "4")
                .option("driver", "org.postgresql.Driver")
                .load()
            )
            jdbc_df.write.format("noop").mode("overwrite").save()  # warm-up (JVM, driver)
        parquet = tmp / "read.parquet"
        homing_df.write.mode("overwrite").parquet(str(parquet))
        pq_df = spark.read.parquet(str(parquet))
        runs: dict[str, list[float]] = {
            "homing_source": [],
            "jdbc_reader": [],
            "parquet_reader": [],
        }
        for _ in range(reps):
            runs["homing_source"].append(
                timed(lambda: homing_df.write.format("noop").mode("overwrite").save())
            )
            if jdbc_df is not None:
                runs["jdbc_reader"].append(
                    timed(lambda: jdbc_df.write.format("noop").mode("overwrite").save())
                )
            runs["parquet_reader"].append(
                timed(lambda: pq_df.write.format("noop").mode("overwrite").save())
            )
        for name, times in runs.items():
            out[name] = (
                rates(rows, times)
                if times
                else (f"skipped: no JDBC driver at {JAR} (apt-get install libpostgresql-jdbc-java)")
            )
        ratio(out, "homing_source", "jdbc_reader")
        return out
    finally:
        drop_schema(schema)


def _write_homing(src: Any) -> float:
    url, schema = fresh_schema("bench_write")
    try:
        homing.connect(url).close()
        return timed(
            lambda: (
                src.write.format("homing")
                .mode("append")
                .option("url", url)
                .option("keyColumns", "n")
                .save()
            )
        )
    finally:
        drop_schema(schema)


def _write_jdbc(src: Any) -> float:
    from pyspark.sql import functions as F

    url, schema = fresh_schema("bench_jdbcw")
    try:
        homing.connect(url).close()  # an identical homing_jobs table for the JDBC writer
        now = time.time()
        jdbc_src = src.select(
            F.expr("uuid()").alias("id"),
            "type",
            "args",
            F.lit("ready").alias("state"),
            F.lit(now).alias("run_at"),
            F.lit(now).alias("available_at"),
            F.lit(now).alias("created_at"),
        )
        return timed(
            lambda: (
                jdbc_src.write.format("jdbc")
                .option("url", jdbc_url(schema))
                .option("dbtable", "homing_jobs")
                .option("driver", "org.postgresql.Driver")
                .option("batchsize", "10000")
                .mode("append")
                .save()
            )
        )
    finally:
        drop_schema(schema)


def bench_write(spark: Any, rows: int, tmp: Path, reps: int) -> dict[str, Any]:
    """The homing sink and Spark's JDBC writer, each into a fresh, identical homing_jobs
    table once per repetition, in turn; Parquet for scale."""
    from pyspark.sql import functions as F

    src = (
        spark.range(0, rows, numPartitions=4)
        .select(
            F.col("id").alias("n"),
            F.lit("bench").alias("type"),
            F.to_json(F.struct(F.col("id").alias("n"), F.lit("x" * 40).alias("pad"))).alias("args"),
        )
        .cache()
    )
    src.count()
    out: dict[str, Any] = {"rows": rows, "reps": reps}
    runs: dict[str, list[float]] = {"homing_sink": [], "jdbc_writer": [], "parquet_writer": []}
    for _ in range(reps):
        runs["homing_sink"].append(_write_homing(src))
        if Path(JAR).exists():
            runs["jdbc_writer"].append(_write_jdbc(src))
        runs["parquet_writer"].append(
            timed(lambda: src.write.mode("overwrite").parquet(str(tmp / "write.parquet")))
        )
    for name, times in runs.items():
        out[name] = rates(rows, times) if times else f"skipped: no JDBC driver at {JAR}"
    ratio(out, "homing_sink", "jdbc_writer")
    src.unpersist()
    return out


def bench_fanout(spark: Any, children: int, url: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    db.insert("FiredEvent", {"event": 1})
    job = db.grab("FiredEvent", lock_for=3600)
    assert job is not None
    kids = spark.range(0, children, numPartitions=4).select(
        F.lit(job.id).alias("parent_id"),
        F.col("id").alias("subscriber_id"),
        F.lit("ProcessSubscription").alias("type"),
    )
    total = timed(
        lambda: homing.spark.replace_with(
            kids, url, lease_token=job.lease_token, parents=1, keyColumns="parent_id,subscriber_id"
        )
    )
    stats = {r["type"]: r for r in db.stats()}
    visible = stats["ProcessSubscription"]["ready"]
    db.close()
    assert visible == children, (visible, children)
    return {
        "children": children,
        **rate(children, total),
        "commit_note": "one UPDATE of one batch row + one publication row",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--fanout", type=int, default=1_000_000, help="0: skip the fan-out")
    parser.add_argument("--reps", type=int, default=3, help="interleaved read/write repetitions")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "spark.json")
    a = parser.parse_args()
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        sys.exit("Spark needs Java 17: apt-get install -y openjdk-17-jre-headless")
    tmp = Path(tempfile.mkdtemp(prefix="homing-bench-spark-"))
    spark = session()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "note": "shared, noisy",
        },
        "spark": spark.version,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_at_start": os.getloadavg(),
        "read": bench_read(spark, a.rows, tmp, a.reps),
        "write": bench_write(spark, a.rows, tmp, a.reps),
    }
    print(json.dumps(results, indent=2), flush=True)
    fan: dict[str, Any] = {}
    if a.fanout <= 0:
        spark.stop()
        a.out.write_text(json.dumps(results, indent=2) + "\n")
        return
    fan["sqlite"] = bench_fanout(spark, a.fanout, f"sqlite:///{tmp / 'fanout.db'}?durable=false")
    print(json.dumps(fan, indent=2), flush=True)
    url, schema = fresh_schema("bench_fanout")
    try:
        fan["postgres"] = bench_fanout(spark, a.fanout, url)
    finally:
        drop_schema(schema)
    results["fanout"] = fan
    spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
