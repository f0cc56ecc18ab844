"""Replace one grabbed FiredEvent job by one ProcessSubscription job per follower, in Spark.

Run: PYSPARK_PYTHON=.venv/bin/python .venv/bin/python examples/pipeline_replace.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import homing
import homing.spark


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    try:
        print(fan_out(spark))  # {'FiredEvent': (0, 1), 'ProcessSubscription': (1000, 0)}
    finally:
        spark.stop()


def fan_out(spark: Any) -> dict[str, tuple[int, int]]:
    """The example on a given SparkSession; returns (ready, done) per job type."""
    url = f"sqlite:///{tempfile.mkdtemp()}/example.db"  # absolute path: executors use it too
    db = homing.connect(url)
    db.insert("FiredEvent", {"event_id": 1, "topic": 7})
    event = db.grab("FiredEvent", lock_for=600)
    assert event is not None

    homing.spark.register(spark)
    parents = (
        spark.read.format("homing")
        .option("url", url)
        .option("leaseToken", event.lease_token)
        .load()
    )
    followers = spark.range(0, 1000).withColumnRenamed("id", "subscriber_id")
    children = (
        parents.select(F.col("id").alias("parent_id"))
        .crossJoin(followers)
        .withColumn("type", F.lit("ProcessSubscription"))
    )
    homing.spark.replace_with(
        children,
        url,
        lease_token=event.lease_token,
        parents=1,
        keyColumns="parent_id,subscriber_id",
    )
    stats = {r["type"]: (r["ready"], r["done"]) for r in db.stats()}
    db.close()
    return stats


if __name__ == "__main__":
    main()
