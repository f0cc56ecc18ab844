"""The SQL of the reliable HTTP receiver's inbox (seed 000): storing a request once by its
id, handling it at receipt or later, and confirming it. The row shapes are in
``http_queries``."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from homing.store.http_queries import IN_SELECT, InboxRow, in_row
from homing.store.protocol import Tx


def insert_incoming(tx: Tx, row: InboxRow) -> InboxRow | None:
    """Store an incoming request (a row made by ``received_row``) unless its id is known;
    returns the existing row if it was."""
    n = tx.rowcount(
        "INSERT INTO homing_http_inbox (id, path, mode, body_hash, content_type, body, "
        "response_url, state, attempts, next_attempt_at, received_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 'received', 0, ?, ?) ON CONFLICT (id) DO NOTHING",
        (
            row.id,
            row.path,
            row.mode,
            row.body_hash,
            row.content_type,
            row.body,
            row.response_url,
            row.next_attempt_at,
            row.received_at,
        ),
    )
    if n == 1:
        return None
    return incoming(tx, row.id)


def insert_received(tx: Tx, rows: Sequence[InboxRow]) -> list[bool]:
    """Store new incoming requests (rows made by ``received_row``); for each, whether it
    was stored (False: its id was known already, or came earlier in ``rows``). One
    statement for all of them on PostgreSQL; one each on SQLite, where a statement is a
    call inside this process."""
    if tx.sql.name != "postgres":
        return [insert_incoming(tx, r) is None for r in rows]
    stored = {
        str(v[0])
        for v in tx.query(
            "INSERT INTO homing_http_inbox (id, path, mode, body_hash, content_type, body, "
            "response_url, state, attempts, next_attempt_at, received_at) "
            "SELECT id, path, mode, body_hash, content_type, body, response_url, 'received', "
            "0, work_at, received_at FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], "
            "?::text[], ?::bytea[], ?::text[], ?::float8[], ?::float8[]) AS t(id, path, mode, "
            "body_hash, content_type, body, response_url, work_at, received_at) "
            "ON CONFLICT (id) DO NOTHING RETURNING id",
            (
                [r.id for r in rows],
                [r.path for r in rows],
                [r.mode for r in rows],
                [r.body_hash for r in rows],
                [r.content_type for r in rows],
                [r.body or b"" for r in rows],
                [r.response_url for r in rows],
                [r.next_attempt_at for r in rows],
                [r.received_at for r in rows],
            ),
        )
    }
    flags = []
    for r in rows:  # an id twice in one batch: the first one was stored
        flags.append(r.id in stored)
        stored.discard(r.id)
    return flags


def finish_handled(tx: Tx, msg_ids: Sequence[str], *, now: float) -> None:
    """Tombstone entries whose handler succeeded and that keep no response (Option 2),
    all in one statement: ``finish_incoming`` with state done and nothing to keep."""
    if not msg_ids:
        return
    where, params = tx.sql.in_list("id", msg_ids)
    tx.execute(
        "UPDATE homing_http_inbox SET state = 'done', finished_at = ?, status = NULL, "
        "resp_content_type = NULL, resp_body = NULL, error = NULL, next_attempt_at = NULL, "
        "body = NULL, dead_at = NULL, attempts = attempts + 1 WHERE " + where,
        [now, *params],
    )


def received_row(
    *,
    msg_id: str,
    path: str,
    mode: str,
    body_hash: str,
    content_type: str,
    body: bytes,
    response_url: str | None,
    now: float,
    work_at: float | None,
) -> InboxRow:
    """The row ``insert_incoming`` stores for a new message, as ``incoming`` would read it
    back (so the transaction that inserted it can handle it without reading it)."""
    return InboxRow(
        id=msg_id,
        path=path,
        mode=mode,
        body_hash=body_hash,
        content_type=content_type,
        body=body,
        response_url=response_url,
        state="received",
        attempts=0,
        next_attempt_at=work_at,
        received_at=now,
        finished_at=None,
        error=None,
        status=None,
        resp_content_type=None,
        resp_body=None,
        confirmed=0,
        history=None,
        dead_at=None,
    )


def incoming(tx: Tx, msg_id: str) -> InboxRow | None:
    values = tx.query_one(f"SELECT {IN_SELECT} FROM homing_http_inbox WHERE id = ?", (msg_id,))
    return in_row(values) if values is not None else None


def try_lock_message(tx: Tx, msg_id: str) -> bool:
    """Take the message's lock for this transaction; False if another transaction holds
    it (PostgreSQL: an advisory lock, so that a retry racing the first request is told
    409 at once instead of waiting for it). SQLite's one writer serialises by itself."""
    key = int.from_bytes(hashlib.sha256(b"homing-http:" + msg_id.encode()).digest()[:8], "big")
    return tx.sql.try_advisory_lock(tx, key - (1 << 63))  # a signed 64-bit key


