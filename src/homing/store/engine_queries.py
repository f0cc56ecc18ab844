"""Every SQL statement of the queue engine (seed 001). Domain-level functions over a ``Tx``.

Identifiers and structure come only from constants here; every value is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from homing.store.protocol import Tx

DEAD_LETTERS = "$dead"
_ENGINE_LOCK_KEY = 0x686F6D656E67  # "homeng"

QUEUE_COLUMNS = (
    "name",
    "dead_letter",
    "max_unprocessed",
    "on_overflow",
    "max_history",
    "self_destruct",
    "discarded",
    "created_at",
    "max_deliveries",
    "message_ttl",
    "expires",
    "last_active",
)
SELECTOR_COLUMNS = (
    "id",
    "queue",
    "name",
    "mode",
    "role",
    "match_rule",
    "dest_kind",
    "dest",
    "credits",
    "granted",
    "last_used",
    "created_at",
    "seen_at",
)
ENTRY_COLUMNS = (
    "seq",
    "id",
    "queue",
    "state",
    "headers",
    "body",
    "body_kind",
    "address",
    "return_address",
    "original_address",
    "reason",
    "parent_seq",
    "selector_id",
    "consumer",
    "job_id",
    "copied",
    "hops",
    "lease_token",
    "lease_until",
    "attempts",
    "created_at",
    "done_at",
    "deaths",
    "expires_at",
    "waiting_for",
)
_Q = ", ".join(QUEUE_COLUMNS)
_S = ", ".join(SELECTOR_COLUMNS)
_E = ", ".join(ENTRY_COLUMNS)


def _dict(columns: Sequence[str], row: Sequence[Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(zip(columns, row, strict=True))
    if "body" in out and isinstance(out["body"], memoryview):
        out["body"] = bytes(out["body"])
    return out


def _dicts(columns: Sequence[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [d for d in (_dict(columns, r) for r in rows) if d is not None]


def lock_engine(tx: Tx) -> None:
    """Serialise engine writers. SQLite's ``BEGIN IMMEDIATE`` already does; on PostgreSQL a
    transaction-scoped advisory lock keeps credit updates and routing free of races."""
    if tx.dialect == "postgres":
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_ENGINE_LOCK_KEY,))


# -- queues ------------------------------------------------------------------------------
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


# -- selectors ---------------------------------------------------------------------------
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


def spend_credit(tx: Tx, selector_id: int, used: int) -> None:
    tx.execute(
        "UPDATE homing_engine_selectors SET credits = credits - 1, last_used = ? WHERE id = ?",
        (used, selector_id),
    )


def add_credits(tx: Tx, selector_id: int, n: int, *, grant: bool = False) -> None:
    """Return ``n`` credits to a selector (payment), or with ``grant`` also raise its total."""
    tx.execute(
        "UPDATE homing_engine_selectors SET credits = credits + ?, granted = granted + ? "
        "WHERE id = ?",
        (n, n if grant else 0, selector_id),
    )


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


def max_last_used(tx: Tx) -> int:
    row = tx.query_one("SELECT COALESCE(MAX(last_used), 0) FROM homing_engine_selectors")
    return int(row[0]) if row else 0


# -- entries -----------------------------------------------------------------------------
@dataclass(frozen=True)
class NewEntry:
    id: str
    queue: str
    headers: str
    body: bytes | None
    body_kind: str
    address: str
    return_address: str | None
    original_address: str | None
    reason: str | None
    parent_seq: int | None
    hops: int
    created_at: float
    deaths: str | None = None
    expires_at: float | None = None


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


def entry_row(seq: int, e: NewEntry) -> dict[str, Any]:
    """The row ``insert_entry`` just stored, without reading it back."""
    return {
        "seq": seq,
        "id": e.id,
        "queue": e.queue,
        "state": "ready",
        "headers": e.headers,
        "body": e.body,
        "body_kind": e.body_kind,
        "address": e.address,
        "return_address": e.return_address,
        "original_address": e.original_address,
        "reason": e.reason,
        "parent_seq": e.parent_seq,
        "selector_id": None,
        "consumer": None,
        "job_id": None,
        "copied": 0,
        "hops": e.hops,
        "lease_token": None,
        "lease_until": None,
        "attempts": 0,
        "created_at": e.created_at,
        "done_at": None,
        "deaths": e.deaths,
        "expires_at": e.expires_at,
        "waiting_for": None,
    }


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


def entries_by_id(tx: Tx, message_id: str) -> list[dict[str, Any]]:
    return _dicts(
        ENTRY_COLUMNS,
        tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE id = ? ORDER BY seq", (message_id,)
        ),
    )


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
    lock = " FOR UPDATE" if tx.dialect == "postgres" else ""
    return _dicts(
        ENTRY_COLUMNS,
        tx.query(
            f"SELECT {_E} FROM homing_engine_entries WHERE consumer = ? AND state = 'outstanding' "
            "AND (lease_token IS NULL OR lease_until <= ?) ORDER BY seq LIMIT ?" + lock,
            (consumer, now, limit),
        ),
    )


def notify_channel(tx: Tx) -> str:
    schema = getattr(tx.store, "schema", None)
    return f"{schema}_homing_engine" if schema else "homing_engine"


def notify_consumers(tx: Tx) -> None:
    """Wake consumers blocked in ``take(wait=...)`` once this transaction commits."""
    if tx.dialect == "postgres":
        tx.execute("SELECT pg_notify(?, '')", (notify_channel(tx),))


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


def record_published_many(tx: Tx, rows: Sequence[tuple[str, str, int | None, str, float]]) -> None:
    """Ledger rows (id, queue, seq, outcome, at) of a batch publish."""
    tx.executemany(
        "INSERT INTO homing_engine_published (id, queue, seq, outcome, at) VALUES (?, ?, ?, ?, ?)",
        rows,
    )


def published_many(tx: Tx, message_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Ledger rows of the ids published before, by id."""
    out: dict[str, dict[str, Any]] = {}
    for start in range(0, len(message_ids), 500):
        chunk = list(message_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        for row in tx.query(
            f"SELECT id, queue, seq, outcome, at FROM homing_engine_published WHERE id IN ({marks})",
            chunk,
        ):
            d = _dict(("id", "queue", "seq", "outcome", "at"), row)
            assert d is not None
            out[str(d["id"])] = d
    return out


# -- publish ledger (idempotent publish by message id) ------------------------------------
def published(tx: Tx, message_id: str) -> dict[str, Any] | None:
    return _dict(
        ("id", "queue", "seq", "outcome", "at"),
        tx.query_one(
            "SELECT id, queue, seq, outcome, at FROM homing_engine_published WHERE id = ?",
            (message_id,),
        ),
    )


def record_published(
    tx: Tx, message_id: str, *, queue: str, seq: int | None, outcome: str, now: float
) -> None:
    tx.execute(
        "INSERT INTO homing_engine_published (id, queue, seq, outcome, at) VALUES (?, ?, ?, ?, ?)",
        (message_id, queue, seq, outcome, now),
    )


def forget_published(tx: Tx, *, before: float) -> int:
    return tx.rowcount("DELETE FROM homing_engine_published WHERE at < ?", (before,))


# -- job destinations ---------------------------------------------------------------------
def finished_job_entries(tx: Tx, limit: int) -> list[tuple[int, str | None]]:
    """Outstanding entries given to a job whose job has finished (or was garbage-collected):
    (seq, job state or None)."""
    return [
        (int(seq), None if state is None else str(state))
        for seq, state in tx.query(
            "SELECT e.seq, j.state FROM homing_engine_entries e "
            "LEFT JOIN homing_jobs j ON j.id = e.job_id "
            "WHERE e.state = 'outstanding' AND e.job_id IS NOT NULL "
            "AND (j.id IS NULL OR j.state IN ('done', 'failed')) ORDER BY e.seq LIMIT ?",
            (limit,),
        )
    ]


# -- invariants ---------------------------------------------------------------------------
def credit_books(tx: Tx) -> list[tuple[int, str, str, int, int, int]]:
    """Per selector: (id, queue, name, credits held, outstanding entries, credits granted)."""
    return [
        (int(i), str(q), str(n), int(c), int(o), int(g))
        for i, q, n, c, o, g in tx.query(
            "SELECT s.id, s.queue, s.name, s.credits, "
            "(SELECT COUNT(*) FROM homing_engine_entries e "
            " WHERE e.selector_id = s.id AND e.state = 'outstanding'), s.granted "
            "FROM homing_engine_selectors s ORDER BY s.id"
        )
    ]


def orphans(tx: Tx) -> list[tuple[str, int]]:
    """Entries that break the graph's bookkeeping, as (problem, seq)."""
    out: list[tuple[str, int]] = []
    for (seq,) in tx.query(
        "SELECT e.seq FROM homing_engine_entries e WHERE e.state = 'outstanding' AND "
        "NOT EXISTS (SELECT 1 FROM homing_engine_selectors s WHERE s.id = e.selector_id)"
    ):
        out.append(("outstanding entry without its selector", int(seq)))
    for (seq,) in tx.query(
        "SELECT e.seq FROM homing_engine_entries e WHERE e.state = 'outstanding' AND "
        "e.consumer IS NULL AND e.job_id IS NULL AND (SELECT COUNT(*) FROM homing_engine_entries c "
        "WHERE c.parent_seq = e.seq AND c.state <> 'done') <> 1"
    ):
        out.append(("outstanding entry moved to a queue without exactly one live child", int(seq)))
    for (seq,) in tx.query(
        "SELECT c.seq FROM homing_engine_entries c JOIN homing_engine_entries p "
        "ON p.seq = c.parent_seq WHERE c.state <> 'done' AND p.state <> 'outstanding'"
    ):
        out.append(("live child of an entry that is not outstanding", int(seq)))
    for (seq,) in tx.query(
        "SELECT e.seq FROM homing_engine_entries e WHERE NOT EXISTS "
        "(SELECT 1 FROM homing_engine_queues q WHERE q.name = e.queue)"
    ):
        out.append(("entry in a queue that does not exist", int(seq)))
    return out
