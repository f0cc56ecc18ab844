"""Every SQL statement of the spark component. Domain-level functions over an open ``Tx``.

Positions of a stream over one queue (job type) are two commit-ordered cursors:

- plain rows (inserted visible, ``staged_in IS NULL``) by ``(xid, seq)``: on SQLite ``xid`` is
  always 0 and ``seq`` is in commit order (one writer); on PostgreSQL ``xid`` is the inserting
  transaction and only rows below the snapshot's xmin are read, so nothing can still commit
  behind a returned position;
- staged rows (written invisibly by Spark tasks) by ``(commit_no, seq)``, where ``commit_no``
  numbers the commits that published their batches, in commit order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from homing.ids import job_uuid
from homing.store import jobs_queries as q
from homing.store.protocol import Tx, to_pyformat

BIG = 2**62

STREAM_COLUMNS = ("id", "seq", "type", "args", "priority", "run_at", "created_at", "parent_id")
TABLE_COLUMNS = (
    *STREAM_COLUMNS,
    "state",
    "attempts",
    "finished_at",
    "last_error",
)


def _select(tx: Tx, columns: Sequence[str], alias: str = "j") -> str:
    out = []
    for c in columns:
        if c == "args":
            out.append(tx.sql.json_text(f"{alias}.args"))
        else:
            out.append(f"{alias}.{c}")
    return ", ".join(out)


_VISIBLE = (
    "(j.batch_id IS NULL OR j.batch_id IN "
    "(SELECT batch_id FROM homing_job_batches WHERE state = 'committed'))"
)


# -- batch reads -------------------------------------------------------------------------
def seq_bounds(tx: Tx, queue: str | None) -> tuple[int, int]:
    """Lowest and highest ``seq`` of a queue's rows (0, 0 when empty)."""
    if queue is None:
        row = tx.query_one("SELECT MIN(seq), MAX(seq) FROM homing_jobs")
    else:
        row = tx.query_one("SELECT MIN(seq), MAX(seq) FROM homing_jobs WHERE type = ?", (queue,))
    if row is None or row[0] is None:
        return 0, 0
    return int(row[0]), int(row[1])


def _table_where(
    seq_lo: int, seq_hi: int, queue: str | None, lease_token: str | None
) -> tuple[str, list[Any]]:
    where = ["j.seq > ?", "j.seq <= ?", _VISIBLE]
    params: list[Any] = [seq_lo, seq_hi]
    if queue is not None:
        where.append("j.type = ?")
        params.append(queue)
    if lease_token is not None:
        where.append("j.lease_token = ? AND j.state = 'running'")
        params.append(lease_token)
    return " AND ".join(where), params


def read_table(
    tx: Tx, queue: str | None, seq_lo: int, seq_hi: int, lease_token: str | None
) -> list[tuple[Any, ...]]:
    """Visible rows with ``seq_lo < seq <= seq_hi`` (of one queue, or one lease when given)."""
    where, params = _table_where(seq_lo, seq_hi, queue, lease_token)
    return tx.query(
        f"SELECT {_select(tx, TABLE_COLUMNS)} FROM homing_jobs j WHERE {where} ORDER BY j.seq",
        params,
    )


def read_table_csv(
    tx: Tx, queue: str | None, seq_lo: int, seq_hi: int, lease_token: str | None
) -> bytes | None:
    """``read_table``'s rows as CSV (PostgreSQL's ``COPY ... TO STDOUT``: the server
    formats them and the client parses nothing in Python), or None where the store has no
    COPY (SQLite: use ``read_table``). NULL is an unquoted empty field, an empty string a
    quoted one. Values are bound by psycopg, as in every other statement."""
    if tx.dialect != "postgres":
        return None
    where, params = _table_where(seq_lo, seq_hi, queue, lease_token)
    statement = to_pyformat(
        f"COPY (SELECT {_select(tx, TABLE_COLUMNS)} FROM homing_jobs j "
        f"WHERE {where} ORDER BY j.seq) TO STDOUT WITH (FORMAT csv)"
    )
    out = bytearray()
    with tx.connection.cursor() as cur, cur.copy(statement, params) as copy:
        for block in copy:
            out += block
    return bytes(out)


def leased_bounds(tx: Tx, lease_token: str) -> tuple[int, int, int]:
    """(count, min seq, max seq) of the running jobs held under one lease token."""
    row = tx.query_one(
        "SELECT COUNT(*), MIN(seq), MAX(seq) FROM homing_jobs "
        "WHERE lease_token = ? AND state = 'running'",
        (lease_token,),
    )
    if row is None or not row[0]:
        return 0, 0, 0
    return int(row[0]), int(row[1]), int(row[2])


