"""Versioned schema migrations, one ordered list per component.

Each component (``jobs``, ``engine``, ``http``, ``messenger``, ``sessions``, ``spark``)
owns a module here with ``MIGRATIONS: list[Migration]``; versions start at 1 and only
grow. ``homing_migrations`` records what was applied. Migrations run in a transaction each,
serialised between processes (SQLite's write lock, a PostgreSQL advisory lock), so many
workers starting at once apply each migration exactly once.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from homing.errors import SchemaError, StoreUnavailable
from homing.store.protocol import Store

COMPONENTS = ("jobs", "engine", "http", "messenger", "sessions", "spark", "dashboard")
_ADVISORY_LOCK_KEY = 0x686F6D696E67  # "homing"


@dataclass(frozen=True)
class Migration:
    """One schema step; ``sqlite`` and ``postgres`` are lists of statements."""

    version: int
    name: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


def component_migrations(component: str) -> list[Migration]:
    module = importlib.import_module(f"homing.store.migrations.{component}")
    migrations: list[Migration] = list(module.MIGRATIONS)
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise SchemaError(f"migrations of {component} are not numbered 1..n: {versions}")
    return migrations


_LEDGER = {
    "sqlite": "CREATE TABLE IF NOT EXISTS homing_migrations (component TEXT NOT NULL, "
    "version INTEGER NOT NULL, name TEXT NOT NULL, applied_at REAL NOT NULL, "
    "PRIMARY KEY (component, version))",
    "postgres": "CREATE TABLE IF NOT EXISTS homing_migrations (component TEXT NOT NULL, "
    "version INTEGER NOT NULL, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (component, version))",
}


def applied_versions(store: Store) -> dict[str, int]:
    with store.transaction() as tx:
        tx.execute(_LEDGER[tx.dialect])
        rows = tx.query("SELECT component, MAX(version) FROM homing_migrations GROUP BY component")
    return {str(c): int(v) for c, v in rows}


def _up_to_date(store: Store) -> bool:
    """A cheap read of the ledger, so that processes starting on a migrated store take no
    lock and run no DDL. Any doubt (no ledger yet, an error) means "not up to date"."""
    wanted = {c: len(component_migrations(c)) for c in COMPONENTS}
    try:
        with store.transaction(write=False) as tx:
            rows = tx.query(
                "SELECT component, MAX(version) FROM homing_migrations GROUP BY component"
            )
    except StoreUnavailable:  # no server: say so now, not after a second wait
        raise
    except Exception:  # the ledger table does not exist yet, or similar
        return False
    have = {str(c): int(v) for c, v in rows}
    return all(have.get(c, 0) == n for c, n in wanted.items())


def apply_migrations(store: Store) -> list[str]:
    """Bring the schema up to date; refuse a schema newer than this code knows."""
    if _up_to_date(store):
        return []
    applied: list[str] = []
    with store.transaction() as tx:
        tx.sql.advisory_lock(tx, _ADVISORY_LOCK_KEY)  # one migrator at a time
        tx.execute(_LEDGER[tx.dialect])
        current = {
            str(c): int(v)
            for c, v in tx.query(
                "SELECT component, MAX(version) FROM homing_migrations GROUP BY component"
            )
        }
        for component in COMPONENTS:
            migrations = component_migrations(component)
            have = current.get(component, 0)
            if have > len(migrations):
                raise SchemaError(
                    f"the database's {component} schema is at version {have}, newer than this "
                    f"homing knows ({len(migrations)}); upgrade homing before using this database"
                )
            for m in migrations[have:]:
                for statement in m.sqlite if tx.dialect == "sqlite" else m.postgres:
                    tx.execute(statement)
                tx.execute(
                    "INSERT INTO homing_migrations (component, version, name, applied_at) "
                    "VALUES (?, ?, ?, ?)",
                    (component, m.version, m.name, store.clock.now()),
                )
                applied.append(f"{component}:{m.version:04d}_{m.name}")
    return applied
