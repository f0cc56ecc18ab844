"""Every SQL statement of the job queue. Domain-level functions over an open ``Tx``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from homing.errors import InvalidFilter
from homing.store.protocol import Tx

JOB_COLUMNS = (
    "id",
    "type",
    "args",
    "priority",
    "state",
    "run_at",
    "attempts",
    "unique_key",
    "lease_token",
    "lease_expires_at",
    "holder_host",
    "holder_pid",
    "holder_worker",
    "created_at",
    "finished_at",
    "last_error",
    "parent_id",
    "seq",
)
_COLS = ", ".join(JOB_COLUMNS)
_J_COLS = ", ".join(f"j.{c}" for c in JOB_COLUMNS)


@dataclass(frozen=True)
class NewJob:
    id: str
    type: str
    args_json: str
    priority: int
    run_at: float
    unique_key: str | None
    parent_id: str | None
    created_at: float


def _row(tx: Tx, values: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(JOB_COLUMNS, values, strict=False))
    if isinstance(row["args"], str) and tx.dialect == "sqlite":
        row["args"] = json.loads(row["args"])
    return row


# -- insert ------------------------------------------------------------------------------
def insert_jobs(tx: Tx, jobs: Sequence[NewJob]) -> list[str]:
    """Insert jobs; a job whose id or unique_key exists already is not inserted and the
    existing job's id is returned in its place. Returns ids in input order."""
    if not jobs:
        return []
    if tx.dialect == "postgres":
        # One statement for the whole batch: arrays unnested server-side.
        tx.execute(
            "WITH ins AS (INSERT INTO homing_jobs (id, type, args, priority, state, run_at, "
            "available_at, unique_key, parent_id, created_at) "
            "SELECT id, type, args::jsonb, priority, 'ready', run_at, run_at, unique_key, "
            "parent_id, created_at FROM unnest(?::text[], ?::text[], ?::text[], ?::int[], "
            "?::float8[], ?::text[], ?::text[], ?::float8[]) "
            "AS t(id, type, args, priority, run_at, unique_key, parent_id, created_at) "
            "ON CONFLICT DO NOTHING RETURNING 1) "
            # the wake-up rides in the same statement, only when something was inserted
            "SELECT pg_notify(?, '') WHERE EXISTS (SELECT 1 FROM ins)",
            (
                [j.id for j in jobs],
                [j.type for j in jobs],
                [j.args_json for j in jobs],
                [j.priority for j in jobs],
                [j.run_at for j in jobs],
                [j.unique_key for j in jobs],
                [j.parent_id for j in jobs],
                [j.created_at for j in jobs],
                notify_channel(tx),
            ),
        )
    else:
        tx.executemany(
            "INSERT INTO homing_jobs (id, type, args, priority, state, run_at, available_at, "
            "unique_key, parent_id, created_at) VALUES (?, ?, ?, ?, 'ready', ?, ?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            [
                (
                    j.id,
                    j.type,
                    j.args_json,
                    j.priority,
                    j.run_at,
                    j.run_at,
                    j.unique_key,
                    j.parent_id,
                    j.created_at,
                )
                for j in jobs
            ],
        )
    ids = [j.id for j in jobs]
    keys = list({j.unique_key for j in jobs if j.unique_key is not None})
    if keys:
        owner: dict[str, str] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            if tx.dialect == "postgres":
                rows = tx.query(
                    "SELECT unique_key, id FROM homing_jobs WHERE unique_key = ANY(?)", (chunk,)
                )
            else:
                marks = ", ".join("?" for _ in chunk)
                rows = tx.query(
                    f"SELECT unique_key, id FROM homing_jobs WHERE unique_key IN ({marks})", chunk
                )
            owner.update({str(k): str(i) for k, i in rows})
        ids = [owner.get(j.unique_key, j.id) if j.unique_key else j.id for j in jobs]
    return ids