# -- stream positions --------------------------------------------------------------------
def plain_end(
    tx: Tx, queue: str, start: tuple[int, int], limit: int | None, *, settled: bool = True
) -> tuple[tuple[int, int], int]:
    """The position after at most ``limit`` plain rows past ``start``; and how many rows.

    ``settled`` keeps to positions no later commit can fall behind (on PostgreSQL, below
    the snapshot's xmin); without it, the last position this transaction sees.
    """
    after, after_params = tx.sql.stream_after(start)
    params: list[Any] = [queue, *after_params]
    horizon = tx.sql.below_xmin if settled else ""
    base = (
        f"SELECT {tx.sql.stream_key}, seq FROM homing_jobs WHERE type = ? "
        f"AND staged_in IS NULL AND {after}{horizon}"
    )
    order = tx.sql.stream_order()
    if limit is None:
        row = tx.query_one(f"{base} {tx.sql.stream_order(descending=True)} LIMIT 1", params)
        return ((int(row[0]), int(row[1])) if row else start), (1 if row else 0)
    if limit <= 0:
        return start, 0
    rows = tx.query(f"{base} {order} LIMIT ?", [*params, limit])
    if not rows:
        return start, 0
    return (int(rows[-1][0]), int(rows[-1][1])), len(rows)


def staged_end(
    tx: Tx, queue: str, start: tuple[int, int], limit: int | None
) -> tuple[tuple[int, int], int]:
    """The position after at most ``limit`` rows of published staged batches past ``start``."""
    base = (
        "SELECT c.commit_no, j.seq FROM homing_spark_commits c "
        "JOIN homing_jobs j ON j.staged_in = c.staged_batch "
        "WHERE j.type = ? AND (c.commit_no > ? OR (c.commit_no = ? AND j.seq > ?))"
    )
    params: list[Any] = [queue, start[0], start[0], start[1]]
    if limit is None:
        row = tx.query_one(f"{base} ORDER BY c.commit_no DESC, j.seq DESC LIMIT 1", params)
        return ((int(row[0]), int(row[1])) if row else start), (1 if row else 0)
    if limit <= 0:
        return start, 0
    rows = tx.query(f"{base} ORDER BY c.commit_no, j.seq LIMIT ?", [*params, limit])
    if not rows:
        return start, 0
    return (int(rows[-1][0]), int(rows[-1][1])), len(rows)


def plain_seq_range(
    tx: Tx, queue: str, start: tuple[int, int], end: tuple[int, int]
) -> tuple[int, int, int]:
    """(count, min seq, max seq) of the plain rows in ``(start, end]``."""
    where, params = _plain_range(tx, queue, start, end)
    row = tx.query_one(
        f"SELECT COUNT(*), MIN(seq), MAX(seq) FROM homing_jobs WHERE {where}", params
    )
    if row is None or not row[0]:
        return 0, 0, 0
    return int(row[0]), int(row[1]), int(row[2])


def _plain_range(
    tx: Tx, queue: str, start: tuple[int, int], end: tuple[int, int]
) -> tuple[str, list[Any]]:
    after, after_params = tx.sql.stream_after(start)
    through, through_params = tx.sql.stream_through(end)
    return (
        f"type = ? AND staged_in IS NULL AND {after} AND {through}",
        [queue, *after_params, *through_params],
    )


def read_plain(
    tx: Tx,
    queue: str,
    start: tuple[int, int],
    end: tuple[int, int],
    seq_lo: int,
    seq_hi: int,
) -> list[tuple[Any, ...]]:
    """Plain rows in ``(start, end]`` with ``seq_lo <= seq <= seq_hi``, in seq order."""
    where, params = _plain_range(tx, queue, start, end)
    return tx.query(
        f"SELECT {_select(tx, TABLE_COLUMNS)} FROM homing_jobs j WHERE {where} "
        "AND seq >= ? AND seq <= ? ORDER BY seq",
        [*params, seq_lo, seq_hi],
    )


def published_batches(tx: Tx, bno_lo: int, bno_hi: int) -> list[tuple[int, str]]:
    """(commit_no, staged batch) of the publications numbered ``bno_lo..bno_hi``."""
    return [
        (int(n), str(b))
        for n, b in tx.query(
            "SELECT commit_no, staged_batch FROM homing_spark_commits "
            "WHERE commit_no >= ? AND commit_no <= ? ORDER BY commit_no",
            (bno_lo, bno_hi),
        )
    ]


