"""Engine queues (seed 001) as a Spark source: take per micro-batch, ack on Spark's commit,
at-least-once with the message id as the idempotency key (the homing sink dedups by it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import homing
from homing.engine import Engine
from homing.pipeline import engine_source

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import spark_fixtures  # noqa: E402

spark = spark_fixtures.spark  # the session-scoped SparkSession fixture

LEASE = 600.0  # no lease runs out during the test: acks come from Spark's commits


def _run(spark: Any, url: str, checkpoint: Path, max_rows: int) -> None:
    query = (
        spark.readStream.format(engine_source.FORMAT)
        .option("url", url)
        .option("queue", "orders")
        .option("consumer", "spark")
        .option("maxRowsPerBatch", str(max_rows))
        .option("leaseFor", str(LEASE))
        .load()
        .selectExpr("id", "'Order' AS type", "body", "attempts")
        .writeStream.format("homing")
        .option("url", url)
        .option("sinkId", "orders")
        .option("idColumn", "id")  # one job per message, however often it is read
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None


def test_engine_queue_feeds_spark_at_least_once(spark: Any, store_url: str, tmp_path: Path) -> None:
    engine_source.register(spark)
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    engine = Engine(db)
    engine.create_queue("orders")
    for i in range(25):
        engine.publish("orders", {"n": i})

    # batch read: a snapshot, nothing taken
    snap = spark.read.format(engine_source.FORMAT).option("url", store_url)
    assert snap.option("queue", "orders").load().count() == 25

    _run(spark, store_url, tmp_path / "ckpt", max_rows=10)  # batches of 10, 10, 5
    jobs = {j.args["body"] for j in db.grab_many("Order", lock_for=60, limit=100)}
    assert len(jobs) == 25
    # batches 1 and 2 were acked when Spark planned the next; AvailableNow never
    # acknowledges its last batch: those 5 stay leased to the consumer
    assert len(engine.messages("orders", state="done")) == 20
    assert len(engine.messages("orders", state="outstanding")) == 5

    # the consumer goes away: its 5 unacked messages go back to the queue (as when their
    # leases run out); a new query (new checkpoint) binds it again and reads them again
    engine.unbind("orders", "spark")
    engine.publish("orders", {"n": 25})
    _run(spark, store_url, tmp_path / "ckpt2", max_rows=4)  # 6 messages: batches of 4, 2
    assert len(engine.messages("orders", state="done")) == 24
    again = [m for m in engine.messages("orders") if m.attempts > 1]
    assert len(again) == 5  # read twice: at-least-once ...
    with db.store.transaction(write=False) as tx:
        rows = tx.query("SELECT COUNT(*) FROM homing_jobs WHERE type = 'Order'")
    assert int(rows[0][0]) == 26  # ... and one job per message: the sink dropped repeats
    assert engine.check() == []
    db.close()
