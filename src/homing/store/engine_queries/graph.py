"""SQL of the engine's graph: queues (settings, counters, expiry) and selectors (credits,
consumer liveness), and the lock that serialises engine writers."""

from __future__ import annotations

from typing import Any

from homing.store.engine_queries._rows import (
    _ENGINE_LOCK_KEY,
    _Q,
    _S,
    QUEUE_COLUMNS,
    SELECTOR_COLUMNS,
    _dict,
    _dicts,
)
from homing.store.protocol import Tx


def lock_engine(tx: Tx) -> None:
    """Serialise engine writers. SQLite's ``BEGIN IMMEDIATE`` already does; on PostgreSQL a
    transaction-scoped advisory lock keeps credit updates and routing free of races."""
    tx.sql.advisory_lock(tx, _ENGINE_LOCK_KEY)


def get_queue(tx: Tx, name: str) -> dict[str, Any] | None:
    return _dict(
        QUEUE_COLUMNS,
        tx.query_one(f"SELECT {_Q} FROM homing_engine_queues WHERE name = ?", (name,)),
    )


def insert_queue(
    tx: Tx,
    *,
    name: str,
    dead_letter: str | None,
    max_unprocessed: int | None,
    on_overflow: str,
    max_history: int | None,
    self_destruct: bool,
    max_deliveries: int | None = None,
    message_ttl: float | None = None,
    expires: float | None = None,
    now: float,
) -> None:
    tx.execute(
        "INSERT INTO homing_engine_queues (name, dead_letter, max_unprocessed, on_overflow, "
        "max_history, self_destruct, max_deliveries, message_ttl, expires, last_active, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            name,
            dead_letter,
            max_unprocessed,
            on_overflow,
            max_history,
            int(self_destruct),
            max_deliveries,
            message_ttl,
            expires,
            now,
            now,
        ),
    )


def dead_letter_users(tx: Tx, queue: str) -> list[str]:
    """Queues that name ``queue`` as their dead-letter queue."""
    return [
        str(r[0])
        for r in tx.query(
            "SELECT name FROM homing_engine_queues WHERE dead_letter = ? ORDER BY name", (queue,)
        )
    ]


def touch_queue(tx: Tx, queue: str, now: float) -> None:
    """Record use of a queue that expires when unused."""
    tx.execute("UPDATE homing_engine_queues SET last_active = ? WHERE name = ?", (now, queue))


def unused_queues(tx: Tx, now: float) -> list[str]:
    """Queues with an expiry, no selectors, and no use for that long."""
    return [
        str(r[0])
        for r in tx.query(
            "SELECT q.name FROM homing_engine_queues q WHERE q.expires IS NOT NULL "
            "AND q.last_active + q.expires <= ? AND NOT EXISTS "
            "(SELECT 1 FROM homing_engine_selectors s WHERE s.queue = q.name) ORDER BY q.name",
            (now,),
        )
    ]


def delete_queue(tx: Tx, name: str) -> None:
    tx.execute("DELETE FROM homing_engine_entries WHERE queue = ?", (name,))
    tx.execute("UPDATE homing_engine_queues SET dead_letter = NULL WHERE dead_letter = ?", (name,))
    tx.execute("DELETE FROM homing_engine_queues WHERE name = ?", (name,))


def list_queues(tx: Tx) -> list[dict[str, Any]]:
    queues = _dicts(QUEUE_COLUMNS, tx.query(f"SELECT {_Q} FROM homing_engine_queues ORDER BY name"))
    counts: dict[tuple[str, str], int] = {
        (str(q), str(s)): int(n)
        for q, s, n in tx.query(
            "SELECT queue, state, COUNT(*) FROM homing_engine_entries GROUP BY queue, state"
        )
    }
    for q in queues:
        for state in ("ready", "outstanding", "done"):
            q[state] = counts.get((q["name"], state), 0)
    return queues


