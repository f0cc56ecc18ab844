"""The dashboard's SQL: cheap reads for its pages and the few operator writes it offers.

Every read is shaped for big stores (a million jobs and more): counts of live jobs come
from the partial indexes of ready and running jobs, counts of unsuccessful jobs from the
dashboard's own partial index, finished jobs are counted only inside a recent window
(through the finished-at index), lists are keyset-paginated by ``seq`` with a LIMIT, and
"how many match" is a bounded count. User input only ever travels as bound parameters;
args searches are compiled by :func:`homing.store.job_filters.compile_where`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from homing.errors import InvalidArgument
from homing.store import jobs_queries as jq
from homing.store.job_deps_queries import WAIT_AT
from homing.store.job_filters import compile_where
from homing.store.protocol import Tx

# States a filter may name: the stored ones, plus "scheduled" (ready, not yet due) and
# "expired" (running with a lapsed lease), the two the overview shows apart.
_STATE = re.compile(r"^[a-z_]{1,32}$")
LIST_COLUMNS = (
    "seq",
    "id",
    "type",
    "state",
    "attempts",
    "priority",
    "run_at",
    "created_at",
    "finished_at",
    "lease_expires_at",
    "last_error",
    "args",
)


@dataclass(frozen=True)
class JobFilter:
    """What the jobs list shows: a type, a state and an args search (grab's operators)."""

    type: str | None = None
    state: str | None = None
    where: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.state is not None and not _STATE.match(self.state):
            raise InvalidArgument(
                f"state must be a state name such as 'failed', not {self.state!r}"
            )
        if self.type is not None and not (0 < len(self.type) <= 200):
            raise InvalidArgument("type must be 1 to 200 characters")


def _filter_sql(tx: Tx, f: JobFilter, now: float) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if f.type:
        clauses.append("type = ?")
        params.append(f.type)
    # ready and scheduled jobs through the ready index (its predicate: batch_id IS NULL);
    # "staged" jobs are those still in a Spark batch (committed ones until grabbed)
    if f.state == "scheduled":
        clauses.append("state = 'ready' AND batch_id IS NULL AND run_at > ? AND run_at < ?")
        params += [now, WAIT_AT]
    elif f.state == "waiting":  # for its dependencies (after=): never due until released
        clauses.append("state = 'ready' AND batch_id IS NULL AND run_at >= ?")
        params.append(WAIT_AT)
    elif f.state == "ready":
        clauses.append("state = 'ready' AND batch_id IS NULL AND run_at <= ?")
        params.append(now)
    elif f.state == "staged":
        clauses.append("state = 'ready' AND batch_id IS NOT NULL")
    elif f.state == "expired":
        clauses.append("state = 'running' AND lease_expires_at <= ?")
        params.append(now)
    elif f.state in ("running", "done"):
        clauses.append(f"state = '{f.state}'")
    elif f.state == "cancelled":  # stored as failed with cancelled_at (jobs migration 4)
        clauses.append("state NOT IN ('ready', 'running', 'done') AND cancelled_at IS NOT NULL")
    elif f.state:  # failed, ...: the partial index of unsuccessful jobs
        clauses.append(
            "state NOT IN ('ready', 'running', 'done') AND state = ? AND cancelled_at IS NULL"
        )
        params.append(f.state)
    if f.where:
        clause, more = compile_where(tx.sql, f.where)
        clauses.append(clause)
        params += more
    return (" AND ".join(clauses) or "1 = 1"), params


# -- overview ----------------------------------------------------------------------------
# a cancelled job is stored as failed with cancelled_at (jobs migration 4)
_SHOWN_STATE = "CASE WHEN cancelled_at IS NOT NULL THEN 'cancelled' ELSE state END"


def _bump(out: dict[str, dict[str, Any]], type_: str, key: str, n: Any) -> None:
    row = out.setdefault(str(type_), {})
    row[key] = row.get(key, 0) + int(n or 0)


def type_counts(tx: Tx, *, now: float) -> dict[str, dict[str, Any]]:
    """Per job type: ready, scheduled, staged, running, expired, each unsuccessful state,
    and the oldest due ready job's ``run_at`` (``oldest_ready_at``). What finished
    recently comes from :func:`finished`."""
    out: dict[str, dict[str, Any]] = {}
    for type_, ready, scheduled, waiting, oldest in tx.query(
        "SELECT type, SUM(CASE WHEN run_at <= ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN run_at > ? AND run_at < ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN run_at >= ? THEN 1 ELSE 0 END), MIN(CASE WHEN run_at <= ? THEN run_at END) "
        "FROM homing_jobs WHERE state = 'ready' AND batch_id IS NULL GROUP BY type",
        (now, now, WAIT_AT, WAIT_AT, now),
    ):
        _bump(out, type_, "ready", ready)
        _bump(out, type_, "scheduled", scheduled)
        if waiting:
            _bump(out, type_, "waiting", waiting)
        if oldest is not None:
            out[str(type_)]["oldest_ready_at"] = float(oldest)
    for type_, bstate, n, oldest in tx.query(
        "SELECT j.type, b.state, COUNT(*), MIN(j.run_at) FROM homing_jobs j "
        "LEFT JOIN homing_job_batches b ON b.batch_id = j.batch_id "
        "WHERE j.batch_id IS NOT NULL AND j.state = 'ready' GROUP BY j.type, b.state"
    ):
        _bump(out, type_, "ready" if bstate == "committed" else "staged", n)
        row = out[str(type_)]
        if bstate == "committed" and oldest is not None and float(oldest) <= now:
            row["oldest_ready_at"] = min(row.get("oldest_ready_at", now), float(oldest))
    for type_, running, expired in tx.query(
        "SELECT type, SUM(CASE WHEN lease_expires_at > ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN lease_expires_at <= ? THEN 1 ELSE 0 END) "
        "FROM homing_jobs WHERE state = 'running' GROUP BY type",
        (now, now),
    ):
        _bump(out, type_, "running", running)
        _bump(out, type_, "expired", expired)
    for type_, state, n in tx.query(
        f"SELECT type, {_SHOWN_STATE}, COUNT(*) FROM homing_jobs "
        "WHERE state NOT IN ('ready', 'running', 'done') GROUP BY 1, 2"
    ):
        _bump(out, type_, str(state), n)
    return out


def finished(
    tx: Tx, *, now: float, window: float = 3600.0, bucket: float = 60.0
) -> list[tuple[str, str, int, int]]:
    """Jobs finished within the last ``window`` seconds: (type, state, bucket index from
    the window's start, count). One pass over the finished-at index's recent end serves
    the per-type counts, the rate and the chart."""
    start = now - window
    slot = (
        "FLOOR((finished_at - ?) / ?)"
        if tx.dialect == "postgres"
        else "CAST((finished_at - ?) / ? AS INTEGER)"
    )
    rows = tx.query(
        f"SELECT type, {_SHOWN_STATE}, {slot} AS slot, COUNT(*) FROM homing_jobs "
        "WHERE finished_at >= ? GROUP BY 1, 2, 3",
        (start, bucket, start),
    )
    return [(str(t), str(st), int(sl), int(n)) for t, st, sl, n in rows]


# -- lists -------------------------------------------------------------------------------
def top_seq(tx: Tx) -> int:
    """One past the newest job's seq (the primary key's end: cheap)."""
    row = tx.query_one("SELECT MAX(seq) FROM homing_jobs")
    return int(row[0]) + 1 if row and row[0] is not None else 0


def list_jobs(
    tx: Tx,
    f: JobFilter,
    *,
    now: float,
    before_seq: int | None,
    limit: int,
    floor_seq: int | None = None,
) -> list[dict[str, Any]]:
    """Newest first, ``limit`` rows older than ``before_seq`` (keyset pagination), and
    not below ``floor_seq`` (a bounded scan for filters no index serves)."""
    where, params = _filter_sql(tx, f, now)
    if before_seq is not None:
        where += " AND seq < ?"
        params.append(before_seq)
    if floor_seq is not None:
        where += " AND seq >= ?"
        params.append(floor_seq)
    rows = tx.query(
        f"SELECT {', '.join(LIST_COLUMNS)} FROM homing_jobs WHERE {where} "
        "ORDER BY seq DESC LIMIT ?",
        (*params, limit),
    )
    out = []
    for values in rows:
        row = dict(zip(LIST_COLUMNS, values, strict=True))
        row["args"] = tx.sql.load_json(row["args"])
        out.append(row)
    return out


def count_matching(tx: Tx, f: JobFilter, *, now: float, cap: int) -> int:
    """How many jobs match, counting no further than ``cap`` (a bounded count)."""
    where, params = _filter_sql(tx, f, now)
    row = tx.query_one(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM homing_jobs WHERE {where} LIMIT ?) AS m",
        (*params, cap),
    )
    return int(row[0]) if row else 0


