"""Every SQL statement of the job queue. Domain-level functions over an open ``Tx``."""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from homing.store import holders_queries as hq
from homing.store.dialect import STILL_RUNNING, GrabRequest, SqlDialect
from homing.store.job_deps_queries import WAIT_AT
from homing.store.job_filters import compile_where
from homing.store.protocol import Tx

JOB_COLUMNS = (
    "id",
    "type",
    "args",
    "priority",
    "state",
    "run_at",
    "attempts",
    "unique_key",
    "lease_token",
    "lease_expires_at",
    "holder_host",
    "holder_pid",
    "holder_worker",
    "created_at",
    "finished_at",
    "last_error",
    "parent_id",
    "seq",
    "cancelled_at",
    "timeout_s",
)
# The holder lives in homing_holders (jobs schema 9); a job row names it by holder_id.
_HOLDER_EXPR = {"holder_host": "h.host", "holder_pid": "h.pid", "holder_worker": "h.worker"}
_COLS = ", ".join(_HOLDER_EXPR.get(c, f"j.{c}") for c in JOB_COLUMNS)
# What a grab returns: what a Job is made of, and seq for its order. The other columns
# (holder, finish, error) would travel back for every job leased, unread.
GRAB_COLUMNS = (
    "id",
    "type",
    "args",
    "priority",
    "run_at",
    "attempts",
    "unique_key",
    "created_at",
    "seq",
    "timeout_s",
)
_GRAB_COLS = ", ".join(GRAB_COLUMNS)


class NewJob(NamedTuple):
    """A job to insert; its fields are in the order the dialects' ``insert_jobs`` takes."""

    id: str
    type: str
    args_json: str
    priority: int
    run_at: float
    unique_key: str | None
    parent_id: str | None
    created_at: float
    timeout_s: float | None = None  # written by a second statement (job_controls_queries)
    after: tuple[str, ...] = ()  # dependencies: rows of homing_job_deps (job_deps_queries)
    release_at: float | None = None  # the run_at a job with dependencies gets when released


def _row(tx: Tx, values: Sequence[Any], columns: Sequence[str] = JOB_COLUMNS) -> dict[str, Any]:
    row = dict(zip(columns, values, strict=False))
    row["args"] = tx.sql.load_json(row["args"])
    return row


# A lease still held, found by the job's id (never through the index of running jobs:
# see STILL_RUNNING).
HELD = f"id = ? AND lease_token = ? AND state = {STILL_RUNNING}"


# -- insert ------------------------------------------------------------------------------
JOBS_CHANNEL = "homing_jobs"
_MANY = 1000  # a committed batch may hold millions of jobs: wake every idle worker
IDLE_FORGOTTEN_AFTER_S = 3600.0  # an idle registration not renewed for this long: its
# worker died (idle workers renew theirs at every empty grab)


def insert_jobs(tx: Tx, jobs: Sequence[NewJob]) -> list[str]:
    """Insert jobs; a job whose unique_key exists already is not inserted and the
    existing job's id is returned in its place. Returns ids in input order. The ids must
    be new (``Jobs.new_jobs`` makes uuid7s): PostgreSQL inserts a batch without unique
    keys without ``ON CONFLICT``, and a repeated id there is an error."""
    if not jobs:
        return []
    tx.sql.insert_jobs(
        tx,
        [
            (
                j.id,
                j.type,
                j.args_json,
                j.priority,
                j.run_at,
                j.unique_key,
                j.parent_id,
                j.created_at,
            )
            for j in jobs
        ],
        JOBS_CHANNEL,
    )
    ids = [j.id for j in jobs]
    keys = list({j.unique_key for j in jobs if j.unique_key is not None})
    if keys:
        owner: dict[str, str] = {}
        for start in range(0, len(keys), 500):
            clause, params = tx.sql.in_list("unique_key", keys[start : start + 500])
            rows = tx.query(f"SELECT unique_key, id FROM homing_jobs WHERE {clause}", params)
            owner.update({str(k): str(i) for k, i in rows})
        ids = [owner.get(j.unique_key, j.id) if j.unique_key else j.id for j in jobs]
    return ids