def notify_channel(tx: Tx) -> str:
    schema = getattr(tx.store, "schema", None)
    return f"{schema}_homing_jobs" if schema else "homing_jobs"


# -- grab --------------------------------------------------------------------------------
_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,127}$")
_COMPARISONS = {"$lt": "<", "$lte": "<=", "$gt": ">", "$gte": ">="}
_OPERATORS = ("$eq", "$in", *_COMPARISONS)
_MAX_IN = 1000
_INT_RANGE = 2**63


def _check_scalar(key: str, value: Any) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -_INT_RANGE <= value < _INT_RANGE:
            raise InvalidFilter(f"where[{key!r}]: integer {value} is out of the 64-bit range")
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidFilter(f"where[{key!r}]: {value} is not a finite number")
        return
    raise InvalidFilter(
        f"where[{key!r}]: {type(value).__name__} values cannot be searched; "
        "use a string, number, boolean or None"
    )


def _path(key: Any) -> list[str]:
    if not isinstance(key, str):
        raise InvalidFilter(f"where keys must be strings naming an args field, not {key!r}")
    segments = key.split(".")
    for seg in segments:
        if not _SEGMENT.match(seg):
            raise InvalidFilter(
                f"where key {key!r}: each dot-separated part must be a name of letters, "
                "digits, '_' or '-' starting with a letter or '_'"
            )
    return segments


def _eq_clause(dialect: str, path: list[str], value: Any) -> tuple[str, list[Any]]:
    if dialect == "postgres":
        return "args #> ? = ?::jsonb", [path, json.dumps(value)]
    jpath = "$" + "".join(f'."{s}"' for s in path)
    if value is None:
        return "json_type(args, ?) = 'null'", [jpath]
    if isinstance(value, bool):
        return "json_type(args, ?) = ?", [jpath, "true" if value else "false"]
    if isinstance(value, str):
        return "(json_type(args, ?) = 'text' AND json_extract(args, ?) = ?)", [jpath, jpath, value]
    return (
        "(json_type(args, ?) IN ('integer', 'real') AND json_extract(args, ?) = ?)",
        [jpath, jpath, value],
    )


def _cmp_clause(
    dialect: str, key: str, path: list[str], op: str, value: Any
) -> tuple[str, list[Any]]:
    sql_op = _COMPARISONS[op]
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidFilter(f"where[{key!r}]: {op} compares numbers or strings, not {value!r}")
    is_text = isinstance(value, str)
    if dialect == "postgres":
        if is_text:
            return (
                f"(CASE WHEN jsonb_typeof(args #> ?) = 'string' "
                f'THEN (args #>> ?) COLLATE "C" {sql_op} ? ELSE false END)',
                [path, path, value],
            )
        return (
            f"(CASE WHEN jsonb_typeof(args #> ?) = 'number' "
            f"THEN (args #>> ?)::numeric {sql_op} ?::numeric ELSE false END)",
            [path, path, value],
        )
    jpath = "$" + "".join(f'."{s}"' for s in path)
    types = "('text')" if is_text else "('integer', 'real')"
    return (
        f"(json_type(args, ?) IN {types} AND json_extract(args, ?) {sql_op} ?)",
        [jpath, jpath, value],
    )


