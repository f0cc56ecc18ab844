"""Job results. On the sender: its reply node, where results delivered to
``/_homing/reply`` are recorded against the job's outbox row, in one transaction with the
result message's inbox entry. On the receiver: the status of a job (and a result it could
not deliver) for ``GET /_homing/inbox/{id}``."""

from __future__ import annotations

import base64
from typing import Any

from homing.database import Database
from homing.store import http_inbox_queries as iq
from homing.store import http_queries as q


class _UnknownJob(Exception):
    pass


def store_reply(
    db: Database,
    reply_path: str,
    msg_id: str,
    job_id: str,
    status: int,
    digest: str,
    ctype: str,
    body: bytes,
) -> str:
    """Record a job's result for the waiting caller: ``new``, ``duplicate`` (a repeat of
    the result message), ``conflict`` (its id with another body) or ``unknown`` (no such
    job in this store's outbox: nothing is stored)."""
    now = db.clock.now()
    try:
        return _store_reply_tx(db, reply_path, msg_id, job_id, status, digest, ctype, body, now)
    except _UnknownJob:
        return "unknown"  # rolled back: nothing was stored


def _store_reply_tx(
    db: Database,
    reply_path: str,
    msg_id: str,
    job_id: str,
    status: int,
    digest: str,
    ctype: str,
    body: bytes,
    now: float,
) -> str:
    with db.store.transaction() as tx:
        existing = iq.insert_incoming(
            tx,
            iq.received_row(
                msg_id=msg_id,
                path=reply_path,
                mode="reply",
                body_hash=digest,
                content_type=ctype,
                body=b"",
                response_url=None,
                now=now,
                work_at=None,
            ),
        )
        if existing is not None:
            return "conflict" if existing.body_hash != digest else "duplicate"
        if (
            q.record_job_result(tx, job_id, now=now, status=status, content_type=ctype, body=body)
            is None
        ):
            raise _UnknownJob
        iq.finish_incoming(
            tx,
            msg_id,
            state="done",
            now=now,
            status=204,
            content_type=None,
            body=None,
            error=None,
        )
    return "new"


def job_status(db: Database, msg_id: str) -> dict[str, Any] | None:
    """The answer of ``GET /_homing/inbox/{id}`` (None: unknown id)."""
    with db.store.transaction(write=False) as tx:
        row = iq.incoming(tx, msg_id)
        reply = q.reply_for(tx, msg_id) if row is not None and row.mode == "job" else None
    if row is None:
        return None
    out: dict[str, Any] = {"id": msg_id, "mode": row.mode, "state": row.state, "result": None}
    if reply is not None:
        result: dict[str, Any] = {"state": reply.state, "error": reply.last_error}
        if reply.state == "failed":  # undeliverable: hand it to the sender this way
            result.update(
                status=reply.reply_status,
                content_type=reply.content_type,
                body=base64.b64encode(reply.body).decode(),
            )
        out["result"] = result
    return out
