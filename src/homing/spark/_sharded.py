"""A queue stream over a sharded store: one commit-ordered stream per shard, side by side.

Offsets hold each shard's position under its own keys (``"0:xid"``, ``"0:seq"``, ...,
``"1:xid"``, ...): every shard keeps its own commit order and its own durable consumer
cursor (``commit(end)`` advances each shard's cursor in that shard). Rows name their jobs by
handle (``"<shard>:<id>"``), like ``ShardedDatabase``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from homing.spark._common import shard_urls, store_url
from homing.spark._read import ZERO, QueueStreamReader


@dataclass
class ShardPartition(InputPartition):
    shard: int
    inner: InputPartition


def _split(offset: Mapping[str, Any], shard: int) -> dict[str, int]:
    return {k: int(offset.get(f"{shard}:{k}", 0)) for k in ZERO}


def _join(parts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    return {f"{i}:{k}": int(v) for i, p in enumerate(parts) for k, v in p.items()}


def _prefix(batch: Any, shard: int) -> Any:
    import pyarrow as pa

    cols = list(batch.columns)
    names = batch.schema.names
    for name in ("id", "parent_id"):
        i = names.index(name)
        cols[i] = pa.array(
            [None if v is None else f"{shard}:{v}" for v in cols[i].to_pylist()], pa.string()
        )
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


class ShardedQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("homing")`` on ``url = "pg1,pg2,..."``: each shard's queue
    in its commit order; ``maxRowsPerBatch`` is shared out evenly between the shards."""

    def __init__(self, options: Mapping[str, str]) -> None:
        urls = shard_urls(store_url(options))
        self.readers = [QueueStreamReader({**options, "url": u}) for u in urls]

    def initialOffset(self) -> dict[str, int]:
        return _join([r.initialOffset() for r in self.readers])

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.readers[0].getDefaultReadLimit()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        share: ReadLimit = ReadAllAvailable()
        if isinstance(limit, ReadMaxRows):
            share = ReadMaxRows(max(1, limit.max_rows // len(self.readers)))
        return _join([r.latestOffset(_split(start, i), share) for i, r in enumerate(self.readers)])

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None

    def prepareForTriggerAvailableNow(self) -> None:
        for r in self.readers:
            r.prepareForTriggerAvailableNow()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        for i, r in enumerate(self.readers):
            parts += [ShardPartition(i, p) for p in r.partitions(_split(start, i), _split(end, i))]
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ShardPartition)
        for batch in self.readers[partition.shard].read(partition.inner):
            yield _prefix(batch, partition.shard)

    def commit(self, end: dict[str, int]) -> None:
        """Advance each shard's durable cursor (forward only, idempotent, in that shard)."""
        for i, r in enumerate(self.readers):
            r.commit(_split(end, i))

    def stop(self) -> None:
        pass