def compile_where(dialect: str, where: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """Translate a search filter over the JSON args into SQL with bound parameters.

    ``{"user": 5}`` is equality; ``{"n": {"$gte": 3, "$lt": 9}}``, ``{"c": {"$in": [..]}}``
    use operators. Keys are field names, dot-separated for nested objects. Keys and values
    always travel as parameters; only the structure shapes the SQL.
    """
    if not isinstance(where, Mapping):
        raise InvalidFilter(
            f"where must be a dict of field -> value or {{operator: value}}, not {type(where).__name__}"
        )
    if not where:
        raise InvalidFilter("where is empty; pass None to grab without a search")
    clauses: list[str] = []
    params: list[Any] = []
    for key, cond in where.items():
        path = _path(key)
        if isinstance(cond, Mapping):
            if not cond:
                raise InvalidFilter(f"where[{key!r}] is an empty operator dict")
            ops = list(cond.items())
        else:
            ops = [("$eq", cond)]
        for op, value in ops:
            if op not in _OPERATORS:
                raise InvalidFilter(
                    f"where[{key!r}]: unknown operator {op!r}; use one of {', '.join(_OPERATORS)}"
                )
            if op == "$in":
                if not isinstance(value, list | tuple) or not value or len(value) > _MAX_IN:
                    raise InvalidFilter(
                        f"where[{key!r}]: $in takes a non-empty list of at most {_MAX_IN} values"
                    )
                for v in value:
                    _check_scalar(key, v)
                if dialect == "postgres":
                    clauses.append("args #> ? = ANY(?::jsonb[])")
                    params += [path, [json.dumps(v) for v in value]]
                else:
                    parts = [_eq_clause(dialect, path, v) for v in value]
                    clauses.append("(" + " OR ".join(p[0] for p in parts) + ")")
                    for p in parts:
                        params += p[1]
                continue
            _check_scalar(key, value)
            if op == "$eq":
                clause, more = _eq_clause(dialect, path, value)
            else:
                clause, more = _cmp_clause(dialect, key, path, op, value)
            clauses.append(clause)
            params += more
    return " AND ".join(clauses), params


@dataclass(frozen=True)
class Lease:
    token: str
    until: float
    host: str
    pid: int
    worker: str


def grab_jobs(
    tx: Tx,
    types: Sequence[str],
    *,
    now: float,
    lease: Lease,
    limit: int,
    where: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """Lease up to ``limit`` available jobs of ``types`` to one holder, atomically.

    A job is available when ready and due, or running with an expired lease, and not staged
    in an uncommitted batch. Jobs of committed batches are taken after ordinary ones of the
    same call. A job taken over from an expired lease gets a ``lease_expired`` history entry.
    """
    where_sql = ""
    where_params: list[Any] = []
    if where is not None:
        clause, where_params = compile_where(tx.dialect, where)
        where_sql = " AND " + clause
    set_lease = (
        "state = 'running', attempts = attempts + 1, lease_token = ?, lease_expires_at = ?, "
        "available_at = ?, holder_host = ?, holder_pid = ?, holder_worker = ?, batch_id = NULL"
    )
    lease_params = [lease.token, lease.until, lease.until, lease.host, lease.pid, lease.worker]
    old_cols = "seq, state, holder_host, holder_pid, holder_worker, lease_expires_at"
    if tx.dialect == "postgres":
        sql = (
            # One ordered index scan per type (LATERAL), merged: `type = ANY(...)` would make
            # PostgreSQL sort every ready job of those types on each grab.
            "WITH plain AS (SELECT "
            + ", ".join(f"c.{c}" for c in old_cols.split(", "))
            + " FROM unnest(?::text[]) AS t(name) CROSS JOIN LATERAL ("
            f"SELECT {old_cols}, priority, available_at FROM homing_jobs "
            "WHERE type = t.name AND state IN ('ready', 'running') AND available_at <= ? "
            f"AND batch_id IS NULL{where_sql} "
            "ORDER BY priority DESC, available_at, seq LIMIT ? FOR UPDATE SKIP LOCKED) c "
            "ORDER BY c.priority DESC, c.available_at, c.seq LIMIT ?), "
            f"staged AS (SELECT {old_cols} FROM homing_jobs WHERE batch_id IN "
            "(SELECT batch_id FROM homing_job_batches WHERE state = 'committed') "
            f"AND type = ANY(?) AND state = 'ready' AND available_at <= ?{where_sql} "
            "ORDER BY priority DESC, seq LIMIT ? FOR UPDATE SKIP LOCKED), "
            "cand AS (SELECT * FROM (SELECT * FROM plain UNION ALL SELECT * FROM staged) u LIMIT ?), "
            f"upd AS (UPDATE homing_jobs j SET {set_lease.replace('attempts + 1', 'j.attempts + 1')} "
            f"FROM cand WHERE j.seq = cand.seq RETURNING {_J_COLS}, "
            "cand.state AS old_state, cand.holder_host AS old_host, cand.holder_pid AS old_pid, "
            "cand.holder_worker AS old_worker, cand.lease_expires_at AS old_exp), "
            # a takeover of an expired lease is recorded in the same statement
            "hist AS (INSERT INTO homing_job_failures "
            "(job_id, attempt, at, kind, host, pid, worker, message) "
            "SELECT id, attempts - 1, ?, 'lease_expired', old_host, old_pid, old_worker, "
            "'lease expired at ' || round(old_exp::numeric, 3)::text "
            "|| ' without completion; handed out again' FROM upd WHERE old_state = 'running') "
            "SELECT * FROM upd"
        )
        pick = [list(types), now, *where_params, limit]
        rows = tx.query(sql, [*pick, limit, *pick, limit, *lease_params, now])
    else:
        # One ordered index scan per type, merged here (an IN list would sort them all).
        found = []
        for name in types:
            found += tx.query(
                f"SELECT {old_cols}, priority, available_at FROM homing_jobs WHERE type = ? "
                "AND state IN ('ready', 'running') AND available_at <= ? AND batch_id IS NULL"
                f"{where_sql} ORDER BY priority DESC, available_at, seq LIMIT ?",
                [name, now, *where_params, limit],
            )
        found = [r[:6] for r in sorted(found, key=lambda r: (-r[6], r[7], r[0]))[:limit]]
        marks = ", ".join("?" for _ in types)
        if len(found) < limit:
            found += tx.query(
                f"SELECT {old_cols} FROM homing_jobs WHERE batch_id IN "
                "(SELECT batch_id FROM homing_job_batches WHERE state = 'committed') "
                f"AND type IN ({marks}) AND state = 'ready' AND available_at <= ?{where_sql} "
                "ORDER BY priority DESC, seq LIMIT ?",
                [*types, now, *where_params, limit - len(found)],
            )
        if not found:
            return []
        old = {r[0]: r[1:] for r in found}
        updated = []
        seqs = list(old)
        for start in range(0, len(seqs), 500):  # SQLite caps the number of bound variables
            chunk = seqs[start : start + 500]
            seq_marks = ", ".join("?" for _ in chunk)
            updated += tx.query(
                f"UPDATE homing_jobs SET {set_lease} WHERE seq IN ({seq_marks}) RETURNING {_COLS}",
                [*lease_params, *chunk],
            )
        rows = [(*u, *old[u[-1]]) for u in updated]
    result = []
    n = len(JOB_COLUMNS)
    for values in rows:
        job = _row(tx, values[:n])
        old_state, old_host, old_pid, old_worker, old_exp = values[n:]
        if old_state == "running" and tx.dialect == "sqlite":  # PostgreSQL: done in the CTE
            add_failure(
                tx,
                job["id"],
                attempt=job["attempts"] - 1,
                at=now,
                kind="lease_expired",
                host=old_host,
                pid=old_pid,
                worker=old_worker,
                message=f"lease expired at {old_exp:.3f} without completion; handed out again",
            )
        result.append(job)
    result.sort(key=lambda r: (-r["priority"], r["seq"]))
    return result


# -- staged batches ----------------------------------------------------------------------
def open_batch(tx: Tx, batch_id: str, *, now: float, info: str | None = None) -> str:
    """Create a staging batch if it does not exist; return its state (open/committed/aborted)."""
    tx.execute(
        "INSERT INTO homing_job_batches (batch_id, state, created_at, info) VALUES (?, 'open', ?, ?) "
        "ON CONFLICT (batch_id) DO NOTHING",
        (batch_id, now, info),
    )
    row = tx.query_one("SELECT state FROM homing_job_batches WHERE batch_id = ?", (batch_id,))
    assert row is not None
    return str(row[0])


def commit_batch(tx: Tx, batch_id: str, *, now: float) -> bool:
    """Make every job staged in the batch grabbable at once; True if this call committed it.

    Idempotent: committing a committed batch changes nothing and returns False.
    """
    changed = (
        tx.rowcount(
            "UPDATE homing_job_batches SET state = 'committed', committed_at = ? "
            "WHERE batch_id = ? AND state = 'open'",
            (now, batch_id),
        )
        == 1
    )
    if changed and tx.dialect == "postgres":
        tx.execute("SELECT pg_notify(?, '')", (notify_channel(tx),))
    return changed


def batch_state(tx: Tx, batch_id: str) -> str | None:
    row = tx.query_one("SELECT state FROM homing_job_batches WHERE batch_id = ?", (batch_id,))
    return str(row[0]) if row is not None else None


def abort_batch(tx: Tx, batch_id: str) -> int:
    """Drop an uncommitted batch and the jobs staged in it; returns the jobs deleted."""
    if batch_state(tx, batch_id) == "committed":
        return 0
    n = tx.rowcount("DELETE FROM homing_jobs WHERE batch_id = ? AND state = 'ready'", (batch_id,))
    tx.execute(
        "UPDATE homing_job_batches SET state = 'aborted' WHERE batch_id = ? AND state = 'open'",
        (batch_id,),
    )
    return n


# -- finishing ---------------------------------------------------------------------------
def finish(tx: Tx, job_id: str, token: str, *, state: str, now: float, error: str | None) -> bool:
    """Mark a running job done or failed if ``token`` still holds its lease."""
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET state = ?, finished_at = ?, last_error = COALESCE(?, last_error), "
            "lease_expires_at = NULL WHERE id = ? AND lease_token = ? AND state = 'running'",
            (state, now, error, job_id, token),
        )
        == 1
    )


