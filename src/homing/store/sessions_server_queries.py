"""The sessions server's statements (seed 004, Transaction 2): taking a due request under
a lease, keeping or releasing the lease, and moving the reply to its client's queue. The
row shapes and the other transactions' statements are in ``sessions_queries``."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Literal

from homing.store.protocol import Tx
from homing.store.sessions_queries import (
    REPLY_CHANNEL,
    REQUEST_CHANNEL,
    REQUEST_COLUMNS,
    announce,
    request_row,
)

_R_COLS = ", ".join(REQUEST_COLUMNS)


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
    return request_row(row)


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
    announce(tx, REPLY_CHANNEL, str(row[0]))
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
        announce(tx, REQUEST_CHANNEL)
    return released
