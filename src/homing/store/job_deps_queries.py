"""SQL of job dependencies (``insert(..., after=[handles])``): a dependant waits as a
ready job that is never due (``run_at`` = ``WAIT_AT``) with one ``homing_job_deps`` row
per dependency, until a sweep releases it (see ``homing.job_deps``). The rows exist only
while their job waits: an empty table is a sweep's whole cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homing.store.protocol import Tx

WAIT_AT = 1e15  # a run_at no clock reaches: the job is not due until released


def missing(tx: Tx, job_ids: Sequence[str]) -> set[str]:
    """Which of ``job_ids`` do not exist."""
    found: set[str] = set()
    for start in range(0, len(job_ids), 500):
        clause, params = tx.sql.in_list("id", job_ids[start : start + 500])
        found.update(
            str(r[0]) for r in tx.query(f"SELECT id FROM homing_jobs WHERE {clause}", params)
        )
    return set(job_ids) - found


def add(tx: Tx, rows: Sequence[tuple[str, str, float]]) -> None:
    """(job id, dependency id, run_at to give the job when it is released)."""
    tx.executemany(
        "INSERT INTO homing_job_deps (job_id, after_id, run_at) VALUES (?, ?, ?) "
        "ON CONFLICT DO NOTHING",
        rows,
    )


def waiting(tx: Tx, limit: int) -> list[dict[str, Any]]:
    """The dependency rows of up to ``limit`` waiting jobs, with both sides' states."""
    rows = tx.query(
        "SELECT d.job_id, d.after_id, d.run_at, j.state, j.run_at, p.state, p.cancelled_at "
        "FROM homing_job_deps d JOIN homing_jobs j ON j.id = d.job_id "
        "LEFT JOIN homing_jobs p ON p.id = d.after_id "
        "WHERE d.job_id IN (SELECT DISTINCT job_id FROM homing_job_deps ORDER BY job_id LIMIT ?)",
        (limit,),
    )
    names = ("job_id", "after_id", "release_at", "state", "run_at", "dep_state", "dep_cancelled")
    return [dict(zip(names, r, strict=True)) for r in rows]


def any_waiting(tx: Tx) -> bool:
    return tx.query_one("SELECT 1 FROM homing_job_deps LIMIT 1") is not None


def release(tx: Tx, job_id: str, *, run_at: float) -> bool:
    """Make a waiting job due at ``run_at``; False if it no longer waits (one sweep wins)."""
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET run_at = ?, available_at = ? "
            "WHERE id = ? AND state = 'ready' AND run_at = ?",
            (run_at, run_at, job_id, WAIT_AT),
        )
        == 1
    )


def forget(tx: Tx, job_ids: Sequence[str]) -> None:
    for start in range(0, len(job_ids), 500):
        clause, params = tx.sql.in_list("job_id", job_ids[start : start + 500])
        tx.execute(f"DELETE FROM homing_job_deps WHERE {clause}", params)
