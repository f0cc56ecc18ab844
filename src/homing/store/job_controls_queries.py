"""SQL of the job features of issue 16: cancel, per-type controls (pause, concurrency and
rate limits, per-key concurrency), per-job timeouts and periodic schedules.

Kept apart from ``jobs_queries`` (the hot path of insert / grab / complete): nothing here
runs on a grab unless a job type has a control set.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from homing.store.protocol import Tx

CONTROL_COLUMNS = (
    "type",
    "paused",
    "max_running",
    "rate_limit",
    "rate_per",
    "key_field",
    "key_limit",
)
_LIMIT_LOCK_BASE = 0x686F6D6C << 32  # "homl": serialises the limited grabs of one type


# -- cancel ------------------------------------------------------------------------------
def cancel(tx: Tx, job_id: str, *, now: float, message: str) -> str | None:
    """Cancel a ready or running job; return the state it was in ('cancelled' if it was
    cancelled already), or None if it does not exist. A done or perm-failed job is left as
    it is and its state returned ('done' / 'failed')."""
    row = tx.query_one(
        f"SELECT state, cancelled_at FROM homing_jobs WHERE id = ?{tx.sql.lock_rows}",
        (job_id,),
    )
    if row is None:
        return None
    state, cancelled_at = str(row[0]), row[1]
    if cancelled_at is not None:
        return "cancelled"
    if state not in ("ready", "running"):
        return state
    changed = tx.rowcount(
        "UPDATE homing_jobs SET state = 'failed', cancelled_at = ?, finished_at = ?, "
        "last_error = ?, lease_expires_at = NULL WHERE id = ? AND state = ?",
        (now, now, message, job_id, state),
    )
    return state if changed == 1 else cancel(tx, job_id, now=now, message=message)


def cancel_children(tx: Tx, parent_id: str, *, now: float, message: str) -> list[str]:
    """Cancel every ready or running child of ``parent_id``; the ids cancelled."""
    rows = tx.query(
        "UPDATE homing_jobs SET state = 'failed', cancelled_at = ?, finished_at = ?, "
        "last_error = ?, lease_expires_at = NULL "
        "WHERE parent_id = ? AND state IN ('ready', 'running') RETURNING id",
        (now, now, message, parent_id),
    )
    return [str(r[0]) for r in rows]


def cancelled_among(tx: Tx, job_ids: Sequence[str]) -> set[str]:
    """Which of ``job_ids`` were cancelled (a worker asks this of the jobs it holds)."""
    found: set[str] = set()
    for start in range(0, len(job_ids), 500):
        clause, params = tx.sql.in_list("id", job_ids[start : start + 500])
        rows = tx.query(
            f"SELECT id FROM homing_jobs WHERE {clause} AND cancelled_at IS NOT NULL", params
        )
        found.update(str(r[0]) for r in rows)
    return found


# -- timeouts ----------------------------------------------------------------------------
def set_timeouts(tx: Tx, pairs: Sequence[tuple[str, float]]) -> None:
    """Record the per-job timeout of jobs just inserted (id, seconds)."""
    tx.executemany("UPDATE homing_jobs SET timeout_s = ? WHERE id = ?", [(s, i) for i, s in pairs])


# -- per-type controls -------------------------------------------------------------------
def read_controls(tx: Tx) -> list[dict[str, Any]]:
    rows = tx.query(f"SELECT {', '.join(CONTROL_COLUMNS)} FROM homing_job_types ORDER BY type")
    return [dict(zip(CONTROL_COLUMNS, r, strict=True)) for r in rows]


def write_control(tx: Tx, type_: str, fields: dict[str, Any], *, now: float) -> None:
    """Create the type's control row if needed, then set ``fields`` (column -> value)."""
    tx.execute(
        "INSERT INTO homing_job_types (type, updated_at) VALUES (?, ?) "
        "ON CONFLICT (type) DO NOTHING",
        (type_, now),
    )
    sets = ", ".join(f"{c} = ?" for c in fields if c in CONTROL_COLUMNS[1:])
    assert len(fields) == sets.count("?"), f"unknown control column in {sorted(fields)}"
    tx.execute(
        f"UPDATE homing_job_types SET {sets}, updated_at = ? WHERE type = ?",
        (*fields.values(), now, type_),
    )
    # a row with nothing set is no control at all: keep the grabbers' cached set small
    tx.execute(
        "DELETE FROM homing_job_types WHERE type = ? AND paused = 0 AND max_running IS NULL "
        "AND rate_limit IS NULL AND key_field IS NULL",
        (type_,),
    )


def lock_type(tx: Tx, type_: str) -> None:
    """Serialise the limited grabs of one type until the transaction ends."""
    tx.sql.advisory_lock(tx, _LIMIT_LOCK_BASE | zlib.crc32(type_.encode()))