def lock_incoming(tx: Tx, msg_id: str) -> tuple[bool, InboxRow | None]:
    """Lock the inbox row for handling. (False, None) if another transaction holds it."""
    sql = f"SELECT {IN_SELECT} FROM homing_http_inbox WHERE id = ?"
    if tx.sql.skip_locked:  # rows are locked one by one (PostgreSQL)
        values = tx.query_one(sql + tx.sql.skip_locked, (msg_id,))
        if values is None:
            exists = tx.query_one("SELECT 1 FROM homing_http_inbox WHERE id = ?", (msg_id,))
            return (exists is None), None
        return True, in_row(values)
    values = tx.query_one(sql, (msg_id,))  # SQLite: BEGIN IMMEDIATE already serialises
    return True, (in_row(values) if values is not None else None)


def due_incoming(tx: Tx, *, now: float, limit: int) -> list[str]:
    rows = tx.query(
        "SELECT id FROM homing_http_inbox WHERE state = 'received' "
        "AND next_attempt_at IS NOT NULL AND next_attempt_at <= ? "
        "ORDER BY next_attempt_at LIMIT ?",
        (now, limit),
    )
    return [str(r[0]) for r in rows]


def finish_incoming(
    tx: Tx,
    msg_id: str,
    *,
    state: str,
    now: float,
    status: int | None,
    content_type: str | None,
    body: bytes | None,
    error: str | None,
    history: str | None = None,
    dead: bool = False,
) -> None:
    """Tombstone the inbox entry: drop the request body, keep the id, hash and response.
    ``dead``: a dead letter instead, which keeps the request body for a redrive."""
    tx.execute(
        "UPDATE homing_http_inbox SET state = ?, finished_at = ?, status = ?, "
        "resp_content_type = ?, resp_body = ?, error = ?, next_attempt_at = NULL, "
        "body = CASE WHEN ? THEN body ELSE NULL END, dead_at = ?, "
        "history = COALESCE(?, history), attempts = attempts + 1 WHERE id = ?",
        (
            state,
            now,
            status,
            content_type,
            body,
            error,
            dead,
            now if dead else None,
            history,
            msg_id,
        ),
    )


def retry_incoming(
    tx: Tx, msg_id: str, *, at: float | None, error: str, history: str | None = None
) -> None:
    tx.execute(
        "UPDATE homing_http_inbox SET attempts = attempts + 1, next_attempt_at = ?, error = ?, "
        "history = COALESCE(?, history) WHERE id = ? AND state = 'received'",
        (at, error, history, msg_id),
    )


def confirm_incoming(tx: Tx, *, msg_id: str) -> bool:
    """The sender has the response: drop it (the id stays to recognise late repeats)."""
    return (
        tx.rowcount(
            "UPDATE homing_http_inbox SET confirmed = 1, resp_body = NULL "
            "WHERE id = ? AND state <> 'received'",
            (msg_id,),
        )
        == 1
    )
