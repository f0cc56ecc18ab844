"""Every SQL statement of reliable HTTP messaging (seed 000): the rows of both tables,
the outbox, counts and gc. The inbox's statements are in ``http_inbox_queries``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from homing.store import retention_queries
from homing.store.protocol import Tx

OUT_COLUMNS = (
    "seq",
    "id",
    "kind",
    "method",
    "url",
    "content_type",
    "body",
    "response_url",
    "in_reply_to",
    "reply_status",
    "state",
    "attempts",
    "next_attempt_at",
    "deadline",
    "claim_token",
    "claimed_until",
    "created_at",
    "finished_at",
    "last_error",
    "status",
    "resp_content_type",
    "resp_body",
    "confirm_url",
    "headers",
    "status_url",
)
OUT_SELECT = ", ".join(OUT_COLUMNS)

IN_COLUMNS = (
    "id",
    "path",
    "mode",
    "body_hash",
    "content_type",
    "body",
    "response_url",
    "state",
    "attempts",
    "next_attempt_at",
    "received_at",
    "finished_at",
    "error",
    "status",
    "resp_content_type",
    "resp_body",
    "confirmed",
    "history",
    "dead_at",
)
IN_SELECT = ", ".join(IN_COLUMNS)


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return bytes(value)


@dataclass(frozen=True)
class OutboxRow:
    seq: int
    id: str
    kind: str
    method: str
    url: str
    content_type: str
    body: bytes
    response_url: str | None
    in_reply_to: str | None
    reply_status: int | None
    state: str
    attempts: int
    next_attempt_at: float | None
    deadline: float
    claim_token: str | None
    claimed_until: float | None
    created_at: float
    finished_at: float | None
    last_error: str | None
    status: int | None
    resp_content_type: str | None
    resp_body: bytes | None
    confirm_url: str | None
    headers: str | None  # the sender's own request headers, JSON
    status_url: str | None  # an accepted job: where the receiver tells how it went


@dataclass(frozen=True)
class InboxRow:
    id: str
    path: str
    mode: str
    body_hash: str
    content_type: str
    body: bytes | None
    response_url: str | None
    state: str
    attempts: int
    next_attempt_at: float | None
    received_at: float
    finished_at: float | None
    error: str | None
    status: int | None
    resp_content_type: str | None
    resp_body: bytes | None
    confirmed: int
    history: str | None  # JSON list of {"at", "error"} of the failed attempts
    dead_at: float | None  # set: a dead letter (body kept until redriven or purged)


def out_row(values: Sequence[Any]) -> OutboxRow:
    row = dict(zip(OUT_COLUMNS, values, strict=True))
    row["body"] = _bytes(row["body"]) or b""
    row["resp_body"] = _bytes(row["resp_body"])
    return OutboxRow(**row)


def in_row(values: Sequence[Any]) -> InboxRow:
    row = dict(zip(IN_COLUMNS, values, strict=True))
    row["body"] = _bytes(row["body"])
    row["resp_body"] = _bytes(row["resp_body"])
    return InboxRow(**row)


# -- outbox ------------------------------------------------------------------------------
@dataclass(frozen=True)
class NewOutgoing:
    id: str
    kind: str
    method: str
    url: str
    content_type: str
    body: bytes
    response_url: str | None
    in_reply_to: str | None
    reply_status: int | None
    deadline: float
    created_at: float
    headers: str | None = None


def insert_outgoing(
    tx: Tx, msgs: Sequence[NewOutgoing], *, claim: tuple[str, float] | None = None
) -> None:
    """Store outgoing requests, due at once. A repeated id is ignored (idempotent insert).
    ``claim`` (token, until): stored already claimed by that dispatcher (a hand-off to
    the one in this process, ``homing.http._handoff``); no other claims them before then."""
    token, until = claim if claim is not None else (None, None)
    tx.executemany(
        "INSERT INTO homing_http_outbox (id, kind, method, url, content_type, body, "
        "response_url, in_reply_to, reply_status, state, attempts, next_attempt_at, deadline, "
        "created_at, headers, claim_token, claimed_until) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO NOTHING",
        [
            (
                m.id,
                m.kind,
                m.method,
                m.url,
                m.content_type,
                m.body,
                m.response_url,
                m.in_reply_to,
                m.reply_status,
                m.created_at,
                m.deadline,
                m.created_at,
                m.headers,
                token,
                until,
            )
            for m in msgs
        ],
    )
    if claim is None:  # a claimed row is for this process's dispatcher alone
        tx.store.notify(tx, HTTP_CHANNEL)


HTTP_CHANNEL = "homing_http"


def notify_channel(tx: Tx) -> str:
    schema = getattr(tx.store, "schema", None)
    return f"{schema}_homing_http" if schema else "homing_http"


def outgoing(tx: Tx, msg_id: str) -> OutboxRow | None:
    values = tx.query_one(f"SELECT {OUT_SELECT} FROM homing_http_outbox WHERE id = ?", (msg_id,))
    return out_row(values) if values is not None else None


def claim_work(tx: Tx, *, now: float, until: float, token: str, limit: int) -> list[OutboxRow]:
    """Lease up to ``limit`` rows with due work (delivery or confirmation) to one dispatcher."""
    pick = (
        "SELECT seq FROM homing_http_outbox WHERE next_attempt_at IS NOT NULL "
        "AND next_attempt_at <= ? AND (claimed_until IS NULL OR claimed_until < ?) "
        "ORDER BY next_attempt_at, seq LIMIT ?"
    )
    pick += tx.sql.skip_locked
    rows = tx.query(
        f"UPDATE homing_http_outbox SET claim_token = ?, claimed_until = ? "
        f"WHERE seq IN ({pick}) RETURNING {OUT_SELECT}",
        (token, until, now, now, limit),
    )
    out = [out_row(r) for r in rows]
    out.sort(key=lambda r: r.seq)
    return out


def live_claims(tx: Tx, *, now: float) -> list[str]:
    rows = tx.query(
        "SELECT DISTINCT claim_token FROM homing_http_outbox "
        "WHERE claim_token IS NOT NULL AND claimed_until >= ?",
        (now,),
    )
    return [str(r[0]) for r in rows]


def release_claims(tx: Tx, token: str) -> None:
    tx.execute(
        "UPDATE homing_http_outbox SET claim_token = NULL, claimed_until = NULL "
        "WHERE claim_token = ?",
        (token,),
    )


def mark_delivered(
    tx: Tx,
    msg_id: str,
    token: str,
    *,
    state: str,
    now: float,
    status: int,
    content_type: str | None,
    body: bytes | None,
    confirm_url: str | None,
    status_url: str | None = None,
    check_at: float | None = None,
) -> bool:
    """Tombstone: the row is never sent again. Keeps the response; schedules the DELETE
    (or, for an accepted job with a ``status_url``, a status check at ``check_at``)."""
    return (
        tx.rowcount(
            "UPDATE homing_http_outbox SET state = ?, status = ?, resp_content_type = ?, "
            "resp_body = ?, confirm_url = ?, status_url = ?, next_attempt_at = ?, "
            "claim_token = NULL, "
            "claimed_until = NULL, attempts = attempts + 1, "
            "finished_at = CASE WHEN ? = 'delivered' THEN ? ELSE finished_at END "
            "WHERE id = ? AND claim_token = ? AND state = 'pending'",
            (
                state,
                status,
                content_type,
                body,
                confirm_url,
                status_url,
                now if confirm_url else check_at,
                state,
                now,
                msg_id,
                token,
            ),
        )
        == 1
    )


def check_later(tx: Tx, msg_id: str, token: str, *, at: float) -> None:
    """An accepted job is still running (or its state is unknown): look again at ``at``."""
    tx.execute(
        "UPDATE homing_http_outbox SET next_attempt_at = ?, claim_token = NULL, "
        "claimed_until = NULL WHERE id = ? AND claim_token = ? AND state = 'accepted'",
        (at, msg_id, token),
    )


def reply_for(tx: Tx, job_id: str) -> OutboxRow | None:
    """The result message this receiver made for the job ``job_id`` (None: not yet)."""
    values = tx.query_one(
        f"SELECT {OUT_SELECT} FROM homing_http_outbox WHERE in_reply_to = ? AND kind = 'reply'",
        (job_id,),
    )
    return out_row(values) if values is not None else None


def mark_retry(tx: Tx, msg_id: str, token: str, *, at: float, error: str) -> bool:
    return (
        tx.rowcount(
            "UPDATE homing_http_outbox SET next_attempt_at = ?, last_error = ?, "
            "attempts = attempts + 1, claim_token = NULL, claimed_until = NULL "
            "WHERE id = ? AND claim_token = ? AND state = 'pending'",
            (at, error, msg_id, token),
        )
        == 1
    )


def postpone(tx: Tx, *, msg_id: str, token: str, at: float) -> None:
    """Release a claimed row unsent until ``at`` (a rate limit): no attempt is counted."""
    tx.execute(
        "UPDATE homing_http_outbox SET next_attempt_at = ?, claim_token = NULL, "
        "claimed_until = NULL WHERE id = ? AND claim_token = ? AND state = 'pending'",
        (at, msg_id, token),
    )


def mark_failed(
    tx: Tx,
    msg_id: str,
    *,
    now: float,
    error: str,
    status: int | None,
    content_type: str | None,
    body: bytes | None,
    token: str | None = None,
) -> bool:
    """End a pending (or accepted job) row with an error the caller sees as an exception."""
    sql = (
        "UPDATE homing_http_outbox SET state = 'failed', finished_at = ?, last_error = ?, "
        "status = ?, resp_content_type = ?, resp_body = ?, next_attempt_at = NULL, "
        "claim_token = NULL, claimed_until = NULL WHERE id = ? "
        "AND state IN ('pending', 'accepted')"
    )
    params: list[Any] = [now, error, status, content_type, body, msg_id]
    if token is not None:
        sql += " AND claim_token = ?"
        params.append(token)
    return tx.rowcount(sql, params) == 1


def confirm_done(tx: Tx, msg_id: str, token: str) -> None:
    tx.execute(
        "UPDATE homing_http_outbox SET next_attempt_at = NULL, confirm_url = NULL, "
        "claim_token = NULL, claimed_until = NULL WHERE id = ? AND claim_token = ?",
        (msg_id, token),
    )


def confirm_retry(tx: Tx, msg_id: str, token: str, *, at: float, error: str) -> None:
    tx.execute(
        "UPDATE homing_http_outbox SET next_attempt_at = ?, last_error = ?, "
        "claim_token = NULL, claimed_until = NULL WHERE id = ? AND claim_token = ?",
        (at, error, msg_id, token),
    )


def record_job_result(
    tx: Tx, msg_id: str, *, now: float, status: int, content_type: str, body: bytes
) -> str | None:
    """Store a job's result delivered to the reply node; returns the row's previous state
    (None if no such job). A result for a finished row changes nothing."""
    found = tx.query_one("SELECT state, kind FROM homing_http_outbox WHERE id = ?", (msg_id,))
    if found is None or found[1] != "job":
        return None
    state = str(found[0])
    if state in ("pending", "accepted"):
        final = "delivered" if 200 <= status < 300 else "failed"
        tx.execute(
            "UPDATE homing_http_outbox SET state = ?, status = ?, resp_content_type = ?, "
            "resp_body = ?, finished_at = ?, next_attempt_at = NULL, claim_token = NULL, "
            "claimed_until = NULL, last_error = CASE WHEN ? = 'failed' "
            "THEN 'the job failed on the receiver' ELSE last_error END WHERE id = ?",
            (final, status, content_type, body, now, final, msg_id),
        )
    return state


def outbox_counts(tx: Tx) -> dict[str, int]:
    rows = tx.query("SELECT state, COUNT(*) FROM homing_http_outbox GROUP BY state")
    return {str(s): int(n) for s, n in rows}


def inbox_counts(tx: Tx) -> dict[str, int]:
    rows = tx.query("SELECT state, COUNT(*) FROM homing_http_inbox GROUP BY state")
    return {str(s): int(n) for s, n in rows}


def gc(tx: Tx, *, before: float, now: float) -> tuple[int, int]:
    """Forget finished outbox rows older than ``before``, and handled inbox ids older than
    ``before`` and than every retention a receiver promised that still binds
    (``retention_queries``), so that no gc forgets an id a sender was told is remembered."""
    inbox_before = retention_queries.keep_before(tx, retention_queries.HTTP_INBOX, before, now=now)
    out = tx.rowcount(
        "DELETE FROM homing_http_outbox WHERE finished_at IS NOT NULL AND finished_at < ? "
        "AND next_attempt_at IS NULL",
        (before,),
    )
    inn = tx.rowcount(
        "DELETE FROM homing_http_inbox WHERE received_at < ? AND dead_at IS NULL "
        "AND (state <> 'received' OR mode = 'put')",
        (inbox_before,),
    )
    return out, inn