def running_count(tx: Tx, type_: str, *, now: float) -> int:
    """Jobs of the type held under a live lease (an expired lease's job counts as free:
    its holder is presumed dead, and the next grab may take it over)."""
    row = tx.query_one(
        "SELECT COUNT(*) FROM homing_jobs WHERE type = ? AND state = 'running' "
        "AND lease_expires_at > ?",
        (type_, now),
    )
    return int(row[0]) if row else 0


def saturated_keys(tx: Tx, type_: str, field: str, limit: int, *, now: float) -> list[Any]:
    """Values of ``args.<field>`` that have ``limit`` or more jobs of the type running."""
    expr = tx.sql.args_field(field)
    rows = tx.query(
        f"SELECT {expr}, COUNT(*) FROM homing_jobs WHERE type = ? AND state = 'running' "
        f"AND lease_expires_at > ? AND {expr} IS NOT NULL GROUP BY {expr} "
        "HAVING COUNT(*) >= ?",
        (type_, now, limit),
    )
    return [r[0] for r in rows]


def key_of(tx: Tx, job_id: str, field: str) -> Any:
    row = tx.query_one(
        f"SELECT {tx.sql.args_field(field)} FROM homing_jobs WHERE id = ?", (job_id,)
    )
    return row[0] if row else None


def running_with_key(tx: Tx, type_: str, field: str, key: Any, *, now: float) -> int:
    expr = tx.sql.args_field(field)
    row = tx.query_one(
        f"SELECT COUNT(*) FROM homing_jobs WHERE type = ? AND state = 'running' "
        f"AND lease_expires_at > ? AND {expr} = ?",
        (type_, now, key),
    )
    return int(row[0]) if row else 0


def exclude_keys(tx: Tx, field: str, keys: Sequence[Any]) -> tuple[str, list[Any]]:
    """`` AND <args.field> is none of keys`` (jobs without the field are not limited)."""
    if not keys:
        return "", []
    expr = tx.sql.args_field(field)
    clauses, params = [], []
    for start in range(0, len(keys), 500):
        clause, more = tx.sql.in_list(expr, keys[start : start + 500])
        clauses.append(f"NOT ({clause})")
        params += more
    return f" AND ({expr} IS NULL OR ({' AND '.join(clauses)}))", params


def rate_used(tx: Tx, type_: str, *, now: float, per: float) -> int:
    """Grabs of the type within the last ``per`` seconds (older records are deleted)."""
    tx.execute("DELETE FROM homing_job_starts WHERE type = ? AND at <= ?", (type_, now - per))
    row = tx.query_one("SELECT COUNT(*) FROM homing_job_starts WHERE type = ?", (type_,))
    return int(row[0]) if row else 0


def record_starts(tx: Tx, type_: str, *, now: float, count: int) -> None:
    tx.executemany("INSERT INTO homing_job_starts (type, at) VALUES (?, ?)", [(type_, now)] * count)


# -- schedules ---------------------------------------------------------------------------
SCHEDULE_COLUMNS = (
    "name",
    "cron",
    "tz",
    "type",
    "args",
    "priority",
    "missed",
    "last_tick",
    "created_at",
    "updated_at",
)


def upsert_schedule(tx: Tx, row: dict[str, Any], *, now: float) -> None:
    """Register a schedule, or update its definition; its last tick is kept."""
    tx.execute(
        "INSERT INTO homing_schedules (name, cron, tz, type, args, priority, missed, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO "
        "UPDATE SET cron = excluded.cron, tz = excluded.tz, type = excluded.type, "
        "args = excluded.args, priority = excluded.priority, missed = excluded.missed, "
        "updated_at = excluded.updated_at",
        (
            row["name"],
            row["cron"],
            row["tz"],
            row["type"],
            row["args"],
            row["priority"],
            row["missed"],
            now,
            now,
        ),
    )


def schedule_for_update(tx: Tx, name: str) -> dict[str, Any] | None:
    """The schedule's row, locked until the transaction ends (one ticker at a time)."""
    row = tx.query_one(
        f"SELECT {', '.join(SCHEDULE_COLUMNS)} FROM homing_schedules WHERE name = ?"
        f"{tx.sql.lock_rows}",
        (name,),
    )
    return dict(zip(SCHEDULE_COLUMNS, row, strict=True)) if row else None


def set_last_tick(tx: Tx, name: str, tick: float) -> None:
    tx.execute(
        "UPDATE homing_schedules SET last_tick = ? WHERE name = ? "
        "AND (last_tick IS NULL OR last_tick < ?)",
        (tick, name, tick),
    )


def list_schedules(tx: Tx) -> list[dict[str, Any]]:
    rows = tx.query(f"SELECT {', '.join(SCHEDULE_COLUMNS)} FROM homing_schedules ORDER BY name")
    return [dict(zip(SCHEDULE_COLUMNS, r, strict=True)) for r in rows]


def delete_schedule(tx: Tx, name: str) -> bool:
    return tx.rowcount("DELETE FROM homing_schedules WHERE name = ?", (name,)) == 1
