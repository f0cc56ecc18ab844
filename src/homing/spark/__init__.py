"""PySpark (>= 4.2) Python data sources over a homing store: ``format("homing")``.

- ``spark.read.format("homing").option("url", URL).option("queue", TYPE).load()``: the
  visible jobs of a queue (``leaseToken`` instead: the jobs one grab holds).
- ``spark.readStream.format("homing")``: a queue in commit order, ``consumer`` cursor,
  ``maxRowsPerBatch``, ``Trigger.AvailableNow``; Arrow batches.
- ``df.write.format("homing").mode("append")`` / ``df.writeStream.format("homing")``: rows
  become jobs with deterministic ids, written invisibly by the tasks and made visible by one
  idempotent driver commit; with ``leaseToken`` + ``parents`` the write replaces the
  leased parent jobs by the rows, exactly once.

Call ``register(spark)`` once per session. See docs/spark.md.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from homing.errors import ConfigurationError
from homing.spark._common import (
    FORMAT,
    check_master,
    derive_id,
    lease_options,
    migrate_once,
    shard_urls,
    store_url,
)

__all__ = [
    "FORMAT",
    "HomingDataSource",
    "derive_id",
    "lease_options",
    "register",
    "replace_jobs",
    "replace_with",
]


class HomingDataSource(DataSource):
    """The ``homing`` format; see the module docstring for options."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.options = dict(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        from homing.spark._read import TABLE_SCHEMA

        return TABLE_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        from homing.spark._read import TableReader

        migrate_once(store_url(self.options))
        return TableReader(self.options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from homing.spark._read import QueueStreamReader
        from homing.spark._sharded import ShardedQueueStreamReader

        if len(shard_urls(store_url(self.options))) > 1:
            return ShardedQueueStreamReader(self.options)
        return QueueStreamReader(self.options)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from homing.spark._write import JobsWriter

        if overwrite:
            raise ConfigurationError(
                'the homing sink only appends jobs; use .mode("append") (overwrite would delete jobs)'
            )
        migrate_once(store_url(self.options))
        return JobsWriter(self.options, list(schema.fieldNames()))

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        from homing.spark._write import JobsStreamWriter

        migrate_once(store_url(self.options))
        return JobsStreamWriter(self.options, list(schema.fieldNames()))


def register(spark: Any) -> None:
    """Register the ``homing`` format with a SparkSession (PySpark >= 4.2)."""
    import pyspark

    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        raise ConfigurationError(
            f"homing.spark needs PySpark >= 4.2 (admission control, Trigger.AvailableNow); "
            f"this is {pyspark.__version__}: pip install 'pyspark>=4.2'"
        )
    spark.dataSource.register(HomingDataSource)


def replace_jobs(df: Any, url: str, jobs: Any, *, sink: str = "replace", **options: str) -> None:
    """Replace the ``jobs`` one ``grab_many`` leased (on one store or a sharded one) by the
    rows of ``df``; each child goes to its parent's shard (its ``parent_id`` handle)."""
    lease = lease_options(jobs)
    check_session(df.sparkSession, url)
    writer = df.write.format(FORMAT).mode("append").option("url", url).option("sinkId", sink)
    for k, v in {**lease, **options}.items():
        writer = writer.option(k, v)
    writer.save()


def check_session(spark: Any, url: str) -> None:
    """Refuse a SQLite store with a non-local master before any work starts."""
    check_master(url, spark.sparkContext.master)


def replace_with(
    df: Any, url: str, *, lease_token: str, parents: int, sink: str = "replace", **options: str
) -> None:
    """Replace the ``parents`` jobs leased under ``lease_token`` by the rows of ``df``."""
    check_session(df.sparkSession, url)
    writer = (
        df.write.format(FORMAT)
        .mode("append")
        .option("url", url)
        .option("leaseToken", lease_token)
        .option("parents", str(parents))
        .option("sinkId", sink)
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()
