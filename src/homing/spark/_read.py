"""Readers: a batch DataFrame of a queue and a stream with commit-ordered offsets."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from homing.errors import ConfigurationError
from homing.spark._common import (
    check_master,
    int_option,
    option,
    parse_leases,
    required,
    shard_urls,
    store_for,
    store_url,
    task_master,
)
from homing.store import spark_queries as sq

log = logging.getLogger(__name__)

TABLE_SCHEMA = (
    "id string, seq long, type string, args string, priority int, run_at double, "
    "created_at double, parent_id string, state string, attempts int, finished_at double, "
    "last_error string"
)
ARROW_ROWS = 8192
ZERO = {"xid": 0, "seq": 0, "bno": 0, "bseq": 0}


def _arrow_batches(
    columns: Sequence[str], rows: Sequence[tuple[Any, ...]], types: Sequence[Any]
) -> Iterator[Any]:
    import pyarrow as pa

    schema = pa.schema([pa.field(c, t) for c, t in zip(columns, types, strict=True)])
    for start in range(0, len(rows), ARROW_ROWS):
        chunk = rows[start : start + ARROW_ROWS]
        cols = list(zip(*chunk, strict=True))
        yield pa.RecordBatch.from_arrays(
            [pa.array(col, type=t) for col, t in zip(cols, types, strict=True)], schema=schema
        )


def _csv_batches(
    data: bytes, columns: Sequence[str], types: Sequence[Any], shard: int | None
) -> Iterator[Any]:
    """Arrow batches parsed from the store's CSV (``sq.read_table_csv``) by pyarrow's C++
    reader; ``shard``: prefix ids and parent ids with ``"<shard>:"`` (``prefix_handles``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    if not data:
        return
    table = pacsv.read_csv(
        pa.py_buffer(data),
        read_options=pacsv.ReadOptions(column_names=list(columns), block_size=1 << 22),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=dict(zip(columns, types, strict=True)),
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    if shard is not None:
        for name in ("id", "parent_id"):
            i = table.schema.get_field_index(name)
            table = table.set_column(
                i, name, pc.binary_join_element_wise(f"{shard}:", table.column(i), "")
            )
    yield from table.to_batches(max_chunksize=ARROW_ROWS)


def _types(columns: Sequence[str]) -> list[Any]:
    import pyarrow as pa

    kinds = {
        "id": pa.string(),
        "seq": pa.int64(),
        "type": pa.string(),
        "args": pa.string(),
        "priority": pa.int32(),
        "run_at": pa.float64(),
        "created_at": pa.float64(),
        "parent_id": pa.string(),
        "state": pa.string(),
        "attempts": pa.int32(),
        "finished_at": pa.float64(),
        "last_error": pa.string(),
    }
    return [kinds[c] for c in columns]


def _normalise(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    # SQLite may hand back ints for REAL columns; Arrow wants floats there.
    out = []
    for r in rows:
        out.append(
            (
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                float(r[5]),
                float(r[6]),
                *r[7:],
            )
        )
    return out


def _fix_table(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    out = []
    for r in _normalise(rows):
        finished = r[10]
        out.append((*r[:10], float(finished) if finished is not None else None, r[11]))
    return out


# -- batch -------------------------------------------------------------------------------
@dataclass
class TablePartition(InputPartition):
    seq_lo: int
    seq_hi: int
    shard: int = 0
    lease_token: str | None = None


def prefix_handles(rows: list[tuple[Any, ...]], shard: int) -> list[tuple[Any, ...]]:
    """Sharded reads name jobs by handle ``"<shard>:<id>"`` (id and parent_id columns), as
    ``ShardedDatabase`` does, so a child's parent_id tells the sink the parent's shard."""
    out = []
    for r in rows:
        parent = r[7]
        out.append((f"{shard}:{r[0]}", *r[1:7], f"{shard}:{parent}" if parent else None, *r[8:]))
    return out


class TableReader(DataSourceReader):
    """``spark.read.format("homing")``: visible jobs of a queue (or of one grab's leases).

    On a sharded store: partitions per shard (split by ``seq`` within it), ids as handles."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = store_url(options)
        self.urls = shard_urls(self.url)
        self.queue = option(options, "queue")
        self.leases: dict[int, tuple[str, int]] | None = None
        token = option(options, "leaseToken")
        raw = option(options, "leases")
        if raw:
            self.leases = parse_leases(raw, len(self.urls))
        elif token:
            if len(self.urls) > 1:
                raise ConfigurationError(
                    'a sharded store has a lease token per shard: use .option("leases", ...) '
                    "(homing.spark.lease_options(jobs) builds it)"
                )
            self.leases = {0: (token, 0)}
        self.partitions_n = int_option(options, "numPartitions", 2)

    def _ranges(self, shard: int, token: str | None) -> list[TablePartition]:
        with store_for(self.urls[shard]).transaction(write=False) as tx:
            if token is not None:
                n, lo, hi = sq.leased_bounds(tx, token)
                lo -= 1
            else:
                lo, hi = sq.seq_bounds(tx, self.queue)
                lo -= 1
                n = hi - lo
        if n <= 0 or hi <= 0:
            return []
        k = max(1, min(self.partitions_n, hi - lo))
        step = -(-(hi - lo) // k)
        return [
            TablePartition(lo + i * step, min(hi, lo + (i + 1) * step), shard, token)
            for i in range(k)
        ]

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[TablePartition] = []
        if self.leases is not None:
            for shard, (token, _) in sorted(self.leases.items()):
                parts += self._ranges(shard, token)
        else:
            for shard in range(len(self.urls)):
                parts += self._ranges(shard, None)
        return parts or [TablePartition(0, 0)]

    def read(self, partition: TablePartition) -> Iterator[Any]:  # type: ignore[override]
        check_master(self.url, task_master())
        if partition.seq_hi <= partition.seq_lo:
            return
        store = store_for(self.urls[partition.shard])
        bounds = (self.queue, partition.seq_lo, partition.seq_hi, partition.lease_token)
        with store.transaction(write=False) as tx:
            data = sq.read_table_csv(tx, *bounds)
            rows = sq.read_table(tx, *bounds) if data is None else []
        if data is not None:
            shard = partition.shard if len(self.urls) > 1 else None
            yield from _csv_batches(data, sq.TABLE_COLUMNS, _types(sq.TABLE_COLUMNS), shard)
            return
        rows = _fix_table(rows)
        if len(self.urls) > 1:
            rows = prefix_handles(rows, partition.shard)
        yield from _arrow_batches(sq.TABLE_COLUMNS, rows, _types(sq.TABLE_COLUMNS))


# -- stream ------------------------------------------------------------------------------
@dataclass
class PlainPartition(InputPartition):
    start: tuple[int, int]
    end: tuple[int, int]
    seq_lo: int
    seq_hi: int


@dataclass
class StagedPartition(InputPartition):
    staged_batch: str
    seq_lo: int
    seq_hi: int


def _seconds_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigurationError(f"{name}={raw!r}: a number of seconds >= 0")
    return value


def _pos_key(p: Mapping[str, int]) -> tuple[int, int, int, int]:
    return (int(p["xid"]), int(p["seq"]), int(p["bno"]), int(p["bseq"]))


def _min_pos(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    plain = min((a["xid"], a["seq"]), (b["xid"], b["seq"]))
    staged = min((a["bno"], a["bseq"]), (b["bno"], b["bseq"]))
    return {"xid": plain[0], "seq": plain[1], "bno": staged[0], "bseq": staged[1]}


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("homing")``: a queue's jobs in commit order.

    Offsets are ``{"xid", "seq", "bno", "bseq"}``: the plain-row cursor and the published-
    batch cursor (see ``homing.store.spark_queries``). ``commit(end)`` advances the
    consumer's durable cursor (cumulative, idempotent, never deletes rows).
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = store_url(options)
        self.queue = required(options, "queue", "the job type to stream")
        self.consumer = option(options, "consumer", "spark") or "spark"
        self.max_rows = int_option(options, "maxRowsPerBatch", 0, minimum=0)
        self.partitions_n = int_option(options, "numPartitions", 2)
        starting = (option(options, "startingPosition", "earliest") or "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ConfigurationError(
                f"startingPosition={starting!r}: use earliest or latest (a known consumer "
                "always resumes from its cursor)"
            )
        self.starting = starting
        self.settle_wait = _seconds_option(options, "availableNowWaitSeconds", 60.0)
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        store = store_for(self.url)
        store.migrate()
        store.ensure_stream_index()
        with store.transaction(write=False) as tx:
            cursor = sq.get_cursor(tx, self.consumer, self.queue)
        if cursor is not None:
            return cursor
        if self.starting == "latest":
            return self._latest(dict(ZERO), None)
        return dict(ZERO)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def _latest(self, start: dict[str, int], limit: int | None) -> dict[str, int]:
        store = store_for(self.url)
        store.ensure_stream_index()  # a no-op once done; here for a query that outlived it
        with store.transaction(write=False) as tx:
            plain, n = sq.plain_end(tx, self.queue, (start["xid"], start["seq"]), limit)
            rest = None if limit is None else limit - n
            staged, _ = sq.staged_end(tx, self.queue, (start["bno"], start["bseq"]), rest)
        return {"xid": plain[0], "seq": plain[1], "bno": staged[0], "bseq": staged[1]}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        start = {k: int(start.get(k, 0)) for k in ZERO}
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self._latest(start, rows)
        if self.target is not None:
            end = _min_pos(end, self.target)
            # never go backwards past start (the target was taken before a restart's start)
            if _pos_key(end) < _pos_key(start):
                end = _max_parts(end, start)
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None

    def prepareForTriggerAvailableNow(self) -> None:
        """Everything committed before the query started, once no earlier commit can follow.

        On PostgreSQL a row is only safe to pass once every older transaction has ended (see
        docs/spark.md); any transaction open on the server at this moment, in any database,
        holds that horizon back. So wait (at most ``availableNowWaitSeconds``) until the
        settled end reaches the last row this query can already see, instead of ending an
        ``availableNow`` run that leaves committed rows behind.
        """
        store = store_for(self.url)
        with store.transaction(write=False) as tx:
            visible, _ = sq.plain_end(tx, self.queue, (0, 0), None, settled=False)
        deadline = time.monotonic() + self.settle_wait
        pause = 0.01
        while True:
            latest = self._latest(dict(ZERO), None)
            if (latest["xid"], latest["seq"]) >= visible:
                break
            if time.monotonic() >= deadline:
                log.warning(
                    "availableNow on %s: an open transaction older than the last visible row "
                    "kept the stream's horizon back for %.0f s; this run stops at %s, the "
                    "rest comes with the next trigger",
                    self.queue,
                    self.settle_wait,
                    latest,
                )
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        self.target = latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        store = store_for(self.url)
        parts: list[InputPartition] = []
        s_plain = (int(start["xid"]), int(start["seq"]))
        e_plain = (int(end["xid"]), int(end["seq"]))
        with store.transaction(write=False) as tx:
            if e_plain > s_plain:
                n, lo, hi = sq.plain_seq_range(tx, self.queue, s_plain, e_plain)
                if n:
                    k = max(1, min(self.partitions_n, hi - lo + 1))
                    step = -(-(hi - lo + 1) // k)
                    for i in range(k):
                        a = lo + i * step
                        parts.append(PlainPartition(s_plain, e_plain, a, min(hi, a + step - 1)))
            s_b = (int(start["bno"]), int(start["bseq"]))
            e_b = (int(end["bno"]), int(end["bseq"]))
            if e_b > s_b:
                for commit_no, staged in sq.published_batches(tx, max(1, s_b[0]), e_b[0]):
                    lo = s_b[1] if commit_no == s_b[0] else 0
                    hi = e_b[1] if commit_no == e_b[0] else sq.BIG
                    n, first, last = sq.staged_seq_range(tx, self.queue, staged, lo, hi)
                    if not n:
                        continue
                    # split a large batch (a million children) by seq like the plain range
                    k = max(1, min(self.partitions_n, -(-n // 50_000), last - first + 1))
                    step = -(-(last - first + 1) // k)
                    for i in range(k):
                        a = first - 1 + i * step
                        parts.append(StagedPartition(staged, a, min(last, a + step)))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        check_master(self.url, task_master())
        store = store_for(self.url)
        with store.transaction(write=False) as tx:
            if isinstance(partition, PlainPartition):
                rows = sq.read_plain(
                    tx,
                    self.queue,
                    tuple(partition.start),  # type: ignore[arg-type]
                    tuple(partition.end),  # type: ignore[arg-type]
                    partition.seq_lo,
                    partition.seq_hi,
                )
            else:
                assert isinstance(partition, StagedPartition)
                rows = sq.read_staged(
                    tx, self.queue, partition.staged_batch, partition.seq_lo, partition.seq_hi
                )
        yield from _arrow_batches(sq.TABLE_COLUMNS, _fix_table(rows), _types(sq.TABLE_COLUMNS))

    def commit(self, end: dict[str, int]) -> None:
        """Advance the consumer's cursor to ``end`` (only forward; idempotent)."""
        end = {k: int(end.get(k, 0)) for k in ZERO}
        store = store_for(self.url)
        with store.transaction() as tx:
            current = sq.get_cursor(tx, self.consumer, self.queue)
            merged = end if current is None else _max_parts(current, end)
            if current != merged:
                sq.set_cursor(tx, self.consumer, self.queue, merged, store.clock.now())

    def stop(self) -> None:
        pass


def _max_parts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    plain = max((a["xid"], a["seq"]), (b["xid"], b["seq"]))
    staged = max((a["bno"], a["bseq"]), (b["bno"], b["bseq"]))
    return {"xid": plain[0], "seq": plain[1], "bno": staged[0], "bseq": staged[1]}
