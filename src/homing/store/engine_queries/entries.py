"""SQL of message entries: storing, routing states, leases, expiry, history, wake-ups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homing.store.engine_queries._rows import (
    _E,
    ENTRY_COLUMNS,
    NewEntry,
    _dict,
    _dicts,
)
from homing.store.protocol import Tx


def insert_entry(
    tx: Tx,
    e: NewEntry,
    *,
    selector_id: int | None = None,
    consumer: str | None = None,
    offer_until: float | None = None,
) -> int:
    """Store an entry: ready, or with ``selector_id`` given to that selector at once
    (one statement instead of an insert and an update)."""
    row = tx.query_one(
        "INSERT INTO homing_engine_entries (state, selector_id, consumer, lease_until, id, "
        "queue, headers, body, body_kind, address, return_address, original_address, reason, "
        "parent_seq, hops, created_at, deaths, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
        (
            "ready" if selector_id is None else "outstanding",
            selector_id,
            consumer,
            offer_until,
            e.id,
            e.queue,
            e.headers,
            e.body,
            e.body_kind,
            e.address,
            e.return_address,
            e.original_address,
            e.reason,
            e.parent_seq,
            e.hops,
            e.created_at,
            e.deaths,
            e.expires_at,
        ),
    )
    assert row is not None
    return int(row[0])


def ready_heads(
    tx: Tx, queue: str, *, after_seq: int, limit: int, waiting_for: Sequence[int] | None = None
) -> list[tuple[int, str, str | None]]:
    """(seq, headers, return_address) of ready entries: enough to decide whom they match
    without loading bodies. ``waiting_for``: only entries held for one of these selectors
    (or whose selectors were never recorded), so a payment does not re-read the others."""
    where, params = "", [queue, after_seq]
    if waiting_for is not None:
        likes = " OR ".join("waiting_for LIKE ?" for _ in waiting_for)
        where = f" AND (waiting_for IS NULL OR {likes})" if likes else " AND waiting_for IS NULL"
        params += [f"%,{int(i)},%" for i in waiting_for]
    return [
        (int(s), str(h), r)
        for s, h, r in tx.query(
            "SELECT seq, headers, return_address FROM homing_engine_entries WHERE queue = ? "
            f"AND state = 'ready' AND seq > ?{where} ORDER BY seq LIMIT ?",
            (*params, limit),
        )
    ]


def set_waiting(tx: Tx, seq: int, selectors: str) -> None:
    """Record which selectors' credit would move held entry ``seq`` (",3,7,")."""
    tx.execute("UPDATE homing_engine_entries SET waiting_for = ? WHERE seq = ?", (selectors, seq))


def oldest_ready(tx: Tx, queue: str) -> dict[str, Any] | None:
    return _dict(
        ENTRY_COLUMNS,
        tx.query_one(
            f"SELECT {_E} FROM homing_engine_entries WHERE queue = ? AND state = 'ready' "
            "ORDER BY seq LIMIT 1",
            (queue,),
        ),
    )


def due_to_expire(tx: Tx, now: float, limit: int) -> list[dict[str, Any]]:
    """Unprocessed entries past their time to live, oldest deadline first."""
    return _dicts(
        ENTRY_COLUMNS,
        tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE state = 'ready' "
            "AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at, seq LIMIT ?",
            (now, limit),
        ),
    )


def lapsed_leases(tx: Tx, now: float, limit: int) -> list[dict[str, Any]]:
    """Entries given to a consumer whose lease (or offer, if never taken) has run out."""
    return _dicts(
        ENTRY_COLUMNS,
        tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE state = 'outstanding' "
            "AND consumer IS NOT NULL AND lease_until IS NOT NULL AND lease_until <= ? "
            "ORDER BY lease_until, seq LIMIT ?",
            (now, limit),
        ),
    )


def get_entry(tx: Tx, seq: int) -> dict[str, Any] | None:
    return _dict(
        ENTRY_COLUMNS, tx.query_one(f"SELECT {_E} FROM homing_engine_entries WHERE seq = ?", (seq,))
    )


def entries(
    tx: Tx, queue: str, *, state: str | None, limit: int, after_seq: int = 0
) -> list[dict[str, Any]]:
    if state is None:
        rows = tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE queue = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (queue, after_seq, limit),
        )
    else:
        rows = tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE queue = ? AND state = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (queue, state, after_seq, limit),
        )
    return _dicts(ENTRY_COLUMNS, rows)


def count(tx: Tx, queue: str, state: str) -> int:
    row = tx.query_one(
        "SELECT COUNT(*) FROM homing_engine_entries WHERE queue = ? AND state = ?", (queue, state)
    )
    return int(row[0]) if row else 0