def add_discarded(tx: Tx, queue: str, n: int = 1) -> None:
    tx.execute(
        "UPDATE homing_engine_queues SET discarded = discarded + ? WHERE name = ?", (n, queue)
    )


def queue_edges(tx: Tx) -> list[tuple[str, str]]:
    """Static edges of the graph: selectors to queues, and queues to their dead-letter queue."""
    edges = [
        (str(a), str(b))
        for a, b in tx.query(
            "SELECT queue, dest FROM homing_engine_selectors WHERE dest_kind = 'queue'"
        )
    ]
    edges += [
        (str(a), str(b))
        for a, b in tx.query(
            "SELECT name, dead_letter FROM homing_engine_queues WHERE dead_letter IS NOT NULL"
        )
    ]
    return edges


def selectors_of(tx: Tx, queue: str) -> list[dict[str, Any]]:
    return _dicts(
        SELECTOR_COLUMNS,
        tx.query(f"SELECT {_S} FROM homing_engine_selectors WHERE queue = ? ORDER BY id", (queue,)),
    )


def all_selectors(tx: Tx) -> list[dict[str, Any]]:
    return _dicts(
        SELECTOR_COLUMNS,
        tx.query(f"SELECT {_S} FROM homing_engine_selectors ORDER BY queue, id"),
    )


def get_selector(tx: Tx, queue: str, name: str) -> dict[str, Any] | None:
    return _dict(
        SELECTOR_COLUMNS,
        tx.query_one(
            f"SELECT {_S} FROM homing_engine_selectors WHERE queue = ? AND name = ?",
            (queue, name),
        ),
    )


def selector_by_id(tx: Tx, selector_id: int) -> dict[str, Any] | None:
    return _dict(
        SELECTOR_COLUMNS,
        tx.query_one(f"SELECT {_S} FROM homing_engine_selectors WHERE id = ?", (selector_id,)),
    )


def selectors_targeting(tx: Tx, queue: str) -> list[dict[str, Any]]:
    return _dicts(
        SELECTOR_COLUMNS,
        tx.query(
            f"SELECT {_S} FROM homing_engine_selectors WHERE dest_kind = 'queue' AND dest = ? "
            "ORDER BY id",
            (queue,),
        ),
    )


def insert_selector(
    tx: Tx,
    *,
    queue: str,
    name: str,
    mode: str,
    role: str,
    match_rule: str,
    dest_kind: str,
    dest: str | None,
    credits: int,
    now: float,
) -> int:
    row = tx.query_one(
        "INSERT INTO homing_engine_selectors (queue, name, mode, role, match_rule, dest_kind, "
        "dest, credits, granted, created_at, seen_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (queue, name, mode, role, match_rule, dest_kind, dest, credits, credits, now, now),
    )
    assert row is not None
    return int(row[0])


def delete_selector(tx: Tx, selector_id: int) -> None:
    tx.execute("DELETE FROM homing_engine_selectors WHERE id = ?", (selector_id,))


def touch_consumer(tx: Tx, consumer: str, *, now: float, absent_before: float) -> list[str]:
    """A consumer is alive: mark its selectors seen; return the queues of those that had
    been absent (seen before ``absent_before``), whose held messages it can take again."""
    back = [
        str(r[0])
        for r in tx.query(
            "SELECT queue FROM homing_engine_selectors WHERE dest_kind = 'consumer' "
            "AND dest = ? AND seen_at < ?",
            (consumer, absent_before),
        )
    ]
    tx.execute(
        "UPDATE homing_engine_selectors SET seen_at = ? WHERE dest_kind = 'consumer' AND dest = ?",
        (now, consumer),
    )
    return back


def apply_credits(
    tx: Tx, selector_id: int, *, credits: int, granted: int, last_used: int | None
) -> None:
    """Write a run's net credit change of one selector (and when it was last used)."""
    tx.execute(
        "UPDATE homing_engine_selectors SET credits = credits + ?, granted = granted + ?, "
        "last_used = COALESCE(?, last_used) WHERE id = ?",
        (credits, granted, last_used, selector_id),
    )