def finish_many(tx: Tx, job_ids: Sequence[str], token: str, *, now: float) -> int:
    """Mark many running jobs of one lease done in one statement; returns how many changed."""
    if not job_ids:
        return 0
    if tx.dialect == "postgres":
        return tx.rowcount(
            "UPDATE homing_jobs SET state = 'done', finished_at = ?, lease_expires_at = NULL "
            "WHERE id = ANY(?) AND lease_token = ? AND state = 'running'",
            (now, list(job_ids), token),
        )
    marks = ", ".join("?" for _ in job_ids)
    return tx.rowcount(
        "UPDATE homing_jobs SET state = 'done', finished_at = ?, lease_expires_at = NULL "
        f"WHERE id IN ({marks}) AND lease_token = ? AND state = 'running'",
        (now, *job_ids, token),
    )


def reschedule(tx: Tx, job_id: str, token: str, *, run_at: float, error: str | None) -> bool:
    """Put a running job back to ready at ``run_at`` if ``token`` still holds its lease."""
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET state = 'ready', run_at = ?, available_at = ?, "
            "last_error = COALESCE(?, last_error), lease_expires_at = NULL "
            "WHERE id = ? AND lease_token = ? AND state = 'running'",
            (run_at, run_at, error, job_id, token),
        )
        == 1
    )


