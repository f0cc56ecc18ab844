"""Every SQL statement of the sessions component (seed 004), as functions over an open ``Tx``.

One row of ``homing_session_requests`` is a request for its whole life: ``queued`` (in the
request queue) -> ``replied`` (in the client's private reply queue) -> ``taken``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Literal

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


def _request(values: Sequence[Any] | None) -> dict[str, Any] | None:
    return None if values is None else dict(zip(REQUEST_COLUMNS, values, strict=True))


def _notify(tx: Tx, channel: str, key: str = "") -> None:
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
    return _request(cur.fetchone())


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
    _notify(tx, REQUEST_CHANNEL)
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
    return [r for r in (_request(v) for v in rows) if r is not None]


def session_requests(tx: Tx, client_id: str) -> list[dict[str, Any]]:
    """What the session remembers: every unfinished request and the last n replies taken."""
    rows = tx.query(
        f"SELECT {_R_COLS} FROM homing_session_requests WHERE client_id = ? "
        "AND (state <> 'taken' OR remembered = 1) ORDER BY seq",
        (client_id,),
    )
    return [r for r in (_request(v) for v in rows) if r is not None]


# -- server (Transaction 2) --------------------------------------------------------------
def next_due_request(tx: Tx, queues: Sequence[str], *, now: float) -> dict[str, Any] | None:
    """The oldest due request of ``queues``, locked until commit (other servers skip it).
    A request whose lease ran out is due again: its server died or hung."""
    clause, params = tx.sql.in_list("queue", queues)  # (SQLite: BEGIN IMMEDIATE holds the lock)
    row = tx.query_one(
        f"SELECT {_R_COLS} FROM homing_session_requests WHERE {clause} "
        "AND state = 'queued' AND available_at <= ? ORDER BY available_at, seq LIMIT 1"
        + tx.sql.skip_locked,
        (*params, now),
    )
    return _request(row)


def lease_due_request(
    tx: Tx,
    queues: Sequence[str],
    *,
    now: float,
    token: str,
    until: float,
    server: str,
    max_attempts: int,
) -> tuple[str, str, str] | Literal["dead"] | None:
    """Lease the oldest due request of ``queues`` (counting an attempt) and return its
    (id, queue, body). When it leased nothing: ``"dead"`` if a due request was taken
    ``max_attempts`` times already (its dead reply is owed: ``next_due_request`` gives
    it), else None. Other servers skip the row while this runs. On PostgreSQL one
    statement, so that an idle server's poll, and the one after each request, is one
    round trip."""
    clause, params = tx.sql.in_list("queue", queues)
    lease = (
        "UPDATE homing_session_requests SET attempts = attempts + 1, lease_token = ?, "
        "available_at = ?, server = ? WHERE id = (SELECT id FROM homing_session_requests "
        f"WHERE {clause} AND state = 'queued' AND available_at <= ? "
        f"ORDER BY available_at, seq LIMIT 1{tx.sql.skip_locked}) "
        "AND state = 'queued' AND attempts < ? RETURNING id, queue, body"
    )
    lease_params = (token, until, server, *params, now, max_attempts)
    dead = (
        f"SELECT 1 FROM homing_session_requests WHERE {clause} AND state = 'queued' "
        "AND available_at <= ? AND attempts >= ?"
    )
    dead_params = (*params, now, max_attempts)
    if tx.dialect == "postgres":  # a data-modifying WITH: SQLite has none (and no round trips)
        row = tx.query_one(
            f"WITH leased AS ({lease}) SELECT id, queue, body FROM leased UNION ALL "
            f"SELECT NULL, NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM leased) "
            f"AND EXISTS ({dead})",
            (*lease_params, *dead_params),
        )
        if row is None:
            return None
        return "dead" if row[0] is None else (str(row[0]), str(row[1]), str(row[2]))
    row = tx.query_one(lease, lease_params)
    if row is not None:
        return (str(row[0]), str(row[1]), str(row[2]))
    return "dead" if tx.query_one(dead + " LIMIT 1", dead_params) is not None else None


def lease_request(tx: Tx, request_id: str, *, token: str, until: float, server: str) -> None:
    """Count one attempt and lease the request to ``token`` until ``until``."""
    tx.execute(
        "UPDATE homing_session_requests SET attempts = attempts + 1, lease_token = ?, "
        "available_at = ?, server = ? WHERE id = ? AND state = 'queued'",
        (token, until, server, request_id),
    )


def is_write_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is SQLite refusing a deferred transaction's write
    because another connection wrote first (busy / locked): safe to retry from scratch."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, sqlite3.OperationalError) and (
            "locked" in str(seen) or "busy" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def extend_lease(tx: Tx, request_id: str, token: str, *, until: float) -> bool:
    """Keep a request leased while its handler runs; False if the lease was lost."""
    return (
        tx.rowcount(
            "UPDATE homing_session_requests SET available_at = ? WHERE id = ? "
            "AND state = 'queued' AND lease_token = ?",
            (until, request_id, token),
        )
        == 1
    )


def request_due(tx: Tx, queues: Sequence[str], *, now: float) -> bool:
    """Whether any request of ``queues`` is due: a cheap read before a locking dequeue."""
    marks = ", ".join("?" for _ in queues)
    row = tx.query_one(
        f"SELECT 1 FROM homing_session_requests WHERE queue IN ({marks}) "
        "AND state = 'queued' AND available_at <= ? LIMIT 1",
        (*queues, now),
    )
    return row is not None


def enqueue_reply(
    tx: Tx,
    request_id: str,
    *,
    reply: str | None,
    error: str | None,
    now: float,
    server: str,
    token: str | None,
) -> bool:
    """Move the request from the request queue to its client's reply queue; with a
    ``token``, only while that lease is still the request's (else nothing changes). The
    announcement wakes that client's waiters only (``Store.wakeup(key=...)``), not every
    client waiting for a reply."""
    sql = (
        "UPDATE homing_session_requests SET state = 'replied', reply = ?, reply_error = ?, "
        "replied_at = ?, server = ?, lease_token = NULL WHERE id = ? AND state = 'queued'"
    )
    params: tuple[Any, ...] = (reply, error, now, server, request_id)
    if token is not None:
        sql += " AND lease_token = ?"
        params += (token,)
    row = tx.query_one(sql + " RETURNING client_id", params)
    if row is None:
        return False
    _notify(tx, REPLY_CHANNEL, str(row[0]))
    return True


def release_request(
    tx: Tx, request_id: str, token: str, *, error: str, available_at: float
) -> bool:
    """A handler failed: record why and make the request due again at ``available_at``."""
    released = (
        tx.rowcount(
            "UPDATE homing_session_requests SET last_error = ?, available_at = ?, "
            "lease_token = NULL WHERE id = ? AND state = 'queued' AND lease_token = ?",
            (error, available_at, request_id, token),
        )
        == 1
    )
    if released:
        _notify(tx, REQUEST_CHANNEL)
    return released


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
    return _request(tx.query_one(*_reply_pick(tx, _R_COLS, client_id, request_id)))


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
