"""Schema migrations: from empty, idempotent, concurrent, and refusing a newer schema."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

import homing
from homing.ids import job_uuid
from homing.store import holders_queries as hq
from homing.store import jobs_queries as q
from homing.store import spark_queries as sq
from homing.store.migrations import COMPONENTS, applied_versions, component_migrations


def test_migrate_from_empty_then_nothing_to_do(store_url: str) -> None:
    db = homing.connect(store_url, migrate=False)
    applied = db.migrate()
    assert applied and applied[0].startswith("jobs:0001")
    assert db.migrate() == []
    versions = applied_versions(db.store)  # type: ignore[union-attr]
    for component in COMPONENTS:
        assert versions.get(component, 0) == len(component_migrations(component))
    db.close()


def test_concurrent_migrators_apply_each_step_once(store_url: str) -> None:
    code = "import sys, homing; homing.connect(sys.argv[1]).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, store_url]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    db = homing.connect(store_url)
    with db.store.transaction() as tx:  # type: ignore[union-attr]
        rows = tx.query(
            "SELECT component, version, COUNT(*) FROM homing_migrations GROUP BY component, version"
        )
    assert rows and all(n == 1 for _, _, n in rows)
    db.close()


def _open_at_the_barrier(path: str, barrier: object, failures: object) -> None:
    from homing.store.sqlite import SQLiteStore

    store = SQLiteStore(f"sqlite:///{path}")
    barrier.wait()  # type: ignore[attr-defined]
    try:
        with store.transaction() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS opened (pid INTEGER)")
            tx.execute("INSERT INTO opened (pid) VALUES (?)", (1,))
    except Exception as exc:  # the test counts every kind of failure
        with failures.get_lock():  # type: ignore[attr-defined]
            failures.value += 1  # type: ignore[attr-defined]
        print(f"open failed: {exc}", file=sys.stderr)
    finally:
        store.close()


def test_processes_opening_a_new_sqlite_file_at_once_all_get_in(tmp_path: Path) -> None:
    """Switching a new file to WAL can fail with "database is locked" whatever the busy
    timeout; every opener must wait its turn instead (CI once failed on it)."""
    ctx = multiprocessing.get_context("fork")
    failures = ctx.Value("i", 0)
    for round_ in range(12):
        path = tmp_path / f"new-{round_}.db"
        barrier = ctx.Barrier(8)
        procs = [
            ctx.Process(target=_open_at_the_barrier, args=(str(path), barrier, failures))
            for _ in range(8)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * 8
    assert failures.value == 0


def test_newer_schema_is_refused(store_url: str) -> None:
    db = homing.connect(store_url)
    with db.store.transaction() as tx:  # type: ignore[union-attr]
        tx.execute(
            "INSERT INTO homing_migrations (component, version, name, applied_at) VALUES ('jobs', 999, 'future', 0)"
        )
    db.close()
    with pytest.raises(homing.SchemaError, match="newer than this homing knows"):
        homing.connect(store_url)


def _lease_in_the_job_row(
    tx: object,
    job_id: str,
    token: str,
    *,
    until: float,
    holder: tuple[str, int, str] = ("h", 1, "h:1:w"),
) -> None:
    """Lease a job as versions 1-8 of the jobs schema did: the holder in the job's row."""
    tx.execute(  # type: ignore[attr-defined]
        "UPDATE homing_jobs SET state = 'running', attempts = attempts + 1, lease_token = ?, "
        "lease_expires_at = ?, available_at = ?, holder_host = ?, holder_pid = ?, "
        "holder_worker = ? WHERE id = ?",
        (token, until, until, *holder, job_id),
    )


