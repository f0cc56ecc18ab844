"""The plan of SQLite's one-statement grab: a grab of one job finds its row through the
primary key by one scalar subquery, not through a list SQLite builds first (the UPDATE
runs under the write lock every process waits for; the one-job cycle ran 1.32x and 1.35x
faster so, bench/results/ab-d5a5d88-one-job-grab-eq.md)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import homing


def grab_plan(tmp_path: Path, limit: int) -> str:
    db = homing.connect(f"sqlite:///{tmp_path / 'plan.db'}")
    assert isinstance(db, homing.Database)
    try:
        db.insert_many([("t", {"n": n}) for n in range(3)])
        seen: list[str] = []
        with db.transaction() as txn:
            conn: sqlite3.Connection = txn.tx.connection
            conn.set_trace_callback(seen.append)
            try:
                assert len(db.grab_many(["t"], lock_for=30, limit=limit)) == limit
            finally:
                conn.set_trace_callback(None)
            (update,) = [s for s in seen if s.lstrip().upper().startswith("UPDATE HOMING_JOBS")]
            plan = conn.execute(f"EXPLAIN QUERY PLAN {update}").fetchall()
        return "\n".join(str(row[-1]) for row in plan)
    finally:
        db.close()


def test_a_one_job_grab_finds_its_row_by_a_scalar_subquery(tmp_path: Path) -> None:
    plan = grab_plan(tmp_path, 1)
    assert "SCALAR SUBQUERY" in plan, plan
    assert "LIST SUBQUERY" not in plan, plan


@pytest.mark.parametrize("limit", [2, 3])
def test_a_grab_of_several_jobs_takes_them_by_one_list(tmp_path: Path, limit: int) -> None:
    plan = grab_plan(tmp_path, limit)
    assert "LIST SUBQUERY" in plan, plan
