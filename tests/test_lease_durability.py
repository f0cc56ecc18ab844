"""A lease (grab, extension) commits without waiting for the disk; nothing else does.

The danger of the optimisation is a durable write (an insert, a completion) that runs with
the lease's setting. These tests read the setting each kind of statement runs with."""

from __future__ import annotations

import pytest

import homing
from homing.ids import uuid7


def _sync_setting(db: homing.Database, *, durable: bool) -> str:
    with db.store.statement(durable=durable) as tx:
        if db.store.dialect == "postgres":
            row = tx.query_one("SELECT current_setting('synchronous_commit')")
        else:
            row = tx.query_one("PRAGMA synchronous")
    assert row is not None
    return {"0": "off", "1": "normal", "2": "full", "3": "extra"}.get(str(row[0]), str(row[0]))


def test_only_leases_skip_the_flush(db: homing.Database, backend: str) -> None:
    durable = "on" if backend == "postgres" else "full"
    lease = "off" if backend == "postgres" else "normal"
    for _ in range(3):  # alternating, on the connections the pools hand out again
        assert _sync_setting(db, durable=False) == lease
        assert _sync_setting(db, durable=True) == durable
        with db.store.transaction() as tx:
            if backend == "postgres":
                row = tx.query_one("SELECT current_setting('synchronous_commit')")
            else:
                row = tx.query_one("PRAGMA synchronous")
        assert str(row[0]) in ("on", "2")  # type: ignore[index]


def test_a_failed_lease_statement_leaves_the_connection_durable(
    db: homing.Database, backend: str
) -> None:
    with pytest.raises(RuntimeError):
        with db.store.statement(durable=False):
            raise RuntimeError("the grab failed")
    durable = "on" if backend == "postgres" else "full"
    assert _sync_setting(db, durable=True) == durable


def test_grab_and_complete_keep_exactly_once(db: homing.Database) -> None:
    handles = db.insert_many([("job", {"i": i}) for i in range(20)])
    jobs = db.grab_many("job", lock_for=30, limit=20)
    assert sorted(j.id for j in jobs) == sorted(handles)
    db.complete_many(jobs)
    assert {db.details(h).state for h in handles} == {"done"}


def test_a_store_opened_not_durable_stays_so(stores: object, backend: str) -> None:
    db = homing.connect(stores.url("soft"), durable=False)  # type: ignore[attr-defined]
    try:
        expected = "off" if backend == "postgres" else "off"
        assert _sync_setting(db, durable=True) == expected  # type: ignore[arg-type]
        assert _sync_setting(db, durable=False) == expected  # type: ignore[arg-type]
    finally:
        db.close()


def test_a_lease_after_close_is_refused(stores: object) -> None:
    db = homing.connect(stores.url("closed"))  # type: ignore[attr-defined]
    db.close()
    with pytest.raises(homing.StoreUnavailable):
        db.grab("job", lock_for=5)


@pytest.mark.parametrize("backend", ["postgres"])  # plans are PostgreSQL's
def test_a_one_job_grab_is_planned_once_not_at_every_call(db: homing.Database) -> None:
    """The grab is one large statement; for a grab of one job the server judged each
    custom plan cheaper than the generic one and planned it again at every call (four
    times the statement's own run). The lease sessions keep one generic plan; the main
    pool, where the application's own statements run too, keeps the server's default."""
    db.insert_many([("t", {"i": i}) for i in range(30)])
    with db.store.statement(durable=False) as tx:  # the grabs below join this session
        for _ in range(40):
            jobs = db.grab_many("t", lock_for=30, limit=1)
            if jobs:
                db.complete(jobs[0])
        rows = tx.query(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%homing_job_failures%'"
        )
    assert rows and sum(r[1] for r in rows) == 0 and sum(r[0] for r in rows) >= 30, rows
    with db.store.statement(durable=True) as tx:
        row = tx.query_one("SELECT current_setting('plan_cache_mode')")
    assert row is not None and row[0] == "auto"


