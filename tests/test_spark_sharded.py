"""homing.spark on a sharded store: two PostgreSQL databases (created for the test, dropped
after). Reads cover every shard, children go to their parent's shard, the commit is one
idempotent transaction per shard, and a crash between the shards' commits loses nothing."""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import homing
from homing import _failpoints
from homing._failpoints import FailpointError
from homing.spark._common import derive_id, lease_options
from homing.store import spark_queries as sq
from tests.conftest import postgres_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import spark_fixtures  # noqa: E402

spark = spark_fixtures.spark  # the session-scoped SparkSession fixture


@pytest.fixture
def two_shards() -> Iterator[tuple[str, homing.ShardedDatabase]]:
    """Two fresh databases on the test server, as a comma-separated sharded URL."""
    import psycopg
    from psycopg import sql

    base = postgres_url()
    tag = uuid.uuid4().hex[:8]
    names = [f"homing_spark_s{i}_{tag}" for i in range(2)]
    with psycopg.connect(base, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    head = base.rsplit("/", 1)[0]
    urls = [f"{head}/{name}" for name in names]
    db = homing.connect(urls)
    assert isinstance(db, homing.ShardedDatabase)
    try:
        yield ",".join(urls), db
    finally:
        db.close()
        from homing.spark._common import _stores

        for key in [k for k in _stores if k[1] in urls]:
            _stores.pop(key).close()
        with psycopg.connect(base, autocommit=True) as conn:
            for name in names:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def _children(jobs: list[homing.Job], k: int) -> Any:
    import pyarrow as pa

    parents = [j.handle for j in jobs for _ in range(k)]
    keys = [i for _ in jobs for i in range(k)]
    return pa.RecordBatch.from_pydict(
        {"parent_id": parents, "k": keys, "type": ["child"] * len(keys)}
    )


def _per_shard(db: homing.ShardedDatabase, run_type: str) -> list[Counter[str]]:
    """Per shard: children per parent id (visible ones, any state)."""
    out = []
    for shard in db.shards:
        with shard.store.transaction(write=False) as tx:
            rows = sq.read_table(tx, run_type, 0, sq.BIG, None)
        out.append(Counter(str(r[7]) for r in rows))
    return out


def test_replace_across_shards_survives_a_crash_between_shard_commits(
    two_shards: tuple[str, homing.ShardedDatabase],
) -> None:
    """No Spark needed: the writer's task and commit sides, driven directly. The commit
    stops after shard 0 (a failpoint); shard 0's parents are done with their children,
    shard 1's are still leased with theirs invisible; the re-run commits shard 1 only; a
    doubled commit changes nothing: each parent's children exist exactly once."""
    from homing.spark._write import JobsWriter

    url, db = two_shards
    db.insert_many([("parent", {"n": i}) for i in range(10)])
    jobs = db.grab_many("parent", lock_for=300, limit=10)
    assert {j.handle.split(":")[0] for j in jobs} == {"0", "1"}
    options = {"url": url, "keyColumns": "parent_id,k", **lease_options(jobs)}
    writer = JobsWriter(options, ["parent_id", "k", "type"])
    messages = [writer.write(iter([_children(jobs, 3)]))]
    writer.write(iter([_children(jobs[:4], 3)]))  # a retried task: the same ids, no-ops
    _failpoints.configure("spark.commit.between_shards=raise")
    try:
        with pytest.raises(FailpointError):
            writer.commit(messages)
    finally:
        _failpoints.configure(None)
    on = [sum(1 for j in jobs if j.handle.startswith(f"{i}:")) for i in range(2)]
    counts = _per_shard(db, "child")
    assert sum(counts[0].values()) == 3 * on[0] and not counts[1]  # shard 1 still invisible
    assert db.stats()  # the store still answers
    writer.commit(messages)  # the re-run: shard 0 is skipped, shard 1 commits
    writer.commit(messages)  # doubled: nothing
    counts = _per_shard(db, "child")
    for i, shard_jobs in enumerate(counts):
        parents = {j.id for j in jobs if j.handle.startswith(f"{i}:")}
        assert set(shard_jobs) == parents  # children on their parent's shard
        assert set(shard_jobs.values()) == {3}  # exactly once each
    for j in jobs:
        assert db.details(j.handle).state == "done"
    expected = {derive_id("child", j.handle, k) for j in jobs for k in range(3)}
    got = {c.id for c in db.grab_many("child", lock_for=30, limit=100)}
    assert got == expected


def test_spark_reads_and_replaces_on_two_shards(
    spark: Any, two_shards: tuple[str, homing.ShardedDatabase], tmp_path: Path
) -> None:
    """Through Spark: a batch read sees every shard (ids as handles), a replace of parents
    leased on both shards puts each child on its parent's shard once, and a stream with
    Trigger.AvailableNow reads both shards' children once each."""
    import homing.spark

    url, db = two_shards
    db.insert_many([("event", {"n": i}) for i in range(20)])
    table = spark.read.format("homing").option("url", url).option("queue", "event").load()
    handles = {r.id for r in table.select("id").collect()}
    assert len(handles) == 20 and {h.split(":")[0] for h in handles} == {"0", "1"}
    jobs = db.grab_many("event", lock_for=300, limit=20)
    parents = spark.read.format("homing").option("url", url).options(**lease_options(jobs))
    children = (
        parents.load()
        .selectExpr("id AS parent_id", "explode(sequence(1, 5)) AS k", "'child' AS type")
        .repartition(3)
    )
    homing.spark.replace_jobs(children, url, jobs, keyColumns="parent_id,k")
    homing.spark.replace_jobs(children, url, jobs, keyColumns="parent_id,k")  # no-op
    counts = _per_shard(db, "child")
    for i, per_parent in enumerate(counts):
        assert set(per_parent) == {j.id for j in jobs if j.handle.startswith(f"{i}:")}
        assert set(per_parent.values()) == {5}
    assert all(db.details(j.handle).state == "done" for j in jobs)

    out = tmp_path / "out"
    query = (
        spark.readStream.format("homing")
        .option("url", url)
        .option("queue", "child")
        .option("consumer", "sharded-test")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    seen = [r.id for r in spark.read.parquet(str(out)).select("id").collect()]
    assert len(seen) == len(set(seen)) == 100
    assert {h.split(":")[0] for h in seen} == {"0", "1"}


def test_pipeline_on_two_shards_counts_every_delivery_once(
    spark: Any, two_shards: tuple[str, homing.ShardedDatabase], tmp_path: Path
) -> None:
    """The whole pipeline on a two-database store: events on the shards their keys pick,
    each replace commits per shard, a delivery worker per shard (each killed once) drains
    its shard's jobs and outbox; every delivery's effect counted."""
    from rich.console import Console

    from homing.pipeline import PipelineConfig, run_pipeline

    url, db = two_shards
    # events go to the shards their unique keys pick: take a run id whose keys use both
    run = next(
        f"t{n}"
        for n in range(1000)
        if len({db.shard_for_key(f"t{n}:event:{i}") for i in range(6)}) == 2
    )
    cfg = PipelineConfig(
        db=url,
        run_id=run,
        events=6,
        subscribers=20,
        workers=2,
        concurrency=4,
        kills=2,
        lock_for=2.0,
        temp_pct=10,
        chunk=40,
        data_dir=tmp_path / "data",
        timeout=240,
        progress=False,
    )
    report = run_pipeline(cfg, spark=spark, console=Console(quiet=True))
    checks = report.checks
    assert checks["lost"] == 0 and checks["duplicated"] == 0 and checks["unexpected"] == 0
    assert checks["left_unfinished"] == 0
    assert checks["subscriptions"] == report.expected.subscriptions == 120
    assert checks["notifications"] == report.expected.notifications
    assert report.deliveries["delivered"] == report.expected.notifications - report.expected.bounces
    assert report.deliveries["workers_killed"] == 2
    assert report.ok
    per_shard = [
        sum(n for (t, _), n in _run_counts(shard, report.run).items() if t == "ProcessNotification")
        for shard in db.shards
    ]
    assert all(n > 0 for n in per_shard) and sum(per_shard) == report.expected.notifications


def _run_counts(shard: homing.Database, run: str) -> dict[tuple[str, str], int]:
    with shard.store.transaction(write=False) as tx:
        return sq.run_counts(tx, run)
