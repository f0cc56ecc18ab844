"""Writers: rows become jobs with deterministic ids, staged invisibly by the tasks and made
visible by one idempotent driver commit per (sink id, batch id); and the replace writer."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from homing._failpoints import failpoint
from homing.errors import ConfigurationError, StaleLease
from homing.spark._common import (
    check_master,
    derive_id,
    int_option,
    option,
    store_for,
    store_url,
    task_master,
    task_property,
)
from homing.store import spark_queries as sq

RESERVED = ("id", "type", "args", "priority", "run_at", "parent_id")
CHUNK = 10_000


@dataclass
class StagedMessage(WriterCommitMessage):
    """What a task tells the driver: the staged batch it wrote into and how many rows."""

    staged_batch: str
    label: str
    rows: int


@dataclass(frozen=True)
class RowSpec:
    """How DataFrame columns map onto jobs."""

    type: str | None
    id_column: str | None
    key_columns: tuple[str, ...]
    args_column: str | None

    @staticmethod
    def from_options(options: Mapping[str, str], columns: list[str]) -> RowSpec:
        job_type = option(options, "type")
        if job_type is None and "type" not in columns:
            raise ConfigurationError(
                'the homing sink needs the job type: a "type" column or .option("type", NAME)'
            )
        id_column = option(options, "idColumn")
        keys_raw = option(options, "keyColumns")
        keys = tuple(k.strip() for k in keys_raw.split(",") if k.strip()) if keys_raw else ()
        if id_column is None and not keys and "id" in columns:
            id_column = "id"
        if id_column is None and not keys:
            raise ConfigurationError(
                "the homing sink needs deterministic row ids so that retries create nothing "
                'twice: give an "id" column, .option("idColumn", NAME) or '
                '.option("keyColumns", "col1,col2") (the id is then a uuid5 of those values)'
            )
        for c in (id_column, *keys):
            if c is not None and c not in columns:
                raise ConfigurationError(
                    f"the homing sink's id/key column {c!r} is not in {columns}"
                )
        args_column = option(options, "argsColumn") or ("args" if "args" in columns else None)
        return RowSpec(job_type, id_column, keys, args_column)

    def jobs(self, batch: Any, now: float) -> list[sq.StagedJob]:
        names = list(batch.schema.names)
        cols = {n: batch.column(i).to_pylist() for i, n in enumerate(names)}
        n = batch.num_rows
        types = cols.get("type") or [self.type] * n
        if self.args_column is not None:
            args = [a if isinstance(a, str) else json.dumps(a) for a in cols[self.args_column]]
        else:
            others = [c for c in names if c not in RESERVED]
            args = [
                json.dumps({c: cols[c][i] for c in others}, default=str, separators=(",", ":"))
                for i in range(n)
            ]
        if self.id_column is not None:
            ids = [str(v) for v in cols[self.id_column]]
        else:
            keys = [cols[k] for k in self.key_columns]
            ids = [derive_id(types[i], *(k[i] for k in keys)) for i in range(n)]
        priority = cols.get("priority") or [0] * n
        run_at = cols.get("run_at") or [now] * n
        parents = cols.get("parent_id") or [None] * n
        out = []
        for i in range(n):
            if ids[i] in (None, "None") or types[i] is None:
                raise ConfigurationError(f"row {i} has no id or no type; both are required")
            out.append(
                sq.StagedJob(
                    ids[i],
                    types[i],
                    args[i],
                    int(priority[i] or 0),
                    float(run_at[i] if run_at[i] is not None else now),
                    parents[i],
                )
            )
        return out


def stage(url: str, staged_batch: str, label: str, spec: RowSpec, batches: Iterator[Any]) -> int:
    """Task side: write every row into ``staged_batch``; skip it all if already published."""
    check_master(url, task_master())
    store = store_for(url)
    with store.transaction() as tx:
        published = sq.publication(tx, staged_batch) is not None
        if not published:
            sq.open_batch(tx, staged_batch, now=store.clock.now(), info=f"spark {label}")
    rows = 0
    pending: list[sq.StagedJob] = []
    for batch in batches:
        if published:
            continue  # a replay of a batch that is already visible: nothing to write
        pending += spec.jobs(batch, store.clock.now())
        while len(pending) >= CHUNK:
            chunk, pending = pending[:CHUNK], pending[CHUNK:]
            with store.transaction() as tx:
                sq.stage_jobs(tx, staged_batch, chunk, now=store.clock.now())
            rows += len(chunk)
            failpoint("spark.write.after_chunk")
    if pending:
        with store.transaction() as tx:
            sq.stage_jobs(tx, staged_batch, pending, now=store.clock.now())
        rows += len(pending)
    failpoint("spark.write.task_done")
    return rows


class JobsWriter(DataSourceArrowWriter):
    """``df.write.format("homing")``: insert jobs, or replace leased parents by them.

    With ``leaseToken`` (and ``parents``, the number of jobs held under it) the commit is a
    replace: in one transaction it completes every parent still held under the token, makes
    the children visible, and refuses (``StaleLease``) if any parent was lost.
    """

    def __init__(self, options: Mapping[str, str], columns: list[str]) -> None:
        self.url = store_url(options)
        self.spec = RowSpec.from_options(options, columns)
        self.sink = option(options, "sinkId", "batch") or "batch"
        self.lease_token = option(options, "leaseToken")
        if self.lease_token:
            self.parents = int_option(options, "parents", 0, minimum=1)
            if not self.parents:
                raise ConfigurationError(
                    'a replace needs .option("parents", N): how many jobs the lease token holds, '
                    "so that a lost parent is detected"
                )
            self.label = self.lease_token
            self.staged_batch = derive_id("replace", self.lease_token)
        else:
            self.parents = 0
            self.label = option(options, "batchLabel") or str(uuid.uuid4())
            self.staged_batch = derive_id("batch", self.sink, self.label)

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        rows = stage(self.url, self.staged_batch, self.label, self.spec, iterator)
        return StagedMessage(self.staged_batch, self.label, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        failpoint("spark.commit.before")
        store = store_for(self.url)
        with store.transaction() as tx:
            if sq.publication(tx, self.staged_batch) is not None:
                return  # published by an earlier call: a doubled commit changes nothing
            now = store.clock.now()
            if self.lease_token:
                done = sq.complete_leased(tx, self.lease_token, now=now)
                if done != self.parents:
                    raise StaleLease(
                        f"replace refused: {self.parents} parent jobs were leased under token "
                        f"{self.lease_token} but only {done} still are (a lease expired and "
                        "another worker took them, or they were finished). Nothing was "
                        "committed; grab the parents again and rerun: staged children are adopted"
                    )
            sq.publish(
                tx,
                self.staged_batch,
                sink=self.sink,
                label=self.label,
                now=now,
                parents=self.parents,
            )
        failpoint("spark.commit.after")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Leave staged rows in place: invisible, and adopted by the next run."""


class JobsStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("homing")``: one publication per (sink id, query, batch id)."""

    def __init__(self, options: Mapping[str, str], columns: list[str]) -> None:
        self.url = store_url(options)
        self.spec = RowSpec.from_options(options, columns)
        sink = option(options, "sinkId")
        if not sink:
            raise ConfigurationError(
                'a homing streaming sink needs .option("sinkId", NAME): with the query id and '
                "batch id it names each micro-batch's publication"
            )
        self.sink = sink

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        query = task_property("sql.streaming.queryId") or "-"
        batch = task_property("streaming.sql.batchId") or "-"
        label = f"{query}:{batch}"
        staged = derive_id("stream", self.sink, query, batch)
        rows = stage(self.url, staged, label, self.spec, iterator)
        return StagedMessage(staged, label, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        failpoint("spark.commit.before")
        store = store_for(self.url)
        seen: dict[str, str] = {}
        for m in messages:
            if isinstance(m, StagedMessage):
                seen[m.staged_batch] = m.label
        for staged, label in seen.items():
            with store.transaction() as tx:
                sq.publish(tx, staged, sink=self.sink, label=label, now=store.clock.now())
        failpoint("spark.commit.after")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Leave staged rows in place: Spark re-runs the batch and they are reused."""
