"""Fan-out on a sharded store: the replace writer turning grabbed events into N children
(default 1,000,000) on 1 and on 2 PostgreSQL databases (created here, dropped after).

Children live on their parent's shard (docs/spark.md), so 1 event -> N children puts them
all on one shard whatever the number of shards; 2 events, one per shard, -> N/2 children
each spread the work. Run: .venv/bin/python bench/spark_shards.py
Results: bench/results/spark-shards.json. The machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import homing  # noqa: E402
import homing.spark  # noqa: E402
from spark import PG, session  # noqa: E402


def databases(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    names = [f"homing_bench_s{i}_{tag}" for i in range(n)]
    with psycopg.connect(PG, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return names


def drop(names: list[str]) -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        for name in names:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def fanout(spark: Any, urls: list[str], events: int, children: int) -> dict[str, Any]:
    """``events`` parents (placed on distinct shards when there are enough) replaced by
    ``children`` children in total, in one Spark job and one commit per shard."""
    from pyspark.sql import functions as F

    db = homing.connect(urls, durable=False)
    shards = db.shards if isinstance(db, homing.ShardedDatabase) else [db]
    for i in range(events):
        shards[i % len(shards)].insert("FiredEvent", {"event": i})
    jobs = db.grab_many("FiredEvent", lock_for=3600, limit=events)
    assert len(jobs) == events
    url = ",".join(urls)
    parents = spark.createDataFrame([(j.handle,) for j in jobs], "parent_id string")
    per = children // events
    kids = parents.crossJoin(spark.range(0, per, numPartitions=4)).select(
        "parent_id", F.col("id").alias("subscriber_id"), F.lit("ProcessSubscription").alias("type")
    )
    t0 = time.perf_counter()
    homing.spark.replace_jobs(kids.repartition(4), url, jobs, keyColumns="parent_id,subscriber_id")
    seconds = time.perf_counter() - t0
    visible = [
        int({r["type"]: r for r in s.stats()}.get("ProcessSubscription", {}).get("ready", 0))
        for s in shards
    ]
    db.close()
    assert sum(visible) == per * events, visible
    return {
        "shards": len(urls),
        "events": events,
        "children": per * events,
        "children_per_shard": visible,
        "seconds": round(seconds, 2),
        "rows_per_s": round(per * events / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--children", type=int, default=1_000_000)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "spark-shards.json"
    )
    a = parser.parse_args()
    spark = session()
    runs = []
    for shards, events in ((1, 1), (2, 1), (2, 2)):
        names = databases(shards)
        try:
            head = PG.rsplit("/", 1)[0]
            runs.append(fanout(spark, [f"{head}/{n}" for n in names], events, a.children))
            print(json.dumps(runs[-1]), flush=True)
        finally:
            drop(names)
    spark.stop()
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "note": "shared"},
        "runs": runs,
    }
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