def extend_lease(tx: Tx, job_id: str, token: str, *, until: float) -> bool:
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET lease_expires_at = ?, available_at = ? "
            "WHERE id = ? AND lease_token = ? AND state = 'running'",
            (until, until, job_id, token),
        )
        == 1
    )


def add_failure(
    tx: Tx,
    job_id: str,
    *,
    attempt: int,
    at: float,
    kind: str,
    host: str | None,
    pid: int | None,
    worker: str | None,
    message: str,
) -> None:
    tx.execute(
        "INSERT INTO homing_job_failures (job_id, attempt, at, kind, host, pid, worker, message) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (job_id, attempt, at, kind, host, pid, worker, message),
    )


def redrive(tx: Tx, job_id: str, *, now: float) -> bool:
    """Make a perm-failed job ready again with its attempts reset (history kept)."""
    return (
        tx.rowcount(
            "UPDATE homing_jobs SET state = 'ready', attempts = 0, run_at = ?, available_at = ?, "
            "finished_at = NULL, lease_token = NULL, lease_expires_at = NULL "
            "WHERE id = ? AND state = 'failed'",
            (now, now, job_id),
        )
        == 1
    )


# -- reading -----------------------------------------------------------------------------
def job_row(tx: Tx, job_id: str) -> dict[str, Any] | None:
    values = tx.query_one(f"SELECT {_COLS} FROM homing_jobs WHERE id = ?", (job_id,))
    return _row(tx, values) if values is not None else None


