"""Engine queues (seed 001) as a Spark source: ``format("homing_engine")``.

``spark.readStream.format("homing_engine").option("url", URL).option("queue", "orders")``
reads a queue of ``homing.engine`` as a consumer does: on the driver, each micro-batch is
one ``take`` (a lease) of at most ``maxRowsPerBatch`` messages for the consumer selector
``consumer`` (bound on the queue with ``credits`` if it is missing), and Spark's
``commit(end)`` acks (pays for) every message of the batches up to ``end``.

**At-least-once**, with the message ``id`` as the idempotency key: a message is acked only
after Spark committed the batch that read it. A message whose batch was not committed (a
driver crash, a query stopped before the next batch, and always the last batch of a
``Trigger.AvailableNow`` run, which Spark never acknowledges) stays leased until
``leaseFor`` runs out, then goes back to its queue and is read again (``attempts`` grows).
A batch that Spark replays after a restart comes back empty (its leases were this driver
process's) and its messages return by lease expiry. So deduplicate by ``id`` downstream:
the homing sink with ``.option("idColumn", "id")`` makes each message exactly one job.

``spark.read.format("homing_engine")`` (batch) lists a queue's entries without consuming
them (``state``: ready, outstanding or done; default all).

This lives in the pipeline part (which may use both the engine and Spark): ``homing.spark``
and ``homing.engine`` are faces that do not import each other.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from homing.database import Database, connect
from homing.engine.model import MessageNotFound
from homing.errors import ConfigurationError, StaleLease
from homing.spark._common import int_option, option, required, store_url

FORMAT = "homing_engine"
SCHEMA = (
    "seq long, id string, queue string, headers string, body string, body_base64 string, "
    "address string, return_address string, attempts int, created_at double"
)

_engines: dict[str, Any] = {}


def _engine(url: str) -> Any:
    """One Engine per driver process and URL (the stream reader's process is long-lived)."""
    from homing.engine import Engine

    if url not in _engines:
        db = connect(url)
        if not isinstance(db, Database):
            db.close()
            raise ConfigurationError("engine queues live on one store, not a sharded one")
        _engines[url] = Engine(db)
    return _engines[url]


def _row(message: Any) -> tuple[Any, ...]:
    body = message.body
    if isinstance(body, bytes):
        text, b64 = None, base64.b64encode(body).decode()
    else:
        text, b64 = json.dumps(body), None
    return (
        int(message.seq),
        str(message.id),
        str(message.queue),
        json.dumps(message.headers),
        text,
        b64,
        message.address,
        message.return_address,
        int(message.attempts),
        float(message.created_at),
    )


@dataclass
class RowsPartition(InputPartition):
    """The rows themselves: taken on the driver, so executors need no store access."""

    rows: list[tuple[Any, ...]]


class EngineQueueSource(DataSource):
    """``format("homing_engine")``; see the module docstring."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.options = dict(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return EngineQueueReader(self.options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EngineQueueStreamReader(self.options)


class EngineQueueReader(DataSourceReader):
    """A snapshot of a queue's entries (nothing is taken or acked)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = store_url(options)
        self.queue = required(options, "queue", "the engine queue to read")
        self.state = option(options, "state")

    def partitions(self) -> Sequence[InputPartition]:
        engine = _engine(self.url)
        rows: list[tuple[Any, ...]] = []
        after = 0
        while True:
            page = engine.messages(self.queue, state=self.state, limit=1000, after_seq=after)
            rows += [_row(m) for m in page]
            if len(page) < 1000:
                return [RowsPartition(rows)]
            after = int(page[-1].seq)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RowsPartition)
        yield from partition.rows


class EngineQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A queue's messages for one consumer: take per batch on the driver, ack on commit."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = store_url(options)
        self.queue = required(options, "queue", "the engine queue to read")
        self.consumer = option(options, "consumer") or f"spark-{self.queue}"
        self.max_rows = int_option(options, "maxRowsPerBatch", 1000)
        self.credits = int_option(options, "credits", max(self.max_rows, 1000))
        self.lease_for = float(option(options, "leaseFor", "600") or 600)
        if self.lease_for <= 0:
            raise ConfigurationError("option leaseFor must be a positive number of seconds")
        # batch number -> (seq, lease token) of the messages it read; driver memory only
        self.taken: dict[int, list[tuple[int, str]]] = {}
        self.rows: dict[int, list[tuple[Any, ...]]] = {}

    def initialOffset(self) -> dict[str, int]:
        engine = _engine(self.url)
        if not any(s.name == self.consumer for s in engine.selectors(self.queue)):
            engine.bind(self.queue, self.consumer, consumer=self.consumer, credits=self.credits)
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        got = _engine(self.url).take(self.consumer, limit=max(1, rows), lease_for=self.lease_for)
        if not got:
            return {"batch": int(start["batch"])}
        batch = int(start["batch"]) + 1
        self.taken[batch] = [(d.seq, d.lease_token) for d in got]
        self.rows[batch] = [_row(d.message) for d in got]
        return {"batch": batch}

    def prepareForTriggerAvailableNow(self) -> None:
        """Nothing to fix: the run ends at the first trigger that takes no message."""

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        rows: list[tuple[Any, ...]] = []
        for batch in range(int(start["batch"]) + 1, int(end["batch"]) + 1):
            # unknown after a restart: those messages return when their leases run out
            rows += self.rows.get(batch, [])
        return [RowsPartition(rows)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RowsPartition)
        yield from partition.rows

    def commit(self, end: dict[str, int]) -> None:
        """Ack every message of the batches up to ``end``; a lease that ran out meanwhile
        is skipped (the message was or will be read again: at-least-once)."""
        engine = _engine(self.url)
        done = [b for b in self.taken if b <= int(end["batch"])]
        for batch in sorted(done):
            with engine.db.transaction():
                for seq, token in self.taken[batch]:
                    try:
                        engine.ack(seq, lease_token=token)
                    except (StaleLease, MessageNotFound):
                        pass
            del self.taken[batch]
            self.rows.pop(batch, None)

    def stop(self) -> None:
        pass


def register(spark: Any) -> None:
    """Register ``format("homing_engine")`` with a SparkSession (PySpark >= 4.2)."""
    spark.dataSource.register(EngineQueueSource)