@pytest.mark.parametrize("backend", ["postgres"])  # plans are PostgreSQL's
def test_the_generic_plan_of_a_grab_reads_no_table_whole(db: homing.Database) -> None:
    """A generic plan does not know the grab's limit (the planner guesses a tenth of the
    candidates): with 20,000 staged jobs waiting it hashed all of homing_jobs to lease 10
    of them (25 ms a grab; the lease sessions use generic plans). The lease joins its
    picks by key, so the plan must not scan homing_jobs."""
    import psycopg

    from homing.store import jobs_queries as q

    now = db.clock.now()
    with db.store.transaction() as tx:
        q.open_batch(tx, "big", now=now)
        tx.execute(
            "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, created_at, "
            "batch_id) SELECT gen_random_uuid(), 'kid', '{}'::jsonb, 'ready', ?, ?, ?, "
            "'big' FROM generate_series(1, 20000)",
            (now, now, now),
        )
        q.commit_batch(tx, "big", now=now)
        tx.execute("ANALYZE homing_jobs")

    prepared, values = _prepared_grab(db, "kid", now=now + 1, limit=10)
    conninfo = db.store._listen_conninfo  # type: ignore[attr-defined]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE grab AS {prepared}")
        args = ", ".join(psycopg.sql.Literal(p).as_string(conn) for p in values)
        plan = "\n".join(
            str(r[0]) for r in conn.execute(f"EXPLAIN EXECUTE grab({args})").fetchall()
        )
    assert "Seq Scan on homing_jobs" not in plan, plan


def _prepared_grab(
    db: homing.Database, job_type: str, *, now: float, limit: int
) -> tuple[str, list[object]]:
    """The grab statement the job API sends, with $n placeholders for PREPARE, and its
    parameters."""
    import time as _time

    from homing.store import holders_queries as hq
    from homing.store import jobs_queries as q

    class Capture:
        def __init__(self, tx: object) -> None:
            self.real = tx
            self.sql, self.store, self.dialect = tx.sql, tx.store, tx.dialect  # type: ignore[attr-defined]
            self.statements: list[tuple[str, list[object]]] = []

        def query(self, sql: str, params: object = ()) -> list[object]:
            self.statements.append((self.real._sql(sql), list(params)))  # type: ignore[attr-defined,call-overload]
            return []

        execute = query

    with db.store.transaction() as tx:
        holder = hq.register_holder(tx, "h", 1, "w", now=_time.time())
        cap = Capture(tx)
        lease = q.Lease(uuid7(), _time.time() + 60, holder)
        q.grab_jobs(cap, [job_type], now=now, lease=lease, limit=limit, where=None)  # type: ignore[arg-type]
    sql, params = cap.statements[0]
    numbered = sql.split("%s")
    prepared = "".join(f"{part}${i}" for i, part in enumerate(numbered[:-1], 1)) + numbered[-1]
    return prepared, params


@pytest.mark.parametrize("backend", ["postgres"])  # JIT is PostgreSQL's
def test_no_grab_is_jit_compiled_however_big_the_backlog_looks(
    db: homing.Database, store_url: str
) -> None:
    """With statistics that know a large backlog the grab's generic plan is estimated far
    above jit_above_cost, and the server JIT-compiled it at every execution (739-910 ms a
    grab, bench/results/jit-auto-explain.txt). homing's sessions run with jit off; a URL
    that sets jit itself keeps its own."""
    import psycopg

    now = db.clock.now()
    with db.store.transaction() as tx:
        tx.execute(
            "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, created_at) "
            "SELECT gen_random_uuid(), 'big', '{}'::jsonb, 'ready', ?, ?, ? "
            "FROM generate_series(1, 100000)",
            (now, now, now),
        )
        tx.execute("ANALYZE homing_jobs")
    prepared, values = _prepared_grab(db, "big", now=now + 1, limit=100)
    for durable in (True, False):  # the main pool and the lease pool
        with db.store.statement(durable=durable) as tx:
            row = tx.query_one("SELECT current_setting('jit'), current_setting('jit_above_cost')")
            assert row is not None and row[0] == "off", row
            above = float(row[1])
    with psycopg.connect(db.store._listen_conninfo, autocommit=True) as conn:  # type: ignore[attr-defined]
        assert conn.execute("SHOW jit").fetchone() == ("off",)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE grab AS {prepared}")
        args = ", ".join(psycopg.sql.Literal(p).as_string(conn) for p in values)
        with conn.transaction(force_rollback=True):
            plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE grab({args})").fetchone()
        top = plan[0][0]  # type: ignore[index]
        # the estimate that would have had the server compile it (so this test can fail)
        assert top["Plan"]["Total Cost"] > above, top["Plan"]["Total Cost"]
        assert "JIT" not in top, top["JIT"]
        assert top["Plan"]["Actual Rows"] == 100
    with homing.connect(
        store_url + ("&" if "?" in store_url else "?") + "options=-c%20jit%3Don"
    ) as own:
        with own.store.statement() as tx:
            assert tx.query_one("SELECT current_setting('jit')") == ("on",)