# -- grab --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    token: str
    until: float
    holder: int  # homing_holders.id (holders_queries.register_holder)


class ExpiryMarks:
    """Per store and set of types: leases that expired before the mark were looked for
    already, so the next search for expired leases reads only the index entries after it.

    PostgreSQL leaves the index entries of finished jobs in place until VACUUM; a search
    for "lease_expires_at <= now" from the start of the index would walk all of them on
    every empty grab. A search from the mark reads only what expired since the previous
    one. Anything a search could not take (the limit was reached) keeps the mark where it
    was; a full search every ``full_every`` seconds (and after the clock stepped back)
    catches what a skipped row lock or another process's skewed clock might hide.
    """

    margin = 1.0
    full_every = 10.0

    def __init__(self) -> None:
        self._marks: dict[tuple[str, ...], tuple[float, float]] = {}

    def start(self, types: tuple[str, ...], now: float) -> float | None:
        mark = self._marks.get(types)
        if mark is None:
            return None
        low, full_at = mark
        if time.monotonic() >= full_at or low > now:
            return None
        return low

    def advance(
        self,
        types: tuple[str, ...],
        now: float,
        low: float | None,
        *,
        limit: int,
        found: int,
        left: float | None,
    ) -> None:
        """After a search from ``low`` that found ``found`` expired leases (it stops at
        ``limit``) and left some of them to a later grab (``left``: the earliest expiry of
        those, if any: a grab filled by ready jobs of the same priority leaves them)."""
        mark = self._marks.get(types)
        full_at = time.monotonic() + self.full_every if low is None or mark is None else mark[1]
        if found >= limit:  # more may be waiting below now: search from the same place
            if low is not None:
                self._marks[types] = (low, full_at)
            return
        start = now if left is None else min(now, left)  # before any lease it left
        self._marks[types] = (start - self.margin, full_at)


_EXPIRY_MARKS: weakref.WeakKeyDictionary[Any, ExpiryMarks] = weakref.WeakKeyDictionary()


def _expiry_marks(store: Any) -> ExpiryMarks | None:
    if store.capabilities.concurrent_writers is False:  # no dead index entries to skip
        return None
    marks = _EXPIRY_MARKS.get(store)
    if marks is None:
        marks = _EXPIRY_MARKS[store] = ExpiryMarks()
    return marks


def grab_jobs(tx: Tx, types: Sequence[str], **grab: Any) -> list[dict[str, Any]]:
    """``grab_rows`` (same arguments) decoded (``decode_grabbed``) in the transaction."""
    return decode_grabbed(tx.sql, grab_rows(tx, types, **grab))


_PRIORITY, _SEQ = GRAB_COLUMNS.index("priority"), GRAB_COLUMNS.index("seq")


