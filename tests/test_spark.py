"""homing.spark: readers and writers against a real Spark (local[2,2]) on both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import homing
from homing.errors import ConfigurationError, StaleLease
from homing.spark._common import check_master, derive_id
from homing.store import spark_queries as sq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import spark_fixtures  # noqa: E402

spark = spark_fixtures.spark  # the session-scoped SparkSession fixture


def _jobs_batch(n: int, start: int = 0) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pydict(
        {"k": list(range(start, start + n)), "type": ["child"] * n, "payload": ["x"] * n}
    )


def _visible_count(db: homing.Database, job_type: str) -> tuple[int, int]:
    rows = {r["type"]: r for r in db.stats()}
    row = rows.get(job_type, {})
    return int(row.get("ready", 0)), int(row.get("staged", 0))


# -- no Spark needed: the writer's commit protocol ----------------------------------------
def test_sink_commit_twice_publishes_once(db: homing.Database) -> None:
    from homing.spark._write import JobsStreamWriter

    options = {"url": db.url, "sinkId": "s1", "keyColumns": "k"}
    writer = JobsStreamWriter(options, ["k", "type", "payload"])
    messages = [writer.write(iter([_jobs_batch(30)])), writer.write(iter([_jobs_batch(20, 30)]))]
    # a retried task attempt writes its rows again: nothing new appears
    writer.write(iter([_jobs_batch(30)]))
    assert _visible_count(db, "child") == (0, 50)  # staged, invisible before the commit
    assert db.grab("child", lock_for=10) is None
    fresh = JobsStreamWriter(options, ["k", "type", "payload"])  # Spark: new instance per call
    fresh.commit(messages, 0)
    JobsStreamWriter(options, ["k", "type", "payload"]).commit(messages, 0)
    assert _visible_count(db, "child") == (50, 0)
    with db.store.transaction() as tx:
        assert tx.query_one("SELECT COUNT(*) FROM homing_spark_commits")[0] == 1
    # the batch replayed after its commit writes nothing and publishes nothing
    again = JobsStreamWriter(options, ["k", "type", "payload"])
    again.commit([again.write(iter([_jobs_batch(50)]))], 0)
    assert _visible_count(db, "child") == (50, 0)
    ids = {j.id for j in db.grab_many("child", lock_for=10, limit=100)}
    assert ids == {derive_id("child", k) for k in range(50)}


def test_replace_refuses_a_lost_parent_and_adopts_orphans(db: homing.Database) -> None:
    from homing.spark._write import JobsWriter

    db.insert_many([("parent", {"n": i}) for i in range(3)])
    first = db.grab_many("parent", lock_for=5, limit=3)
    opts = {"url": db.url, "keyColumns": "k", "parents": "3"}
    w1 = JobsWriter({**opts, "leaseToken": first[0].lease_token}, ["k", "type", "payload"])
    msg = w1.write(iter([_jobs_batch(10)]))
    db.clock.advance(6)  # type: ignore[attr-defined]
    second = db.grab_many("parent", lock_for=5, limit=3)  # the lease passed to another run
    with pytest.raises(StaleLease, match="only 0 still are"):
        w1.commit([msg])
    assert _visible_count(db, "child") == (0, 10)
    w2 = JobsWriter({**opts, "leaseToken": second[0].lease_token}, ["k", "type", "payload"])
    w2.commit([w2.write(iter([_jobs_batch(12)]))])  # 10 orphans adopted, 2 new
    w2.commit([])  # a doubled commit: nothing changes
    assert _visible_count(db, "child") == (12, 0)
    assert {r["type"]: r["done"] for r in db.stats()}["parent"] == 3


def test_sink_options_are_checked(tmp_path: Path) -> None:
    from homing.spark._write import JobsStreamWriter, JobsWriter

    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigurationError, match="deterministic row ids"):
        JobsWriter({"url": url, "type": "t"}, ["a"])
    with pytest.raises(ConfigurationError, match="job type"):
        JobsWriter({"url": url, "id": "x"}, ["id"])
    with pytest.raises(ConfigurationError, match="sinkId"):
        JobsStreamWriter({"url": url, "type": "t"}, ["id"])
    with pytest.raises(ConfigurationError, match="parents"):
        JobsWriter({"url": url, "type": "t", "leaseToken": "x"}, ["id"])
    with pytest.raises(ConfigurationError, match="local Spark master"):
        check_master(url, "spark://elsewhere:7077")
    check_master(url, "local-cluster[2,1,1024]")
    check_master("postgresql://h/db", "spark://elsewhere:7077")


def test_copy_read_gives_the_rows_the_row_read_gives(db: homing.Database) -> None:
    """The batch reader takes PostgreSQL's rows as COPY CSV parsed by pyarrow: the same
    values as the row-by-row read, NULL told from "", commas, quotes, newlines, unicode,
    exact floats; on a sharded store ids and parent ids get the shard prefix."""
    import pyarrow as pa

    from homing.spark._read import _arrow_batches, _csv_batches, _fix_table, _types

    tricky = {"s": 'a,b"c\nd', "u": "zürich ☃", "e": "", "f": 0.1 + 0.2}
    parent = db.insert("parent", {"n": 0})
    db.insert_many([("ev", {**tricky, "n": i}) for i in range(5)])
    db.insert("ev", {"n": 99}, priority=7, run_at=1234.5678901234)
    with db.store.transaction() as tx:  # a child, a NULL and an empty last_error
        tx.execute("UPDATE homing_jobs SET parent_id = ? WHERE type = 'ev'", (parent,))
        tx.execute(
            "UPDATE homing_jobs SET last_error = ? WHERE type = 'ev' AND priority = 7",
            ('line one\nline, two "quoted"',),
        )
        tx.execute(
            "UPDATE homing_jobs SET last_error = '' WHERE seq = (SELECT MIN(seq) "
            "FROM homing_jobs WHERE type = 'ev')"
        )
    with db.store.transaction(write=False) as tx:
        lo, hi = sq.seq_bounds(tx, "ev")
        data = sq.read_table_csv(tx, "ev", lo - 1, hi, None)
        rows = sq.read_table(tx, "ev", lo - 1, hi, None)
    if db.store.dialect != "postgres":
        assert data is None  # SQLite: the row read
        return
    assert data is not None
    cols, types = sq.TABLE_COLUMNS, _types(sq.TABLE_COLUMNS)
    by_rows = pa.Table.from_batches(list(_arrow_batches(cols, _fix_table(rows), types)))
    by_copy = pa.Table.from_batches(list(_csv_batches(data, cols, types, None)))
    assert by_copy.num_rows == 6 and by_copy.to_pylist() == by_rows.to_pylist()
    errors = by_copy.column("last_error").to_pylist()
    assert errors.count("") == 1 and errors.count(None) == 4
    sharded = pa.Table.from_batches(list(_csv_batches(data, cols, types, 1)))
    assert sharded.column("id").to_pylist() == [f"1:{i}" for i in by_rows.column("id").to_pylist()]
    assert set(sharded.column("parent_id").to_pylist()) == {f"1:{parent}"}


# -- with Spark --------------------------------------------------------------------------
def test_batch_read_write_roundtrip(spark: Any, db: homing.Database) -> None:
    db.insert_many([("ev", {"n": i}) for i in range(40)])
    df = spark.read.format("homing").option("url", db.url).option("queue", "ev").load()
    rows = df.collect()
    assert sorted(json.loads(r.args)["n"] for r in rows) == list(range(40))
    out = df.selectExpr("id AS src", "'copy' AS type", "args")
    for _ in range(2):  # written twice: deterministic ids create each job once
        out.write.format("homing").mode("append").option("url", db.url).option(
            "keyColumns", "src"
        ).save()
    assert _visible_count(db, "copy") == (40, 0)


def test_failing_task_once_leaves_no_duplicates(spark: Any, db: homing.Database) -> None:
    from pyspark.sql import functions as F

    @F.udf(returnType="string", useArrow=False)  # type: ignore[misc]
    def type_or_fail(k: int) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and k == 19_990:
            raise RuntimeError("injected task failure after rows were written")
        return "child"

    df = spark.range(0, 40_000, numPartitions=2).select(
        F.col("id").alias("k"), type_or_fail("id").alias("type")
    )
    df.write.format("homing").mode("append").option("url", db.url).option("keyColumns", "k").save()
    assert _visible_count(db, "child") == (40_000, 0)
    with db.store.transaction() as tx:
        row = tx.query_one("SELECT COUNT(*), COUNT(DISTINCT id) FROM homing_jobs")
    assert row == (40_000, 40_000)


def test_stream_replays_identical_rows_after_restart(
    spark: Any, db: homing.Database, tmp_path: Path
) -> None:
    db.insert_many([("ev", {"n": i}) for i in range(25)])
    checkpoint = tmp_path / "ckpt"
    seen: dict[int, list[tuple[str, str]]] = {}

    def record(batch_df: Any, batch_id: int) -> None:
        seen.setdefault(batch_id, []).append(
            tuple(sorted((r.id, r.args) for r in batch_df.collect()))  # type: ignore[arg-type]
        )

    def run() -> None:
        q = (
            spark.readStream.format("homing")
            .option("url", db.url)
            .option("queue", "ev")
            .option("consumer", "test")
            .option("maxRowsPerBatch", "10")
            .load()
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    run()
    assert sorted(seen) == [0, 1, 2]
    assert [len(seen[b][0]) for b in (0, 1, 2)] == [10, 10, 5]
    # the last batch is never acknowledged by AvailableNow; the cursor is at batch 1's end
    with db.store.transaction() as tx:
        cursor = sq.get_cursor(tx, "test", "ev")
    assert cursor is not None and cursor["seq"] > 0
    # a crash after the batch's offsets were logged but before its commit: replayed exactly
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    db.insert_many([("ev", {"n": 100 + i}) for i in range(3)])
    run()
    assert seen[2][0] == seen[2][1]
    assert len(seen[3][0]) == 3
    ids = [i for b in sorted(seen) for i, _ in seen[b][0]]
    assert len(ids) == len(set(ids)) == 28


def test_kill_driver_between_task_writes_and_commit(spark: Any, store_url: str) -> None:
    """kill -9 of a driver (and its JVM) after every task staged its rows, before the driver
    commit; a second run of the replace adopts the orphans: each child exactly once."""
    url = store_url
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    db.insert_many([("parent", {"p": i}) for i in range(4)])
    first = db.grab_many("parent", lock_for=3, limit=4)
    env = dict(os.environ, HOMING_FAILPOINTS="spark.commit.before=sleep(300000)")
    env["PYTHONPATH"] = str(HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    driver = subprocess.Popen(
        [sys.executable, str(HERE / "spark_fixtures.py"), "replace", url, first[0].lease_token],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while _visible_count(db, "child")[1] < 400:  # every child staged: commit is next
            assert driver.poll() is None, "the driver exited before the commit"
            assert time.monotonic() < deadline, "the driver never staged its children"
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # kill -9 of the driver and its JVM
        driver.wait()
    assert _visible_count(db, "child") == (0, 400)
    time.sleep(3.5)  # the parents' lease expires
    second = db.grab_many("parent", lock_for=60, limit=4)
    assert len(second) == 4
    spark_fixtures.replace_children(spark, url, second[0].lease_token)
    assert _visible_count(db, "child") == (400, 0)
    with db.store.transaction() as tx:
        assert tx.query_one(
            "SELECT COUNT(*), COUNT(DISTINCT id) FROM homing_jobs WHERE type = 'child'"
        ) == (400, 400)
    assert {r["type"]: r["done"] for r in db.stats()}["parent"] == 4
    # the published children stream in commit order, within maxRowsPerBatch, once each
    q = (
        spark.readStream.format("homing")
        .option("url", url)
        .option("queue", "child")
        .option("maxRowsPerBatch", "150")
        .load()
        .writeStream.format("memory")
        .queryName(f"children_stream_{db.dialect}")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [150, 150, 100]
    table = f"children_stream_{db.dialect}"
    assert spark.sql(f"SELECT COUNT(DISTINCT id) FROM {table}").first()[0] == 400
    db.close()


def test_stream_to_stream_copy_is_exactly_once(
    spark: Any, db: homing.Database, tmp_path: Path
) -> None:
    """readStream -> writeStream: one publication per micro-batch, a restart adds nothing."""
    db.insert_many([("ev", {"n": i}) for i in range(30)])

    def run() -> None:
        q = (
            spark.readStream.format("homing")
            .option("url", db.url)
            .option("queue", "ev")
            .option("maxRowsPerBatch", "12")
            .load()
            .selectExpr("id AS src", "'copy' AS type", "args")
            .writeStream.format("homing")
            .option("url", db.url)
            .option("sinkId", "copier")
            .option("keyColumns", "src")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    run()
    assert _visible_count(db, "copy") == (30, 0)
    (tmp_path / "ckpt" / "commits" / "2").unlink()  # batch 2 is replayed after a "crash"
    (tmp_path / "ckpt" / "commits" / ".2.crc").unlink(missing_ok=True)
    run()
    assert _visible_count(db, "copy") == (30, 0)
    with db.store.transaction() as tx:
        rows = tx.query("SELECT sink, label FROM homing_spark_commits ORDER BY commit_no")
    assert len(rows) == 3 and {r[0] for r in rows} == {"copier"}


def test_the_replace_example_runs(spark: Any) -> None:
    """examples/pipeline_replace.py, on the session's Spark: 1 event -> 1,000 children."""
    import runpy

    example = runpy.run_path(str(HERE.parent / "examples" / "pipeline_replace.py"))
    assert example["fan_out"](spark) == {"FiredEvent": (0, 1), "ProcessSubscription": (1000, 0)}


