"""The pipeline's Spark stages: each one replaces grabbed parent jobs by their children.

FiredEvent --(join subscriptions)--> ProcessSubscription --(subscriber's channels)-->
ProcessNotification. Each stage grabs parents with one lease token, reads exactly those
parents as a DataFrame, computes the children and hands them to the replace writer, whose
single driver commit completes the parents and makes the children visible. On a sharded
store the grab holds a lease per shard, each child goes to its parent's shard, and the
commit is one transaction per shard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homing.database import Database, ShardedDatabase
from homing.spark import FORMAT, lease_options, replace_jobs

EVENT = "FiredEvent"
SUBSCRIPTION = "ProcessSubscription"
NOTIFICATION = "ProcessNotification"


@dataclass
class StageStats:
    name: str
    parents: int = 0
    children: int = 0
    commits: int = 0
    seconds: float = 0.0


def _parents(spark: Any, url: str, jobs: list[Any]) -> Any:
    """Exactly the jobs one grab leased (on a sharded store: each shard's lease)."""
    return spark.read.format(FORMAT).option("url", url).options(**lease_options(jobs)).load()


def _parallelism(spark: Any) -> int:
    return max(2, int(spark.sparkContext.defaultParallelism))


def fan_out_events(
    spark: Any,
    db: Database | ShardedDatabase,
    url: str,
    run: str,
    subscriptions: Path,
    *,
    lock_for: float = 900.0,
    chunk: int = 1000,
    stats: StageStats | None = None,
) -> StageStats:
    """FiredEvent -> one ProcessSubscription per follower of the event's topic."""
    from pyspark.sql import functions as F

    stats = stats or StageStats(f"{EVENT} -> {SUBSCRIPTION}")
    subs = spark.read.parquet(str(subscriptions))
    while True:
        jobs = db.grab_many(EVENT, lock_for=lock_for, limit=chunk, where={"run": run})
        if not jobs:
            return stats
        start = time.monotonic()
        events = _parents(spark, url, jobs).select(
            F.col("id").alias("parent_id"),
            F.get_json_object("args", "$.event_id").cast("long").alias("event_id"),
            F.get_json_object("args", "$.topic").cast("int").alias("topic"),
        )
        children = (
            F.broadcast(events)
            .join(subs, "topic")
            .select(
                "parent_id",
                F.lit(run).alias("run"),
                "event_id",
                "subscriber_id",
                F.lit(SUBSCRIPTION).alias("type"),
            )
            .repartition(_parallelism(spark))
        )
        replace_jobs(
            children,
            url,
            jobs,
            sink=f"pipeline.{EVENT}",
            keyColumns="run,event_id,subscriber_id",
        )
        stats.parents += len(jobs)
        stats.commits += 1
        stats.seconds += time.monotonic() - start


def fan_out_subscriptions(
    spark: Any,
    db: Database | ShardedDatabase,
    url: str,
    run: str,
    subscribers: Path,
    *,
    lock_for: float = 900.0,
    chunk: int = 20_000,
    stats: StageStats | None = None,
) -> StageStats:
    """ProcessSubscription -> 1-3 ProcessNotification by the subscriber's channels."""
    from pyspark.sql import functions as F

    stats = stats or StageStats(f"{SUBSCRIPTION} -> {NOTIFICATION}")
    people = spark.read.parquet(str(subscribers))
    while True:
        jobs = db.grab_many(SUBSCRIPTION, lock_for=lock_for, limit=chunk, where={"run": run})
        if not jobs:
            return stats
        start = time.monotonic()
        parents = _parents(spark, url, jobs).select(
            F.col("id").alias("parent_id"),
            F.get_json_object("args", "$.event_id").cast("long").alias("event_id"),
            F.get_json_object("args", "$.subscriber_id").cast("long").alias("subscriber_id"),
        )
        children = parents.join(people, "subscriber_id").select(
            "parent_id",
            F.lit(run).alias("run"),
            "event_id",
            "subscriber_id",
            F.explode(F.split("channels", ",")).alias("channel"),
            "email",
            F.lit(NOTIFICATION).alias("type"),
        )
        replace_jobs(
            children,
            url,
            jobs,
            sink=f"pipeline.{SUBSCRIPTION}",
            keyColumns="run,event_id,subscriber_id,channel",
        )
        stats.parents += len(jobs)
        stats.commits += 1
        stats.seconds += time.monotonic() - start