def matching_ids(tx: Tx, f: JobFilter, *, now: float, limit: int) -> list[str]:
    where, params = _filter_sql(tx, f, now)
    rows = tx.query(
        f"SELECT id FROM homing_jobs WHERE {where} ORDER BY seq LIMIT ?", (*params, limit)
    )
    return [str(r[0]) for r in rows]


def job_links(tx: Tx, job_id: str, *, limit: int) -> dict[str, Any]:
    """A job's place in a replace: its parent's id and type, and up to ``limit`` children
    (``limit`` 0: none looked up; no index serves that search, it reads the table)."""
    row = tx.query_one("SELECT parent_id, seq FROM homing_jobs WHERE id = ?", (job_id,))
    parent_id = row[0] if row else None
    parent = None
    if parent_id is not None:
        p = tx.query_one("SELECT id, type, state FROM homing_jobs WHERE id = ?", (parent_id,))
        parent = {"id": parent_id, "type": p[1] if p else None, "state": p[2] if p else "gone"}
    children = [
        {"id": str(i), "type": str(t), "state": str(s)}
        for i, t, s in (
            tx.query(
                "SELECT id, type, state FROM homing_jobs WHERE parent_id = ? ORDER BY seq LIMIT ?",
                (job_id, limit),
            )
            if limit
            else []
        )
    ]
    return {"parent": parent, "children": children, "seq": row[1] if row else None}


