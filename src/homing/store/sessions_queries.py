"""Every SQL statement of the sessions component (seed 004), as functions over an open ``Tx``.

One row of ``homing_session_requests`` is a request for its whole life: ``queued`` (in the
request queue) -> ``replied`` (in the client's private reply queue) -> ``taken``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homing.store.protocol import Pending, Tx

SESSION_COLUMNS = (
    "client_id",
    "created_at",
    "reconnected_at",
    "connects",
    "keep_replies",
    "last_request_id",
    "last_request_queue",
    "last_request_body",
    "last_request_at",
    "last_enqueued_id",
    "last_dequeued_id",
    "epoch",
    "active_at",
)
REQUEST_COLUMNS = (
    "seq",
    "id",
    "client_id",
    "queue",
    "body",
    "state",
    "attempts",
    "available_at",
    "last_error",
    "reply",
    "reply_error",
    "server",
    "created_at",
    "replied_at",
    "taken_at",
    "confirmed_at",
    "remembered",
    "lease_token",
)
PREPARED_COLUMNS = ("id", "client_id", "queue", "body", "prepared_at")
_S_COLS = ", ".join(SESSION_COLUMNS)
_R_COLS = ", ".join(REQUEST_COLUMNS)
_P_COLS = ", ".join(PREPARED_COLUMNS)

REQUEST_CHANNEL = "homing_session_requests"
REPLY_CHANNEL = "homing_session_replies"


def _session(values: Sequence[Any] | None) -> dict[str, Any] | None:
    return None if values is None else dict(zip(SESSION_COLUMNS, values, strict=True))


def request_row(values: Sequence[Any] | None) -> dict[str, Any] | None:
    return None if values is None else dict(zip(REQUEST_COLUMNS, values, strict=True))


def announce(tx: Tx, channel: str, key: str = "") -> None:
    tx.store.notify(tx, channel, key)


# -- sessions ----------------------------------------------------------------------------
def open_session(
    tx: Tx,
    client_id: str,
    *,
    now: float,
    keep_replies: int | None,
    default_keep: int,
    ttl: float,
) -> tuple[dict[str, Any], bool]:
    """Create the client's session or re-establish the existing one; True if created.
    ``ttl``: the idle time the opener promised the session survives (``expire_sessions``)."""
    created = (
        tx.rowcount(
            "INSERT INTO homing_sessions (client_id, created_at, reconnected_at, connects, "
            "keep_replies, epoch, active_at, ttl_s) VALUES (?, ?, ?, 1, ?, 1, ?, ?) "
            "ON CONFLICT (client_id) DO NOTHING",
            (
                client_id,
                now,
                now,
                default_keep if keep_replies is None else keep_replies,
                now,
                ttl,
            ),
        )
        == 1
    )
    if not created:
        tx.execute(
            "UPDATE homing_sessions SET connects = connects + 1, epoch = epoch + 1, "
            "reconnected_at = ?, active_at = ?, keep_replies = COALESCE(?, keep_replies), "
            "ttl_s = ? WHERE client_id = ?",
            (now, now, keep_replies, ttl, client_id),
        )
    row = get_session(tx, client_id)
    assert row is not None
    return row, created


def get_session(tx: Tx, client_id: str) -> dict[str, Any] | None:
    return _session(
        tx.query_one(f"SELECT {_S_COLS} FROM homing_sessions WHERE client_id = ?", (client_id,))
    )


def lock_session(tx: Tx, client_id: str, *, now: float) -> dict[str, Any] | None:
    """Mark the session active and hold its row until commit, so one client's steps
    serialise (and a fenced process sees the newer epoch)."""
    return defer_lock_session(tx, client_id, now=now).get()


def defer_lock_session(tx: Tx, client_id: str, *, now: float) -> Pending[dict[str, Any] | None]:
    """``lock_session``, read later (``Tx.defer``): the statements sent after it wait for
    the lock on the server all the same."""
    return tx.defer(
        f"UPDATE homing_sessions SET active_at = ? WHERE client_id = ? RETURNING {_S_COLS}",
        (now, client_id),
        _first_session,
    )


def _first_session(cur: Any) -> dict[str, Any] | None:
    return _session(cur.fetchone())


def _first_request(cur: Any) -> dict[str, Any] | None:
    return request_row(cur.fetchone())


def _one_row_changed(cur: Any) -> bool:
    return int(cur.rowcount) == 1


def set_last_request(
    tx: Tx, client_id: str, request_id: str | None, queue: str | None, body: str | None, now: float
) -> None:
    """Transaction 0: remember the request the client is about to submit (or forget it)."""
    tx.execute(
        "UPDATE homing_sessions SET last_request_id = ?, last_request_queue = ?, "
        "last_request_body = ?, last_request_at = ? WHERE client_id = ?",
        (request_id, queue, body, now if request_id is not None else None, client_id),
    )


def set_last_enqueued(tx: Tx, client_id: str, request_id: str) -> None:
    tx.execute(
        "UPDATE homing_sessions SET last_enqueued_id = ? WHERE client_id = ?",
        (request_id, client_id),
    )


def set_last_dequeued(tx: Tx, client_id: str, request_id: str) -> None:
    tx.execute(
        "UPDATE homing_sessions SET last_dequeued_id = ? WHERE client_id = ?",
        (request_id, client_id),
    )


def delete_session(tx: Tx, client_id: str) -> bool:
    return tx.rowcount("DELETE FROM homing_sessions WHERE client_id = ?", (client_id,)) == 1


# -- prepared requests (Transaction 0) ---------------------------------------------------
def defer_insert_prepared(
    tx: Tx, *, request_id: str, client_id: str, queue: str, body: str, now: float
) -> Pending[bool]:
    """Remember a request the client is about to submit; False if the id is prepared
    already (read later, ``Tx.defer``)."""
    return tx.defer(
        "INSERT INTO homing_session_prepared (id, client_id, queue, body, prepared_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        (request_id, client_id, queue, body, now),
        _one_row_changed,
    )


def get_prepared(tx: Tx, request_id: str) -> dict[str, Any] | None:
    row = tx.query_one(f"SELECT {_P_COLS} FROM homing_session_prepared WHERE id = ?", (request_id,))
    return None if row is None else dict(zip(PREPARED_COLUMNS, row, strict=True))


def list_prepared(tx: Tx, client_id: str) -> list[dict[str, Any]]:
    """Every prepared-but-unsubmitted request of the client, oldest first."""
    rows = tx.query(
        f"SELECT {_P_COLS} FROM homing_session_prepared WHERE client_id = ? "
        "ORDER BY prepared_at, id",
        (client_id,),
    )
    return [dict(zip(PREPARED_COLUMNS, r, strict=True)) for r in rows]


def defer_count_prepared(tx: Tx, client_id: str) -> Pending[int]:
    """How many prepared requests the client has (read later, ``Tx.defer``)."""
    return tx.defer(
        "SELECT COUNT(*) FROM homing_session_prepared WHERE client_id = ?",
        (client_id,),
        _count,
    )


def _count(cur: Any) -> int:
    row = cur.fetchone()
    return int(row[0]) if row else 0


def delete_prepared(tx: Tx, client_id: str, request_id: str) -> None:
    tx.execute(
        "DELETE FROM homing_session_prepared WHERE client_id = ? AND id = ?",
        (client_id, request_id),
    )


def count_open_requests(tx: Tx, client_id: str) -> int:
    row = tx.query_one(
        "SELECT COUNT(*) FROM homing_session_requests WHERE client_id = ? AND state <> 'taken'",
        (client_id,),
    )
    return int(row[0]) if row else 0


def forget_client(tx: Tx, client_id: str) -> None:
    tx.execute(
        "UPDATE homing_session_requests SET remembered = 0 WHERE client_id = ? AND remembered = 1",
        (client_id,),
    )


# -- requests (Transaction 1) ------------------------------------------------------------
def defer_insert_request(
    tx: Tx, *, request_id: str, client_id: str, queue: str, body: str, now: float
) -> Pending[bool]:
    """Enqueue a request and announce it; False if a request with this id exists already
    (nothing written; read later, ``Tx.defer``). The announcement is sent with it: when
    this says False the caller raises, and the rollback takes the announcement back."""
    inserted = tx.defer(
        "INSERT INTO homing_session_requests (id, client_id, queue, body, state, "
        "available_at, created_at) VALUES (?, ?, ?, ?, 'queued', ?, ?) "
        "ON CONFLICT (id) DO NOTHING",
        (request_id, client_id, queue, body, now, now),
        _one_row_changed,
    )
    announce(tx, REQUEST_CHANNEL)
    return inserted


def get_request(tx: Tx, request_id: str) -> dict[str, Any] | None:
    return defer_get_request(tx, request_id).get()


def defer_get_request(tx: Tx, request_id: str) -> Pending[dict[str, Any] | None]:
    return tx.defer(
        f"SELECT {_R_COLS} FROM homing_session_requests WHERE id = ?",
        (request_id,),
        _first_request,
    )


def get_requests(tx: Tx, request_ids: Sequence[str]) -> list[dict[str, Any]]:
    if not request_ids:
        return []
    marks = ", ".join("?" for _ in request_ids)
    rows = tx.query(
        f"SELECT {_R_COLS} FROM homing_session_requests WHERE id IN ({marks})", list(request_ids)
    )
    return [r for r in (request_row(v) for v in rows) if r is not None]


def session_requests(tx: Tx, client_id: str) -> list[dict[str, Any]]:
    """What the session remembers: every unfinished request and the last n replies taken."""
    rows = tx.query(
        f"SELECT {_R_COLS} FROM homing_session_requests WHERE client_id = ? "
        "AND (state <> 'taken' OR remembered = 1) ORDER BY seq",
        (client_id,),
    )
    return [r for r in (request_row(v) for v in rows) if r is not None]


# -- client (Transaction 3) --------------------------------------------------------------
def reply_waiting(
    tx: Tx, client_id: str, request_id: str | None
) -> tuple[dict[str, Any] | None, bool]:
    """The client's session (None: there is none) and whether it has a reply to take (the
    one to ``request_id``, if given): one cheap read, no lock, before a taking
    transaction."""
    which = "" if request_id is None else " AND r.id = ?"
    params: tuple[Any, ...] = (client_id,) if request_id is None else (client_id, request_id)
    row = tx.query_one(
        f"SELECT {_S_COLS}, EXISTS (SELECT 1 FROM homing_session_requests r WHERE "
        f"r.client_id = ? AND r.state = 'replied'{which}) FROM homing_sessions "
        "WHERE client_id = ?",
        (*params, client_id),
    )
    if row is None:
        return None, False
    return _session(row[:-1]), bool(row[-1])


def _reply_pick(
    tx: Tx, columns: str, client_id: str, request_id: str | None
) -> tuple[str, tuple[Any, ...]]:
    """The SELECT of the client's oldest reply (or the reply to ``request_id``), locked
    until commit and passed over while another transaction holds it (PostgreSQL)."""
    lock = tx.sql.skip_locked
    if request_id is None:
        return (
            f"SELECT {columns} FROM homing_session_requests WHERE client_id = ? "
            f"AND state = 'replied' ORDER BY replied_at, seq LIMIT 1{lock}",
            (client_id,),
        )
    return (
        f"SELECT {columns} FROM homing_session_requests WHERE client_id = ? AND id = ? "
        f"AND state = 'replied'{lock}",
        (client_id, request_id),
    )


def next_reply(tx: Tx, client_id: str, request_id: str | None) -> dict[str, Any] | None:
    """The client's oldest reply (or the reply to ``request_id``), locked until commit."""
    return request_row(tx.query_one(*_reply_pick(tx, _R_COLS, client_id, request_id)))