def staged_seq_range(
    tx: Tx, queue: str, staged_batch: str, seq_lo: int, seq_hi: int
) -> tuple[int, int, int]:
    """(count, min seq, max seq) of one published batch's rows in ``(seq_lo, seq_hi]``."""
    row = tx.query_one(
        "SELECT COUNT(*), MIN(seq), MAX(seq) FROM homing_jobs WHERE staged_in = ? AND type = ? "
        "AND seq > ? AND seq <= ?",
        (staged_batch, queue, seq_lo, seq_hi),
    )
    if row is None or not row[0]:
        return 0, 0, 0
    return int(row[0]), int(row[1]), int(row[2])


def read_staged(
    tx: Tx, queue: str, staged_batch: str, seq_lo: int, seq_hi: int
) -> list[tuple[Any, ...]]:
    """Rows of one published staged batch with ``seq_lo < seq <= seq_hi``."""
    return tx.query(
        f"SELECT {_select(tx, TABLE_COLUMNS)} FROM homing_jobs j WHERE j.staged_in = ? "
        "AND j.type = ? AND j.seq > ? AND j.seq <= ? ORDER BY j.seq",
        (staged_batch, queue, seq_lo, seq_hi),
    )


# -- consumer cursors --------------------------------------------------------------------
def get_cursor(tx: Tx, consumer: str, queue: str) -> dict[str, int] | None:
    row = tx.query_one(
        "SELECT position FROM homing_spark_cursors WHERE consumer = ? AND queue = ?",
        (consumer, queue),
    )
    return {k: int(v) for k, v in json.loads(row[0]).items()} if row else None


def set_cursor(tx: Tx, consumer: str, queue: str, position: dict[str, int], now: float) -> None:
    tx.execute(
        "INSERT INTO homing_spark_cursors (consumer, queue, position, updated_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (consumer, queue) DO UPDATE SET "
        "position = excluded.position, updated_at = excluded.updated_at",
        (consumer, queue, json.dumps(position, sort_keys=True), now),
    )


# -- staged writes -----------------------------------------------------------------------
class StagedJob(NamedTuple):
    """One row of a staged write, in the column order of the COPY (a tuple: the sink makes
    one per row)."""

    id: str
    type: str
    args_json: str
    priority: int
    run_at: float
    parent_id: str | None


def _with_job_uuids(job: StagedJob) -> StagedJob:
    job_id = job_uuid(job.id)
    parent = None if job.parent_id is None else job_uuid(job.parent_id)
    if job_id == job.id and parent == job.parent_id:
        return job
    return job._replace(id=job_id, parent_id=parent)


_ADOPT = (
    "ON CONFLICT (id) DO UPDATE SET batch_id = excluded.batch_id, "
    "staged_in = excluded.staged_in "
    "WHERE homing_jobs.batch_id IS NOT NULL AND homing_jobs.batch_id <> excluded.batch_id "
    "AND homing_jobs.state = 'ready' AND NOT EXISTS (SELECT 1 FROM homing_job_batches b "
    "WHERE b.batch_id = homing_jobs.batch_id AND b.state = 'committed')"
)
_STAGE_COLS = (
    "id, type, args, priority, state, run_at, available_at, parent_id, created_at, "
    "batch_id, staged_in"
)


def stage_jobs(tx: Tx, staged_batch: str, jobs: Sequence[StagedJob], *, now: float) -> None:
    """Write jobs invisibly into ``staged_batch``.

    A job whose id exists already is left alone, except when it sits in another batch that
    was never published (the orphan of a crashed run): then it is re-pointed into this one,
    so it becomes visible with this batch. Committed, grabbed and finished jobs never move.
    On PostgreSQL the rows travel by COPY into a temporary table, then one upsert. An id
    (or parent id) that is no UUID is stored as ``ids.job_uuid`` of it.
    """
    if not jobs:
        return
    jobs = [_with_job_uuids(j) for j in jobs]
    tx.sql.stage_jobs(
        tx,
        f"INSERT INTO homing_jobs ({_STAGE_COLS}) VALUES (?, ?, ?, ?, 'ready', ?, ?, ?, ?, ?, ?) "
        + _ADOPT,
        jobs,
        staged_batch,
        now,
    )


def open_batch(tx: Tx, staged_batch: str, *, now: float, info: str) -> str:
    return q.open_batch(tx, staged_batch, now=now, info=info)


def batch_state(tx: Tx, staged_batch: str) -> str | None:
    return q.batch_state(tx, staged_batch)


def publication(tx: Tx, staged_batch: str) -> int | None:
    """The commit number that published ``staged_batch``, or None if it is unpublished."""
    row = tx.query_one(
        "SELECT commit_no FROM homing_spark_commits WHERE staged_batch = ?", (staged_batch,)
    )
    return int(row[0]) if row else None