# -- operator writes ---------------------------------------------------------------------
def kill(tx: Tx, job_id: str, *, now: float, message: str) -> bool:
    """Perm-fail a job that is waiting (ready or scheduled), not one a worker holds: the
    holder's lease stays the only way to finish a running job."""
    done = (
        tx.rowcount(
            "UPDATE homing_jobs SET state = 'failed', finished_at = ?, last_error = ? "
            "WHERE id = ? AND state = 'ready'",
            (now, message, job_id),
        )
        == 1
    )
    if done:
        row = tx.query_one("SELECT attempts FROM homing_jobs WHERE id = ?", (job_id,))
        jq.add_failure(
            tx,
            job_id,
            attempt=int(row[0]) if row else 0,
            at=now,
            kind="perm_fail",
            host=None,
            pid=None,
            worker="dashboard",
            message=message,
        )
    return done


def delete_job(tx: Tx, job_id: str) -> bool:
    """Delete a job that no worker holds, with its failure history."""
    if tx.rowcount("DELETE FROM homing_jobs WHERE id = ? AND state <> 'running'", (job_id,)) != 1:
        return False
    tx.execute("DELETE FROM homing_job_failures WHERE job_id = ?", (job_id,))
    return True


def redrive_ids(tx: Tx, job_ids: list[str], *, now: float) -> int:
    """Redrive each perm-failed job of ``job_ids``; returns how many were."""
    return sum(1 for job_id in job_ids if jq.redrive(tx, job_id, now=now))
