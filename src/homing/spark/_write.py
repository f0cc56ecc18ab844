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
    parse_leases,
    shard_of,
    shard_urls,
    store_for,
    store_url,
    task_master,
    task_property,
)
from homing.store import spark_queries as sq

# One encoder for the args of every row (``json.dumps`` with options builds one per call).
_ROW_ARGS = json.JSONEncoder(default=str, separators=(",", ":"))

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
            args = [_ROW_ARGS.encode({c: cols[c][i] for c in others}) for i in range(n)]
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


def _route(jobs: list[sq.StagedJob], shards: int) -> dict[int, list[sq.StagedJob]]:
    """Each row to its shard: a child to its parent's (from the parent's handle), a row with a
    handle as id to that shard, any other row by the hash of its id. Ids are stored bare."""
    out: dict[int, list[sq.StagedJob]] = {}
    for job in jobs:
        if job.parent_id:
            shard, parent = shard_of(job.parent_id, shards)
            _, job_id = shard_of(job.id, shards)
            job = job._replace(id=job_id, parent_id=parent)
        else:
            shard, job_id = shard_of(job.id, shards)
            job = job._replace(id=job_id)
        out.setdefault(shard, []).append(job)
    return out


def stage(url: str, staged_batch: str, label: str, spec: RowSpec, batches: Iterator[Any]) -> int:
    """Task side: write every row into ``staged_batch`` (on each shard, the rows routed
    there); skip a shard's rows if that shard published the batch already."""
    check_master(url, task_master())
    urls = shard_urls(url)
    stores = [store_for(u) for u in urls]
    published: list[bool] = []
    for store in stores:
        with store.transaction() as tx:
            done = sq.publication(tx, staged_batch) is not None
            if not done:
                sq.open_batch(tx, staged_batch, now=store.clock.now(), info=f"spark {label}")
        published.append(done)
    if all(published):
        for _ in batches:
            pass  # a replay of a batch that is already visible everywhere: nothing to write
        return 0
    rows = 0
    pending: dict[int, list[sq.StagedJob]] = {}

    def flush(shard: int, chunk: list[sq.StagedJob]) -> None:
        store = stores[shard]
        with store.transaction() as tx:
            sq.stage_jobs(tx, staged_batch, chunk, now=store.clock.now())

    for batch in batches:
        jobs = spec.jobs(batch, stores[0].clock.now())
        routed = _route(jobs, len(urls)) if len(urls) > 1 else {0: jobs}
        for shard, group in routed.items():
            if published[shard]:
                continue
            queue = pending.setdefault(shard, [])
            queue += group
            while len(queue) >= CHUNK:
                chunk, queue[:] = queue[:CHUNK], queue[CHUNK:]
                flush(shard, chunk)
                rows += len(chunk)
                failpoint("spark.write.after_chunk")
    for shard, queue in pending.items():
        if queue:
            flush(shard, queue)
            rows += len(queue)
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
        self.leases: dict[int, tuple[str, int]] = {}
        raw = option(options, "leases")
        if raw:
            self.leases = parse_leases(raw, len(shard_urls(self.url)))
        elif self.lease_token:
            if len(shard_urls(self.url)) > 1:
                raise ConfigurationError(
                    'a sharded store has a lease token per shard: use .option("leases", ...) '
                    "(homing.spark.lease_options(jobs) builds it)"
                )
            parents = int_option(options, "parents", 0, minimum=1)
            if not parents:
                raise ConfigurationError(
                    'a replace needs .option("parents", N): how many jobs the lease token holds, '
                    "so that a lost parent is detected"
                )
            self.leases = {0: (self.lease_token, parents)}
        if self.leases:
            tokens = sorted(t for t, _ in self.leases.values())
            self.label = tokens[0] if len(tokens) == 1 else derive_id("leases", *tokens)
            self.staged_batch = derive_id("replace", *tokens)
        else:
            self.label = option(options, "batchLabel") or str(uuid.uuid4())
            self.staged_batch = derive_id("batch", self.sink, self.label)

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        rows = stage(self.url, self.staged_batch, self.label, self.spec, iterator)
        return StagedMessage(self.staged_batch, self.label, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """One transaction per shard: complete that shard's parents (exactly the number
        leased there, else ``StaleLease`` and that shard commits nothing) and publish its
        part of the batch. Children live on their parent's shard, so each parent and its
        children change together; a shard that published already is skipped (idempotent)."""
        failpoint("spark.commit.before")
        urls = shard_urls(self.url)
        self._check_leases(urls)
        for shard, url in enumerate(urls):
            store = store_for(url)
            with store.transaction() as tx:
                if sq.publication(tx, self.staged_batch) is not None:
                    continue  # published by an earlier call: a doubled commit changes nothing
                now = store.clock.now()
                token, parents = self.leases.get(shard, ("", 0))
                if token:
                    done = sq.complete_leased(tx, token, now=now)
                    if done != parents:
                        raise StaleLease(self._stale(shard, token, parents, done))
                sq.publish(
                    tx,
                    self.staged_batch,
                    sink=self.sink,
                    label=self.label,
                    now=now,
                    parents=parents,
                )
            if shard < len(urls) - 1:
                failpoint("spark.commit.between_shards")
        failpoint("spark.commit.after")

    def _check_leases(self, urls: list[str]) -> None:
        """Refuse before any shard commits if a parent is already lost anywhere."""
        if len(urls) == 1:
            return  # the commit's own count check is atomic on one store
        for shard, (token, parents) in self.leases.items():
            with store_for(urls[shard]).transaction(write=False) as tx:
                if sq.publication(tx, self.staged_batch) is not None:
                    continue
                held = sq.leased_bounds(tx, token)[0]
            if held != parents:
                raise StaleLease(self._stale(shard, token, parents, held))

    def _stale(self, shard: int, token: str, parents: int, held: int) -> str:
        where = f" on shard {shard}" if len(shard_urls(self.url)) > 1 else ""
        return (
            f"replace refused: {parents} parent jobs were leased under token {token}{where} "
            f"but only {held} still are (a lease expired and another worker took them, or "
            "they were finished). Nothing was committed there; grab the parents again and "
            "rerun: staged children are adopted"
        )

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
        seen: dict[str, str] = {}
        for m in messages:
            if isinstance(m, StagedMessage):
                seen[m.staged_batch] = m.label
        for staged, label in seen.items():
            for url in shard_urls(self.url):  # one idempotent publication per shard
                store = store_for(url)
                with store.transaction() as tx:
                    sq.publish(tx, staged, sink=self.sink, label=label, now=store.clock.now())
        failpoint("spark.commit.after")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Leave staged rows in place: Spark re-runs the batch and they are reused."""