def failures(tx: Tx, job_id: str) -> list[dict[str, Any]]:
    names = ("attempt", "at", "kind", "host", "pid", "worker", "message")
    rows = tx.query(
        "SELECT attempt, at, kind, host, pid, worker, message FROM homing_job_failures "
        "WHERE job_id = ? ORDER BY at, attempt",
        (job_id,),
    )
    return [dict(zip(names, r, strict=True)) for r in rows]


def gc(tx: Tx, *, finished_before: float) -> int:
    tx.execute(
        "DELETE FROM homing_job_failures WHERE job_id IN "
        "(SELECT id FROM homing_jobs WHERE finished_at IS NOT NULL AND finished_at < ?)",
        (finished_before,),
    )
    deleted = tx.rowcount(
        "DELETE FROM homing_jobs WHERE finished_at IS NOT NULL AND finished_at < ?",
        (finished_before,),
    )
    tx.execute(
        "DELETE FROM homing_job_batches WHERE state <> 'open' AND created_at < ? AND NOT EXISTS "
        "(SELECT 1 FROM homing_jobs j WHERE j.batch_id = homing_job_batches.batch_id)",
        (finished_before,),
    )
    return deleted


def stats(tx: Tx, *, now: float, window: float) -> list[dict[str, Any]]:
    """Per type: counts by state, oldest due ready job's age, completions in the window.

    ``staged`` counts jobs written into a batch that is not committed yet (invisible);
    ``expired`` running jobs whose lease ran out (their worker died or stalls), which the
    next grab hands out again.
    """
    visible = "(j.batch_id IS NULL OR b.state = 'committed')"
    rows = tx.query(
        "SELECT j.type, "
        f"SUM(CASE WHEN j.state = 'ready' AND j.run_at <= ? AND {visible} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN j.state = 'ready' AND j.run_at > ? AND {visible} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN j.state = 'ready' AND NOT {visible} THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'running' AND j.lease_expires_at > ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'running' AND j.lease_expires_at <= ? THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'done' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN j.state = 'failed' THEN 1 ELSE 0 END), "
        f"MIN(CASE WHEN j.state = 'ready' AND j.run_at <= ? AND {visible} THEN j.run_at END), "
        "SUM(CASE WHEN j.state = 'done' AND j.finished_at >= ? THEN 1 ELSE 0 END) "
        "FROM homing_jobs j LEFT JOIN homing_job_batches b ON b.batch_id = j.batch_id "
        "GROUP BY j.type ORDER BY j.type",
        (now, now, now, now, now, now - window),
    )
    out = []
    for type_, ready, scheduled, staged, running, expired, done, failed, oldest, recent in rows:
        out.append(
            {
                "type": type_,
                "ready": int(ready or 0),
                "scheduled": int(scheduled or 0),
                "staged": int(staged or 0),
                "running": int(running or 0),
                "expired": int(expired or 0),
                "done": int(done or 0),
                "failed": int(failed or 0),
                "oldest_ready_age_s": (now - float(oldest)) if oldest is not None else None,
                "done_per_s": int(recent or 0) / window,
            }
        )
    return out