def _open_older_transaction(db: homing.Database) -> Any:
    """A transaction that holds an xid from before the inserts (PostgreSQL's horizon)."""
    import psycopg

    conn = psycopg.connect(db.url.split("?")[0], autocommit=False)
    conn.execute("SELECT pg_current_xact_id()")
    return conn


def _prepare_available_now(db: homing.Database, **options: str) -> Any:
    """The stream reader's availableNow preparation, run in a thread (as Spark's driver)."""
    from homing.spark._read import QueueStreamReader

    reader = QueueStreamReader({"url": db.url, "queue": "ev", **options})
    thread = threading.Thread(target=reader.prepareForTriggerAvailableNow, daemon=True)
    thread.start()
    return reader, thread


@pytest.fixture
def pg_db(tmp_path: Path) -> Any:
    """PostgreSQL only: SQLite has one writer and no visibility horizon to wait for."""
    from tests.conftest import StoreFactory

    factory = StoreFactory("postgres", tmp_path)
    database = homing.connect(factory.url())
    yield database
    database.close()
    factory.cleanup()


def test_available_now_waits_for_an_older_open_transaction(pg_db: Any) -> None:
    """A transaction open before the inserts must not make availableNow skip them: the
    preparation waits until it ends, then takes every row committed before it started."""
    db = pg_db
    older = _open_older_transaction(db)
    try:
        db.insert_many([("ev", {"n": i}) for i in range(30)])
        reader, thread = _prepare_available_now(db)
        thread.join(1.0)
        assert thread.is_alive()  # held back by the older transaction, not finished short
        older.commit()
        thread.join(90)  # other clients' open transactions hold the horizon too (<= 60 s)
        assert not thread.is_alive()
    finally:
        older.close()
    assert reader.target is not None
    with db.store.transaction(write=False) as tx:
        n, _, _ = sq.plain_seq_range(tx, "ev", (0, 0), (reader.target["xid"], reader.target["seq"]))
    assert n == 30