def decode_grabbed(sql: SqlDialect, rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The rows of ``grab_rows`` as dicts with their args decoded: needs no transaction,
    so that a caller may do it after the commit (on SQLite, not holding the write lock)."""
    out = []
    for values in rows:
        row = dict(zip(GRAB_COLUMNS, values, strict=True))
        row["args"] = sql.load_json(row["args"])
        out.append(row)
    return out


def grab_rows(
    tx: Tx,
    types: Sequence[str],
    *,
    now: float,
    lease: Lease,
    limit: int,
    where: Mapping[str, Any] | None,
    idle_channel: str | None = None,
    extra: tuple[str, list[Any]] | None = None,
) -> list[tuple[Any, ...]]:
    """Lease up to ``limit`` available jobs of ``types`` to one holder, atomically; their
    ``GRAB_COLUMNS`` as stored (args not decoded), best priority first.

    ``extra`` (`` AND <clause>``, params) narrows the search further (the per-key limits).

    A job is available when ready and due, or running with an expired lease, and not staged
    in an uncommitted batch; the best priority goes first. Jobs of committed batches fill
    what is left. A job taken over from an expired lease gets a ``lease_expired`` history
    entry.
    """
    where_sql = ""
    where_params: list[Any] = []
    if where is not None:
        clause, where_params = compile_where(tx.sql, where)
        where_sql = " AND " + clause
    if extra is not None and extra[0]:
        where_sql += extra[0]
        where_params = [*where_params, *extra[1]]
    key = tuple(types)
    marks = _expiry_marks(tx.store)
    low = marks.start(key, now) if marks is not None else None
    request = GrabRequest(
        types=key,
        now=now,
        token=lease.token,
        until=lease.until,
        holder=lease.holder,
        limit=limit,
        where_sql=where_sql,
        where_params=where_params,
        expired_after=low,
        idle_channel=idle_channel,
    )
    rows = tx.sql.grab(tx, request, _GRAB_COLS)
    if marks is not None:
        if tx.sql.reports_expired and rows:  # what the search for expired leases found
            found, left = int(rows[0][-2]), rows[0][-1]
        else:  # filled by any rows (ready ones too), an expired lease may have lost its
            found, left = (limit if len(rows) >= limit else 0), None  # place: keep the mark
        marks.advance(key, now, low, limit=limit, found=found, left=left)
    if len(rows) < limit:
        rows += tx.sql.grab_staged(tx, replace(request, limit=limit - len(rows)), _GRAB_COLS)
    n = len(GRAB_COLUMNS)
    result = [tuple(values[:n]) for values in rows]
    result.sort(key=lambda v: (-v[_PRIORITY], v[_SEQ]))
    return result


def may_be_available(tx: Tx, types: Sequence[str], *, now: float) -> bool:
    """Whether a grab of ``types`` could find a job now: a ready and due one, an expired
    lease, or any ready job of a staged batch. Never False when a grab would find one
    (filters and batch states are left out: it may say True for nothing), so a caller
    may skip the grab when it says False. For single-writer stores, where a grab takes
    the write lock that every other process's insert and completion waits for, and this
    read does not (huey's dequeue checks first the same way)."""
    marks = ", ".join("?" for _ in types)
    row = tx.query_one(
        "SELECT EXISTS (SELECT 1 FROM homing_jobs WHERE type IN "
        f"({marks}) AND state = 'ready' AND batch_id IS NULL AND run_at <= ?) "
        f"OR EXISTS (SELECT 1 FROM homing_jobs WHERE type IN ({marks}) "
        "AND state = 'running' AND lease_expires_at <= ?) "
        "OR EXISTS (SELECT 1 FROM homing_jobs WHERE batch_id IS NOT NULL AND state = 'ready')",
        [*types, now, *types, now],
    )
    return bool(row and row[0])


# -- staged batches ----------------------------------------------------------------------
def open_batch(tx: Tx, batch_id: str, *, now: float, info: str | None = None) -> str:
    """Create a staging batch if it does not exist; return its state (open/committed/aborted)."""
    tx.execute(
        "INSERT INTO homing_job_batches (batch_id, state, created_at, info) VALUES (?, 'open', ?, ?) "
        "ON CONFLICT (batch_id) DO NOTHING",
        (batch_id, now, info),
    )
    row = tx.query_one("SELECT state FROM homing_job_batches WHERE batch_id = ?", (batch_id,))
    assert row is not None
    return str(row[0])


def commit_batch(tx: Tx, batch_id: str, *, now: float) -> bool:
    """Make every job staged in the batch grabbable at once; True if this call committed it.

    Idempotent: committing a committed batch changes nothing and returns False.
    """
    changed = (
        tx.rowcount(
            "UPDATE homing_job_batches SET state = 'committed', committed_at = ? "
            "WHERE batch_id = ? AND state = 'open'",
            (now, batch_id),
        )
        == 1
    )
    if changed:
        tx.sql.announce_jobs(tx, JOBS_CHANNEL, _MANY)
    return changed


def batch_state(tx: Tx, batch_id: str) -> str | None:
    row = tx.query_one("SELECT state FROM homing_job_batches WHERE batch_id = ?", (batch_id,))
    return str(row[0]) if row is not None else None


# -- finishing ---------------------------------------------------------------------------
def finish(tx: Tx, job_id: str, token: str, *, state: str, now: float, error: str | None) -> bool:
    """Mark a running job done or failed if ``token`` still holds its lease."""
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET state = ?, finished_at = ?, last_error = COALESCE(?, last_error), "
            "lease_expires_at = NULL WHERE " + HELD,
            (state, now, error, job_id, token),
        )
        == 1
    )


