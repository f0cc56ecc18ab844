"""PostgreSQL upkeep that runs outside transactions: building the stream index on demand
and homing's own VACUUMs, each one process at a time under an advisory lock.

Both take an autocommit connection from ``PostgresStore`` (``CREATE INDEX CONCURRENTLY``
and ``VACUUM`` refuse to run in a transaction block).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from psycopg import sql as pgsql

from homing.store.migrations.spark import STREAM_INDEX_NAME, STREAM_INDEX_POSTGRES

_log = logging.getLogger("homing.store")

VACUUM_MIN_DEAD = 1000
_VACUUM_LOCK = 0x686F6D  # "hom": the advisory-lock class of homing's own VACUUMs
_STREAM_INDEX_LOCK = 0x686F6E  # "hon": one builder of the stream index at a time
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s::int, %s::int)"
_UNLOCK = "SELECT pg_advisory_unlock(%s::int, %s::int)"

# homing's tables in the schema in use with enough dead rows and no VACUUM for a while.
# Table names come from the catalog, never from a caller.
DUE_FOR_VACUUM = (
    "SELECT schemaname, relname, relid::int FROM pg_stat_user_tables "
    "WHERE schemaname = current_schema() AND relname LIKE 'homing\\_%' "
    "AND n_dead_tup >= ? AND coalesce(greatest(last_vacuum, last_autovacuum), "
    "'-infinity') < now() - make_interval(secs => ?) ORDER BY n_dead_tup DESC"
)


def vacuum_table(conn: Any, schema: str, table: str, relid: int) -> bool:
    """VACUUM (ANALYZE) one table unless another process does it now (False)."""
    lock = (_VACUUM_LOCK, relid)
    if not conn.execute(_TRY_LOCK, lock).fetchone()[0]:
        return False
    try:
        conn.execute(
            pgsql.SQL("VACUUM (ANALYZE) {}.{}").format(
                pgsql.Identifier(schema), pgsql.Identifier(table)
            )
        )
    finally:
        conn.execute(_UNLOCK, lock)
    return True


def build_stream_index(conn: Any) -> None:
    """Build the stream index CONCURRENTLY (inserts go on meanwhile) unless it is valid;
    one process builds, the others wait for it; a build that failed half-way left an
    invalid index, which is dropped and built again."""
    if index_state(conn, STREAM_INDEX_NAME) == "valid":
        return
    if not _take_build_turn(conn, STREAM_INDEX_NAME):
        return
    try:  # under the lock, an invalid index is a failed build, not one under way
        state = index_state(conn, STREAM_INDEX_NAME)
        if state == "invalid":
            conn.execute(f"DROP INDEX CONCURRENTLY {STREAM_INDEX_NAME}")
        if state != "valid":
            _log.info("building %s (the first stream over this store)", STREAM_INDEX_NAME)
            conn.execute(
                STREAM_INDEX_POSTGRES.replace(
                    "CREATE INDEX", "CREATE INDEX CONCURRENTLY IF NOT EXISTS"
                )
            )
    finally:
        conn.execute(_UNLOCK, (_STREAM_INDEX_LOCK, 0))


def _take_build_turn(conn: Any, name: str) -> bool:
    """Take the stream index's build lock, or wait until another process has built it
    (False). Tried, never waited for in a statement: a session blocked in
    ``pg_advisory_lock`` holds a snapshot, ``CREATE INDEX CONCURRENTLY`` in the holder's
    session waits for every older snapshot to end, and the server ends the cycle by
    failing one of them (DeadlockDetected, seen with four processes starting at once).
    Each try is its own short transaction (autocommit), which the build waits out. No
    deadline: a build takes as long as the table needs, and a holder that dies releases
    the lock with its session."""
    pause, told = 0.02, False
    while True:
        if conn.execute(_TRY_LOCK, (_STREAM_INDEX_LOCK, 0)).fetchone()[0]:
            return True
        if index_state(conn, name) == "valid":
            return False
        if not told:
            _log.info("waiting for another process to build %s", name)
            told = True
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def index_state(conn: Any, name: str) -> str:
    """ "valid", "invalid" (a CONCURRENTLY build that failed or is under way) or "missing"
    for an index of the schema in use."""
    row = conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
    ).fetchone()
    if row is None:
        return "missing"
    return "valid" if row[0] else "invalid"