def defer_take_next_reply(
    tx: Tx, client_id: str, request_id: str | None, *, now: float
) -> Pending[dict[str, Any] | None]:
    """``next_reply`` taken in the same statement (marked taken and remembered): its row
    as taken, or None (read later, ``Tx.defer``)."""
    pick, params = _reply_pick(tx, "id", client_id, request_id)
    return tx.defer(
        "UPDATE homing_session_requests SET state = 'taken', taken_at = ?, remembered = 1 "
        f"WHERE id = ({pick}) AND state = 'replied' RETURNING {_R_COLS}",
        (now, *params),
        _first_request,
    )


def trim_remembered(tx: Tx, client_id: str, keep: int) -> None:
    """Let the session remember only the last ``keep`` replies taken and not confirmed."""
    tx.execute(
        "UPDATE homing_session_requests SET remembered = 0 WHERE client_id = ? "
        "AND remembered = 1 AND seq NOT IN (SELECT seq FROM homing_session_requests "
        "WHERE client_id = ? AND remembered = 1 ORDER BY taken_at DESC, seq DESC LIMIT ?)",
        (client_id, client_id, keep),
    )


def confirm_replies(tx: Tx, client_id: str, request_ids: Sequence[str], *, now: float) -> int:
    """The client has its own durable record of these replies: the session forgets them."""
    if not request_ids:
        return 0
    marks = ", ".join("?" for _ in request_ids)
    return tx.rowcount(
        "UPDATE homing_session_requests SET remembered = 0, "
        "confirmed_at = COALESCE(confirmed_at, ?) "
        f"WHERE client_id = ? AND state = 'taken' AND id IN ({marks})",
        (now, client_id, *request_ids),
    )