def test_a_store_of_text_ids_carries_its_jobs_leases_and_history_into_native_uuids(
    stores: object, clock: homing.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jobs version 8 (PostgreSQL: ids and lease tokens become uuid columns): a store made
    at version 7 keeps every job, a lease taken before the upgrade can still be completed
    with its token, and the failure history and dependencies still name their jobs."""
    from homing.store.migrations import jobs as job_schema

    url = stores.url()  # type: ignore[attr-defined]
    monkeypatch.setattr(job_schema, "MIGRATIONS", job_schema.MIGRATIONS[:7])
    old = homing.connect(url, clock=clock)
    first = old.insert("m8", {"n": 1})
    old.insert("m8", {"n": 2}, after=[first])
    retried = old.insert("m8_retry", {"n": 3})
    token = homing.uuid7()
    with old.store.transaction() as tx:  # type: ignore[union-attr]
        # A lease and a retry as version 7's code wrote them (the holder in the job row;
        # today's grab writes a holder id that version 7 has no column for).
        _lease_in_the_job_row(tx, first, token, until=clock.now() + 60)
        tx.execute(
            "UPDATE homing_jobs SET attempts = 1, last_error = 'boom' WHERE id = ?", (retried,)
        )
        q.add_failure(
            tx, retried, attempt=1, at=clock.now(), kind="error", host="h", pid=1,
            worker="h:1:w", message="boom",
        )  # fmt: skip
        # a Spark sink's idColumn could store any string as an id (and as a parent id)
        args = "?::jsonb" if tx.dialect == "postgres" else "?"
        for job_id, parent in (("legacy-7", None), (homing.uuid7(), "legacy-7")):
            tx.execute(
                "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, "
                f"created_at, parent_id) VALUES (?, 'm8_legacy', {args}, 'ready', ?, ?, ?, ?)",
                (job_id, "{}", clock.now(), clock.now(), clock.now(), parent),
            )
    old.close()
    monkeypatch.undo()

    new = homing.connect(url, clock=clock)
    with new.store.transaction() as tx:  # type: ignore[union-attr]
        assert tx.query_one(
            "SELECT 1 FROM homing_migrations WHERE component = 'jobs' AND version = 8"
        )
        if tx.dialect == "postgres":
            types = dict(
                tx.query(
                    "SELECT table_name || '.' || column_name, data_type "
                    "FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND column_name IN ('id', 'lease_token', 'job_id', 'after_id') "
                    "AND table_name IN ('homing_jobs', 'homing_job_failures', 'homing_job_deps')"
                )
            )
            assert set(types.values()) == {"uuid"}, types
            assert len(types) == 5, types
    new.complete(first, lease_token=token)  # the lease outlived the upgrade
    assert new.details(first).state == "done"
    history = new.details(retried).failures
    assert [f.message for f in history] == ["boom"]
    new.release_waiting()
    got = sorted(j.args["n"] for j in new.grab_many(["m8", "m8_retry"], lock_for=60, limit=10))
    assert got == [2, 3]  # the dependent job was released when its dependency finished

    legacy = job_uuid("legacy-7")
    assert new.details(legacy).type == "m8_legacy"
    assert len(new.cancel_children(legacy)) == 1  # its child still names it
    with new.store.transaction() as tx:  # type: ignore[union-attr]
        sq.open_batch(tx, "rerun", now=clock.now(), info="test")
        sq.stage_jobs(tx, "rerun", [sq.StagedJob("legacy-7", "m8_legacy", "{}", 0, 0, None)], now=0)
        sq.publish(tx, "rerun", sink="test", label="rerun", now=clock.now())
        count = tx.query_one("SELECT count(*) FROM homing_jobs WHERE type = 'm8_legacy'")
    assert count is not None and count[0] == 2  # the sink's rerun found the row it wrote
    new.close()


def test_leases_held_before_the_holder_registry_keep_their_holders(
    stores: object, clock: homing.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jobs version 9 (the holder moves from the job row into homing_holders): a running
    job keeps its holder (details, a takeover's history entry, a worker's search for its
    dead predecessors), its lease can still be completed, and the row's columns are gone."""
    from homing.store.migrations import jobs as job_schema

    url = stores.url()  # type: ignore[attr-defined]
    monkeypatch.setattr(job_schema, "MIGRATIONS", job_schema.MIGRATIONS[:8])
    old = homing.connect(url, clock=clock)
    held, expiring, waiting = (old.insert("m9", {"n": n}) for n in range(3))
    tokens = {held: homing.uuid7(), expiring: homing.uuid7()}
    with old.store.transaction() as tx:  # type: ignore[union-attr]
        _lease_in_the_job_row(
            tx, held, tokens[held], until=clock.now() + 600, holder=("box", 41, "box:41:w1")
        )
        _lease_in_the_job_row(
            tx, expiring, tokens[expiring], until=clock.now() + 5, holder=("box", 42, "box:42:w2")
        )
    old.close()
    monkeypatch.undo()

    new = homing.connect(url, clock=clock)
    with new.store.transaction() as tx:  # type: ignore[union-attr]
        columns = {
            str(r[0])
            for r in (
                tx.query(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = 'homing_jobs'"
                )
                if tx.dialect == "postgres"
                else tx.query("SELECT name FROM pragma_table_info('homing_jobs')")
            )
        }
        assert "holder_id" in columns and not {c for c in columns if c.startswith("holder_h")}
        assert sorted(hq.leases_on_host(tx, "box")) == sorted(
            [(held, tokens[held], 41, "box:41:w1"), (expiring, tokens[expiring], 42, "box:42:w2")]
        )
    holder = new.details(held).holder
    assert holder is not None and (holder.host, holder.pid, holder.worker) == (
        "box",
        41,
        "box:41:w1",
    )
    assert new.details(waiting).holder is None

    clock.advance(10)  # the second lease expires: a grab takes it over and says from whom
    taken = new.grab_many(["m9"], lock_for=60, limit=3)
    assert sorted(j.handle for j in taken) == sorted([expiring, waiting])
    (entry,) = new.details(expiring).failures
    assert (entry.kind, entry.host, entry.pid, entry.worker) == (
        "lease_expired",
        "box",
        42,
        "box:42:w2",
    )
    new.complete(held, lease_token=tokens[held])  # the lease outlived the upgrade
    assert new.details(held).state == "done"
    new.close()