def test_available_now_wait_is_bounded(pg_db: Any) -> None:
    """With the older transaction still open past the bound, the preparation stops at the
    settled position (nothing of the 30) instead of waiting forever."""
    db = pg_db
    older = _open_older_transaction(db)
    try:
        db.insert_many([("ev", {"n": i}) for i in range(30)])
        reader, thread = _prepare_available_now(db, availableNowWaitSeconds="0.5")
        thread.join(30)
        assert not thread.is_alive()
        assert reader.target is not None and (reader.target["xid"], reader.target["seq"]) == (0, 0)
    finally:
        older.commit()
        older.close()


def test_derived_ids_are_uuid5_of_the_json_of_the_values() -> None:
    """Ids derived by an earlier homing must be the ids derived now (a retry can span an
    upgrade): derive_id is exactly uuid5 over the compact JSON of its values."""
    import datetime
    import uuid

    from homing.spark._common import NAMESPACE

    values: list[Any] = [0, -7, 2**70, 1.5, float("inf"), True, None, "", 'é"\\\n', "x" * 300]
    values += [datetime.date(2026, 11, 25), [1, "a"], {"k": [None]}]
    for i, a in enumerate(values):
        for b in values[i:]:
            parts = ("child", a, b)
            text = json.dumps(list(parts), default=str, separators=(",", ":"))
            assert derive_id(*parts) == str(uuid.uuid5(NAMESPACE, text))


def test_a_staged_chunk_with_an_id_twice_stages_it_once(db: homing.Database) -> None:
    now = db.store.clock.now()
    rows = [
        sq.StagedJob(f"id-{i % 3}", "child", json.dumps({"i": i}), 0, now, None) for i in range(5)
    ]
    unique = [sq.StagedJob(f"u-{i}", "child", "{}", 0, now, None) for i in range(4)]
    with db.store.transaction() as tx:
        sq.open_batch(tx, "b-dup", now=now, info="test")
        sq.stage_jobs(tx, "b-dup", rows, now=now)  # deduplicated by id
        sq.stage_jobs(tx, "b-dup", unique, now=now)  # no duplicate: no sort
        sq.publish(tx, "b-dup", sink="test", label="dup", now=now)
    assert _visible_count(db, "child") == (7, 0)