# -- retention ---------------------------------------------------------------------------
def gc(tx: Tx, *, taken_before: float) -> int:
    """Delete finished requests (reply taken, no longer remembered) taken before the cutoff."""
    return tx.rowcount(
        "DELETE FROM homing_session_requests WHERE state = 'taken' AND remembered = 0 "
        "AND taken_at < ?",
        (taken_before,),
    )


def expire_sessions(tx: Tx, *, idle_before: float, now: float, limit: int = 1000) -> int:
    """Delete up to ``limit`` sessions idle since before the cutoff and for longer than
    their own TTL (what their opener promised), with their prepared requests and every
    request and reply of theirs; returns how many sessions."""
    clients = [
        str(r[0])
        for r in tx.query(
            "SELECT client_id FROM homing_sessions WHERE COALESCE(active_at, reconnected_at) < ? "
            "AND COALESCE(active_at, reconnected_at) + COALESCE(ttl_s, 0) < ? "
            "ORDER BY COALESCE(active_at, reconnected_at) LIMIT ?",
            (idle_before, now, limit),
        )
    ]
    if not clients:
        return 0
    marks = ", ".join("?" for _ in clients)
    tx.execute(f"DELETE FROM homing_session_prepared WHERE client_id IN ({marks})", clients)
    tx.execute(f"DELETE FROM homing_session_requests WHERE client_id IN ({marks})", clients)
    return tx.rowcount(f"DELETE FROM homing_sessions WHERE client_id IN ({marks})", clients)


def table_sizes(tx: Tx) -> dict[str, int]:
    """Row counts of the sessions tables, for ``homing gc`` reports and tests."""
    sizes: dict[str, int] = {}
    for table in ("homing_sessions", "homing_session_requests", "homing_session_prepared"):
        row = tx.query_one(f"SELECT COUNT(*) FROM {table}")
        sizes[table] = int(row[0]) if row else 0
    return sizes


def queue_depths(tx: Tx) -> list[tuple[str, str, int]]:
    """(queue, state, count) for requests not yet taken, for ``homing sessions`` stats."""
    rows = tx.query(
        "SELECT queue, state, COUNT(*) FROM homing_session_requests WHERE state <> 'taken' "
        "GROUP BY queue, state ORDER BY queue, state"
    )
    return [(str(q), str(s), int(n)) for q, s, n in rows]
