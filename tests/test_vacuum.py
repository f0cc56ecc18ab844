"""homing's own VACUUM where the server has none (PostgreSQL with autovacuum off): the dead
index entries of finished jobs would otherwise slow every grab for good."""

from __future__ import annotations

import logging
import time

import psycopg
import pytest

import homing
from homing.store.postgres_upkeep import VACUUM_MIN_DEAD


def _autovacuum_off(db: homing.Database) -> bool:
    with db.store.transaction(write=False) as tx:
        row = tx.query_one("SELECT current_setting('autovacuum')")
    return row is not None and str(row[0]).lower() in ("off", "false", "0")


def _make_dead_rows(db: homing.Database, n: int) -> None:
    db.insert_many([("noop", {"i": i}) for i in range(n)])
    with db.store.transaction() as tx:
        tx.execute("DELETE FROM homing_jobs")
        if db.store.dialect == "postgres":  # the statistics of the deletes, when idle
            tx.execute("SELECT pg_stat_force_next_flush()")


def _vacuum_once_the_statistics_show(db: homing.Database, every: float) -> list[str]:
    # The statistics of the deletes arrive once that session is idle.
    deadline = time.monotonic() + 20
    while True:
        tables = db.store.vacuum_if_due(every)
        if tables or time.monotonic() > deadline:
            return tables
        time.sleep(0.5)


def test_dead_rows_are_vacuumed_once_per_interval(db: homing.Database, backend: str) -> None:
    _make_dead_rows(db, VACUUM_MIN_DEAD + 200)
    if backend == "sqlite" or not _autovacuum_off(db):
        assert db.store.vacuum_if_due(0) == []  # SQLite, or the server does it
        return
    assert _vacuum_once_the_statistics_show(db, 3600) == ["homing_jobs"]
    with db.store.transaction(write=False) as tx:
        dead, vacuumed = tx.query_one(
            "SELECT n_dead_tup, last_vacuum IS NOT NULL FROM pg_stat_user_tables "
            "WHERE relid = 'homing_jobs'::regclass"
        ) or (None, None)
    assert vacuumed is True and dead == 0
    _make_dead_rows(db, VACUUM_MIN_DEAD + 200)
    time.sleep(1.5)
    assert db.store.vacuum_if_due(3600) == []  # vacuumed within the hour: not again


def _dead_rows(db: homing.Database) -> int:
    with db.store.transaction(write=False) as tx:
        row = tx.query_one(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'homing_jobs'::regclass"
        )
    return int(row[0]) if row else 0


ONLY_POSTGRES = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


@ONLY_POSTGRES
def test_a_table_another_process_vacuums_is_skipped(db: homing.Database) -> None:
    # vacuum_tables is what vacuum_if_due runs when autovacuum is off; called directly so
    # that the test runs whatever the server's setting
    _make_dead_rows(db, VACUUM_MIN_DEAD + 200)
    deadline = time.monotonic() + 20
    while _dead_rows(db) < VACUUM_MIN_DEAD and time.monotonic() < deadline:
        time.sleep(0.2)  # the statistics of the deletes
    assert _dead_rows(db) >= VACUUM_MIN_DEAD
    store = db.store
    with store.transaction(write=False) as tx:
        relid = tx.query_one("SELECT 'homing_jobs'::regclass::oid::int")[0]  # type: ignore[index]
    other = psycopg.connect(store.conninfo, autocommit=True)  # type: ignore[union-attr]
    try:
        other.execute("SELECT pg_advisory_lock(%s::int, %s::int)", (0x686F6D, relid))
        assert store.vacuum_tables(0) == []  # type: ignore[attr-defined]
        other.execute("SELECT pg_advisory_unlock(%s::int, %s::int)", (0x686F6D, relid))
        assert store.vacuum_tables(0) == ["homing_jobs"]  # type: ignore[attr-defined]
    finally:
        other.close()


@ONLY_POSTGRES
def test_the_worker_vacuums_where_autovacuum_is_off(
    db: homing.Database, caplog: pytest.LogCaptureFixture
) -> None:
    off = _autovacuum_off(db)
    app = homing.App(db)

    @app.job("noop")
    def noop(job: homing.Job, ctx: object) -> None:
        pass

    _make_dead_rows(db, VACUUM_MIN_DEAD + 200)
    caplog.set_level(logging.INFO, logger="homing.worker")
    w = app.worker(db=db, vacuum_every=0.5, gc_every=0)
    w.start()
    try:
        # off: wait for the vacuum; on: give the worker the same chances to (wrongly) do one
        deadline = time.monotonic() + (25 if off else 3)
        while time.monotonic() < deadline and "vacuum: homing_jobs" not in caplog.text:
            time.sleep(0.2)
    finally:
        w.stop()
    assert ("autovacuum is off" in caplog.text) is off
    assert ("vacuum: homing_jobs" in caplog.text) is off
