"""Schema migrations: from empty, idempotent, concurrent, and refusing a newer schema."""

from __future__ import annotations

import subprocess
import sys

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


def test_newer_schema_is_refused(store_url: str) -> None:
    db = homing.connect(store_url)
    with db.store.transaction() as tx:  # type: ignore[union-attr]
        tx.execute(
            "INSERT INTO homing_migrations (component, version, name, applied_at) VALUES ('jobs', 999, 'future', 0)"
        )
    db.close()
    with pytest.raises(homing.SchemaError, match="newer than this homing knows"):
        homing.connect(store_url)
