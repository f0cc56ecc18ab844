"""Schema migrations: from empty, idempotent, concurrent, and refusing a newer schema."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

import homing
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
