"""The stream index is built on demand: a store no Spark stream reads does without it (every
job would write an entry into it), the first stream builds it, once, whatever the number
of processes that start at the same time, and a half-built one is built again."""

from __future__ import annotations

import subprocess
import sys

import pytest

import homing
from homing.errors import ConfigurationError
from homing.store.migrations import (
    COMPONENTS,
    applied_versions,
    apply_migrations,
    component_migrations,
)
from homing.store.migrations.spark import STREAM_INDEX_NAME
from homing.store.protocol import Store


def _index_state(store: Store) -> str:
    with store.transaction(write=False) as tx:
        if tx.dialect == "sqlite":
            row = tx.query_one(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
                (STREAM_INDEX_NAME,),
            )
            return "missing" if row is None else "valid"
        row = tx.query_one(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(?)",
            (STREAM_INDEX_NAME,),
        )
    if row is None:
        return "missing"
    return "valid" if row[0] else "invalid"


def test_a_new_store_has_no_stream_index_until_a_stream_asks(store_url: str) -> None:
    db = homing.connect(store_url)
    assert _index_state(db.store) == "missing"  # type: ignore[arg-type]
    db.insert("t", {"i": 1})
    db.store.ensure_stream_index()  # type: ignore[union-attr]
    assert _index_state(db.store) == "valid"  # type: ignore[arg-type]
    db.store.ensure_stream_index()  # type: ignore[union-attr]  # a no-op the second time
    db.close()
    other = homing.connect(store_url)  # another process's view: finds it, builds nothing
    other.store.ensure_stream_index()  # type: ignore[union-attr]
    assert _index_state(other.store) == "valid"  # type: ignore[arg-type]
    other.close()


def test_an_upgraded_store_loses_the_index_and_a_stream_builds_it_again(store_url: str) -> None:
    """Version 1 of the spark schema built the index with the table; version 2 drops it."""
    db = homing.connect(store_url, migrate=False)
    store = db.store
    assert applied_versions(store) == {}  # type: ignore[arg-type]  # makes the ledger
    # Every component up to date but spark's version 2, as an older homing left the store.
    with store.transaction() as tx:  # type: ignore[union-attr]
        for component in COMPONENTS:
            migrations = component_migrations(component)
            if component == "spark":
                migrations = migrations[:1]
            for m in migrations:
                for statement in m.sqlite if tx.dialect == "sqlite" else m.postgres:
                    tx.execute(statement)
                tx.execute(
                    "INSERT INTO homing_migrations (component, version, name, applied_at) "
                    "VALUES (?, ?, ?, 0)",
                    (component, m.version, m.name),
                )
    assert _index_state(store) == "valid"  # type: ignore[arg-type]
    assert apply_migrations(store) == ["spark:0002_stream_index_on_demand"]  # type: ignore[arg-type]
    assert _index_state(store) == "missing"  # type: ignore[arg-type]
    store.ensure_stream_index()  # type: ignore[union-attr]
    assert _index_state(store) == "valid"  # type: ignore[arg-type]
    db.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_half_built_index_is_dropped_and_built_again(store_url: str) -> None:
    """A CONCURRENTLY build that failed leaves an invalid index behind, which IF NOT EXISTS
    would take for done; a stream over it would read through a scan forever."""
    db = homing.connect(store_url)
    db.store.ensure_stream_index()  # type: ignore[union-attr]
    with db.store.transaction() as tx:  # type: ignore[union-attr]
        tx.execute(  # what a cancelled CREATE INDEX CONCURRENTLY leaves
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(?)",
            (STREAM_INDEX_NAME,),
        )
    db.close()
    assert _index_state(homing.connect(store_url).store) == "invalid"  # type: ignore[arg-type]
    again = homing.connect(store_url)
    again.store.ensure_stream_index()  # type: ignore[union-attr]
    assert _index_state(again.store) == "valid"  # type: ignore[arg-type]
    again.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_building_inside_a_transaction_is_refused(store_url: str) -> None:
    db = homing.connect(store_url)
    with pytest.raises(ConfigurationError, match="inside a transaction"):
        with db.store.transaction():  # type: ignore[union-attr]
            db.store.ensure_stream_index()  # type: ignore[union-attr]
    assert _index_state(db.store) == "missing"  # type: ignore[arg-type]
    db.close()


def test_processes_starting_streams_at_once_build_it_once(store_url: str) -> None:
    homing.connect(store_url).close()  # migrated before the race
    code = "import sys, homing; homing.connect(sys.argv[1]).store.ensure_stream_index()"
    procs = [subprocess.Popen([sys.executable, "-c", code, store_url]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    db = homing.connect(store_url)
    assert _index_state(db.store) == "valid"  # type: ignore[arg-type]
    db.close()