def finish_many(tx: Tx, job_ids: Sequence[str], token: str, *, now: float) -> int:
    """Mark many running jobs of one lease done in one statement; returns how many changed."""
    if not job_ids:
        return 0
    return tx.sql.finish_many(tx, job_ids, token, now=now)


def forget_idle(tx: Tx, channel: str) -> None:
    """Unregister an idle worker (it is shutting down)."""
    tx.execute(
        "DELETE FROM homing_idle_workers WHERE channel = ?",
        (tx.store.notify_channel(channel) if hasattr(tx.store, "notify_channel") else channel,),
    )


def finish_leased(tx: Tx, pairs: Sequence[tuple[str, str]], *, now: float) -> set[tuple[str, str]]:
    """Mark done each (job id, lease token) whose lease still holds, in one statement
    where the backend allows; returns the pairs done (a job given twice, under a stale
    and a live token, is done by one pair only). Refused ones are left as they are."""
    return tx.sql.finish_leased(tx, pairs, now=now) if pairs else set()


def expire_leases(tx: Tx, leases: Sequence[tuple[str, str]], *, now: float) -> int:
    """End these leases now, if their tokens still hold them: the jobs are taken over
    through the expired-lease path (with its history entry), as after a lease ran out."""
    return sum(
        tx.rowcount(
            "UPDATE homing_jobs SET lease_expires_at = ?, available_at = ? WHERE " + HELD,
            (now, now, job_id, token),
        )
        for job_id, token in leases
    )


def reschedule(tx: Tx, job_id: str, token: str, *, run_at: float, error: str | None) -> bool:
    """Put a running job back to ready at ``run_at`` if ``token`` still holds its lease."""
    changed = (
        tx.rowcount(
            "UPDATE homing_jobs SET state = 'ready', run_at = ?, available_at = ?, "
            "last_error = COALESCE(?, last_error), lease_expires_at = NULL "
            "WHERE " + HELD,
            (run_at, run_at, error, job_id, token),
        )
        == 1
    )
    if changed and run_at <= tx.store.clock.now():
        tx.sql.announce_jobs(tx, JOBS_CHANNEL, 1)  # released for another worker: wake one
    return changed


def extend_lease(tx: Tx, job_id: str, token: str, *, until: float) -> bool:
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET lease_expires_at = ?, available_at = ? WHERE " + HELD,
            (until, until, job_id, token),
        )
        == 1
    )


def add_failure(
    tx: Tx,
    job_id: str,
    *,
    attempt: int,
    at: float,
    kind: str,
    host: str | None,
    pid: int | None,
    worker: str | None,
    message: str,
) -> None:
    tx.execute(
        "INSERT INTO homing_job_failures (job_id, attempt, at, kind, host, pid, worker, message) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (job_id, attempt, at, kind, host, pid, worker, message),
    )


def redrive(tx: Tx, job_id: str, *, now: float) -> bool:
    """Make a perm-failed job ready again with its attempts reset (history kept)."""
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET state = 'ready', attempts = 0, run_at = ?, available_at = ?, "
            "finished_at = NULL, lease_token = NULL, lease_expires_at = NULL "
            "WHERE id = ? AND state = 'failed' AND cancelled_at IS NULL",
            (now, now, job_id),
        )
        == 1
    )


# -- reading -----------------------------------------------------------------------------
def job_row(tx: Tx, job_id: str) -> dict[str, Any] | None:
    values = tx.query_one(
        f"SELECT {_COLS} FROM homing_jobs j LEFT JOIN homing_holders h ON h.id = j.holder_id "
        "WHERE j.id = ?",
        (job_id,),
    )
    return _row(tx, values) if values is not None else None