def publish(
    tx: Tx, staged_batch: str, *, sink: str, label: str, now: float, parents: int = 0
) -> bool:
    """Make ``staged_batch`` visible and number the publication; False if it was already.

    One row update (the batch) and one insert (the publication), however many jobs the
    batch holds. Idempotent per staged batch, so a doubled Spark commit publishes once.
    """
    if publication(tx, staged_batch) is not None:
        return False
    q.open_batch(tx, staged_batch, now=now, info=f"spark {sink} {label}")
    q.commit_batch(tx, staged_batch, now=now)
    tx.sql.number_publication(tx, staged_batch, sink, label, now, parents)
    return True


def staged_unpublished(tx: Tx, since: float) -> int:
    """Spark batches opened since ``since`` that hold staged rows but are not published yet:
    a write is between its tasks and its driver commit (the pipeline's executor kill)."""
    row = tx.query_one(
        "SELECT COUNT(*) FROM homing_job_batches b WHERE b.state = 'open' "
        "AND b.created_at >= ? AND b.info LIKE 'spark %' "
        "AND EXISTS (SELECT 1 FROM homing_jobs j WHERE j.batch_id = b.batch_id)",
        (since,),
    )
    return int(row[0]) if row else 0


def complete_leased(tx: Tx, lease_token: str, *, now: float) -> int:
    """Mark every running job held under ``lease_token`` done; returns how many."""
    return tx.rowcount(
        "UPDATE homing_jobs SET state = 'done', finished_at = ?, lease_expires_at = NULL "
        "WHERE lease_token = ? AND state = 'running'",
        (now, lease_token),
    )


# -- the pipeline's checks (homing.pipeline) ---------------------------------------------
def _run_filter(tx: Tx) -> str:
    return f"{tx.sql.args_field('run')} = ?"


def run_counts(tx: Tx, run: str) -> dict[tuple[str, str], int]:
    """Jobs of one pipeline run (``args.run``) by (type, state)."""
    rows = tx.query(
        f"SELECT type, state, COUNT(*) FROM homing_jobs WHERE {_run_filter(tx)} "
        "GROUP BY type, state",
        (run,),
    )
    return {(str(t), str(s)): int(n) for t, s, n in rows}


def finished_counts(tx: Tx, job_types: Sequence[str]) -> dict[tuple[str, str], int]:
    """Done and failed jobs of ``job_types`` by (type, state): the pipeline's progress,
    polled every second or so (about half the cost of the dashboard's per-type stats,
    whose other columns the progress does not show)."""
    marks = ", ".join("?" for _ in job_types)
    rows = tx.query(
        f"SELECT type, state, COUNT(*) FROM homing_jobs WHERE type IN ({marks}) "
        "AND state IN ('done', 'failed') GROUP BY type, state",
        tuple(job_types),
    )
    return {(str(t), str(s)): int(n) for t, s, n in rows}


def unfinished_by_run(tx: Tx, job_types: Sequence[str]) -> dict[str, int]:
    """Ready and running jobs of ``job_types`` per pipeline run (``args.run``): the runs
    that have not finished (or were stopped before they did)."""
    marks = ", ".join("?" for _ in job_types)
    rows = tx.query(
        f"SELECT {tx.sql.args_field('run')} AS r, COUNT(*) FROM homing_jobs "
        f"WHERE type IN ({marks}) AND state IN ('ready', 'running') GROUP BY r",
        tuple(job_types),
    )
    return {str(r): int(n) for r, n in rows}


def run_jobs(tx: Tx, run: str, job_type: str) -> list[tuple[str, str, int]]:
    """(id, state, attempts) of one run's jobs of one type."""
    rows = tx.query(
        f"SELECT id, state, attempts FROM homing_jobs WHERE type = ? AND {_run_filter(tx)}",
        (job_type, run),
    )
    return [(str(i), str(s), int(a)) for i, s, a in rows]


def run_arg_counts(
    tx: Tx, run: str, job_type: str, key: str
) -> list[tuple[str, int, float, float]]:
    """(value of ``args[key]``, jobs, first and last created_at) of one run's jobs of a type:
    how often each value was recorded, to count effects per notification."""
    value = tx.sql.args_field_param()
    rows = tx.query(
        f"SELECT {value} AS v, COUNT(*), MIN(created_at), MAX(created_at) FROM homing_jobs "
        f"WHERE type = ? AND {_run_filter(tx)} GROUP BY v",
        (key, job_type, run),
    )
    return [(str(v), int(n), float(lo), float(hi)) for v, n, lo, hi in rows]
