"""Reliable HTTP's dead letters (inbox) and failed deliveries (outbox): list, redrive, purge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homing.store.http_queries import (
    HTTP_CHANNEL,
    IN_SELECT,
    OUT_SELECT,
    InboxRow,
    OutboxRow,
    in_row,
    out_row,
)
from homing.store.protocol import Tx


def _ids_clause(msg_ids: Sequence[str] | None) -> tuple[str, list[Any]]:
    if msg_ids is None:
        return "", []
    return f" AND id IN ({', '.join('?' for _ in msg_ids)})", list(msg_ids)


def dead_letters(tx: Tx, *, limit: int, path: str | None = None) -> list[InboxRow]:
    sql = f"SELECT {IN_SELECT} FROM homing_http_inbox WHERE dead_at IS NOT NULL"
    params: list[Any] = []
    if path is not None:
        sql += " AND path = ?"
        params.append(path)
    rows = tx.query(sql + " ORDER BY dead_at, id LIMIT ?", [*params, limit])
    return [in_row(r) for r in rows]


def redrive_incoming(tx: Tx, msg_ids: Sequence[str] | None, *, now: float) -> int:
    """Dead letters back to ``received``, due now, attempts from zero (history kept)."""
    where, params = _ids_clause(msg_ids)
    return tx.rowcount(
        "UPDATE homing_http_inbox SET state = 'received', dead_at = NULL, attempts = 0, "
        "next_attempt_at = ?, finished_at = NULL, status = NULL, resp_content_type = NULL, "
        "resp_body = NULL, confirmed = 0 WHERE dead_at IS NOT NULL AND body IS NOT NULL" + where,
        [now, *params],
    )


def purge_dead(tx: Tx, msg_ids: Sequence[str] | None) -> int:
    """Drop dead letters' bodies for good; their ids stay known until gc (no redelivery)."""
    where, params = _ids_clause(msg_ids)
    return tx.rowcount(
        "UPDATE homing_http_inbox SET dead_at = NULL, body = NULL "
        "WHERE dead_at IS NOT NULL" + where,
        params,
    )


def failed_outgoing(tx: Tx, *, limit: int) -> list[OutboxRow]:
    rows = tx.query(
        f"SELECT {OUT_SELECT} FROM homing_http_outbox WHERE state = 'failed' "
        "ORDER BY finished_at, seq LIMIT ?",
        (limit,),
    )
    return [out_row(r) for r in rows]


def redrive_outgoing(tx: Tx, msg_ids: Sequence[str] | None, *, now: float, deadline: float) -> int:
    """Failed outbox rows back to ``pending`` under the same id (so the receiver's inbox
    still drops a repeat), due now, with a new deadline."""
    where, params = _ids_clause(msg_ids)
    n = tx.rowcount(
        "UPDATE homing_http_outbox SET state = 'pending', attempts = 0, next_attempt_at = ?, "
        "deadline = ?, finished_at = NULL, status = NULL, resp_content_type = NULL, "
        "resp_body = NULL, claim_token = NULL, claimed_until = NULL "
        "WHERE state = 'failed'" + where,
        [now, deadline, *params],
    )
    if n:
        tx.store.notify(tx, HTTP_CHANNEL)
    return n