def failures(tx: Tx, job_id: str) -> list[dict[str, Any]]:
    names = ("attempt", "at", "kind", "host", "pid", "worker", "message")
    rows = tx.query(
        "SELECT attempt, at, kind, host, pid, worker, message FROM homing_job_failures "
        "WHERE job_id = ? ORDER BY at, attempt",
        (job_id,),
    )
    return [dict(zip(names, r, strict=True)) for r in rows]


def gc(tx: Tx, *, finished_before: float) -> int:
    tx.execute(
        "DELETE FROM homing_job_failures WHERE job_id IN "
        "(SELECT id FROM homing_jobs WHERE finished_at IS NOT NULL AND finished_at < ?)",
        (finished_before,),
    )
    deleted = tx.rowcount(
        "DELETE FROM homing_jobs WHERE finished_at IS NOT NULL AND finished_at < ?",
        (finished_before,),
    )
    tx.execute(
        "DELETE FROM homing_idle_workers WHERE since < ?",
        (tx.store.clock.now() - IDLE_FORGOTTEN_AFTER_S,),
    )
    # listeners that died without unregistering (live ones refresh theirs)
    tx.sql.forget_dead_listeners(tx, older_than=IDLE_FORGOTTEN_AFTER_S)
    hq.forget_holders(tx, before=tx.store.clock.now() - hq.HOLDER_FORGOTTEN_AFTER_S)
    tx.execute(
        "DELETE FROM homing_job_batches WHERE state <> 'open' AND created_at < ? AND NOT EXISTS "
        "(SELECT 1 FROM homing_jobs j WHERE j.batch_id = homing_job_batches.batch_id)",
        (finished_before,),
    )
    return deleted


def stats(tx: Tx, *, now: float, window: float) -> list[dict[str, Any]]:
    """Per type: counts by state, oldest due ready job's age, completions in the window.

    ``staged`` counts jobs written into a batch that is not committed yet (invisible);
    ``expired`` running jobs whose lease ran out (their worker died or stalls), which the
    next grab hands out again; ``cancelled`` jobs cancelled by ``cancel`` (not in ``failed``);
    ``waiting`` jobs waiting for their dependencies (``after=``; not in ``scheduled``).
    """
    visible = "(j.batch_id IS NULL OR b.state = 'committed')"
    rows = tx.query(
        "SELECT j.type, "
        f"SUM(CASE WHEN j.state = 'ready' AND j.run_at <= ? AND {visible} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN j.state = 'ready' AND j.run_at > ? AND j.run_at < {WAIT_AT!r} "
        f"AND {visible} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN j.state = 'ready' AND NOT {visible} THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'running' AND j.lease_expires_at > ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'running' AND j.lease_expires_at <= ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'done' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'failed' AND j.cancelled_at IS NULL THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.cancelled_at IS NOT NULL THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN j.state = 'ready' AND j.run_at >= {WAIT_AT!r} THEN 1 ELSE 0 END), "
        f"MIN(CASE WHEN j.state = 'ready' AND j.run_at <= ? AND {visible} THEN j.run_at END), "
        "SUM(CASE WHEN j.state = 'done' AND j.finished_at >= ? THEN 1 ELSE 0 END) "
        "FROM homing_jobs j LEFT JOIN homing_job_batches b ON b.batch_id = j.batch_id "
        "GROUP BY j.type ORDER BY j.type",
        (now, now, now, now, now, now - window),
    )
    out = []
    for row in rows:
        type_, ready, scheduled, staged, running, expired, done, failed, cancelled = row[:9]
        waiting, oldest, recent = row[9:]
        out.append(
            {
                "type": type_,
                "ready": int(ready or 0),
                "scheduled": int(scheduled or 0),
                "staged": int(staged or 0),
                "running": int(running or 0),
                "expired": int(expired or 0),
                "done": int(done or 0),
                "failed": int(failed or 0),
                "cancelled": int(cancelled or 0),
                "waiting": int(waiting or 0),
                "oldest_ready_age_s": (now - float(oldest)) if oldest is not None else None,
                "done_per_s": int(recent or 0) / window,
            }
        )
    return out