def set_outstanding(
    tx: Tx,
    seq: int,
    *,
    selector_id: int,
    consumer: str | None,
    job_id: str | None,
    offer_until: float | None = None,
) -> None:
    """Give an entry to a selector's destination. For a consumer, ``offer_until`` bounds how
    long it may sit untaken before it goes back to the queue."""
    tx.execute(
        "UPDATE homing_engine_entries SET state = 'outstanding', selector_id = ?, consumer = ?, "
        "job_id = ?, lease_token = NULL, lease_until = ? WHERE seq = ?",
        (selector_id, consumer, job_id, offer_until, seq),
    )


def set_done(tx: Tx, seq: int, *, now: float) -> None:
    tx.execute(
        "UPDATE homing_engine_entries SET state = 'done', done_at = ?, lease_token = NULL, "
        "lease_until = NULL WHERE seq = ?",
        (now, seq),
    )


def set_ready(tx: Tx, seq: int) -> None:
    """Give an outstanding entry back to its queue: no selector, consumer, job or lease."""
    tx.execute(
        "UPDATE homing_engine_entries SET state = 'ready', selector_id = NULL, consumer = NULL, "
        "job_id = NULL, lease_token = NULL, lease_until = NULL, waiting_for = NULL "
        "WHERE seq = ?",
        (seq,),
    )


def mark_copied(tx: Tx, seq: int) -> None:
    tx.execute("UPDATE homing_engine_entries SET copied = 1 WHERE seq = ?", (seq,))


def delete_entry(tx: Tx, seq: int) -> None:
    tx.execute("DELETE FROM homing_engine_entries WHERE seq = ?", (seq,))


def live_children(tx: Tx, parent_seq: int) -> list[dict[str, Any]]:
    return _dicts(
        ENTRY_COLUMNS,
        tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE parent_seq = ? AND state <> 'done' "
            "ORDER BY seq",
            (parent_seq,),
        ),
    )


def outstanding_of(tx: Tx, selector_id: int) -> list[int]:
    return [
        int(r[0])
        for r in tx.query(
            "SELECT seq FROM homing_engine_entries WHERE selector_id = ? AND state = 'outstanding' "
            "ORDER BY seq",
            (selector_id,),
        )
    ]


def trim_history(tx: Tx, queue: str, keep: int) -> int:
    """Drop the oldest processed entries of ``queue`` beyond ``keep``; returns how many."""
    n = count(tx, queue, "done")
    if n <= keep:
        return 0
    return tx.rowcount(
        "DELETE FROM homing_engine_entries WHERE seq IN (SELECT seq FROM homing_engine_entries "
        "WHERE queue = ? AND state = 'done' ORDER BY done_at, seq LIMIT ?)",
        (queue, n - keep),
    )


def takeable(tx: Tx, consumer: str, *, now: float, limit: int) -> list[dict[str, Any]]:
    """Entries given to ``consumer`` and not leased now (never taken, or lease run out)."""
    lock = tx.sql.lock_rows
    return _dicts(
        ENTRY_COLUMNS,
        tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE consumer = ? AND state = 'outstanding' "
            "AND (lease_token IS NULL OR lease_until <= ?) ORDER BY seq LIMIT ?" + lock,
            (consumer, now, limit),
        ),
    )


ENGINE_CHANNEL = "homing_engine"


def notify_channel(tx: Tx) -> str:
    schema = getattr(tx.store, "schema", None)
    return f"{schema}_homing_engine" if schema else "homing_engine"


def notify_consumers(tx: Tx) -> None:
    """Wake consumers blocked in ``take(wait=...)`` once this transaction commits."""
    tx.store.notify(tx, ENGINE_CHANNEL)


def lease(tx: Tx, seq: int, *, token: str, until: float) -> None:
    tx.execute(
        "UPDATE homing_engine_entries SET lease_token = ?, lease_until = ?, "
        "attempts = attempts + 1 WHERE seq = ?",
        (token, until, seq),
    )


def offer_again(tx: Tx, seq: int, *, until: float) -> None:
    """Cancel a lease; the entry waits for its consumer again until ``until``."""
    tx.execute(
        "UPDATE homing_engine_entries SET lease_token = NULL, lease_until = ? WHERE seq = ?",
        (until, seq),
    )


def release(tx: Tx, seq: int) -> None:
    tx.execute(
        "UPDATE homing_engine_entries SET lease_token = NULL, lease_until = NULL WHERE seq = ?",
        (seq,),
    )
