"""The dashboard's reads of the other parts' tables: the HTTP outbox and inbox, client
sessions and the durable messenger. Each is grouped through an index of live rows, or
bounded by a recent window or a LIMIT, so that a page costs little on a big store."""

from __future__ import annotations

from typing import Any

from homing.store.protocol import Tx


def http_outbox(tx: Tx, *, now: float, window: float, limit: int) -> list[dict[str, Any]]:
    """Per destination URL: pending (waiting for an attempt), retrying (of those, tried
    before), the oldest pending one's age, failed, and tombstones (delivered within
    ``window``: kept so that a repeat is recognised)."""
    out: dict[str, dict[str, Any]] = {}

    def row(url: Any) -> dict[str, Any]:
        return out.setdefault(
            str(url),
            {
                "url": str(url),
                "pending": 0,
                "retrying": 0,
                "oldest_s": None,
                "failed": 0,
                "delivered": 0,
            },
        )

    for url, n, retrying, oldest in tx.query(
        "SELECT url, COUNT(*), SUM(CASE WHEN attempts > 0 THEN 1 ELSE 0 END), MIN(created_at) "
        "FROM homing_http_outbox WHERE next_attempt_at IS NOT NULL GROUP BY url "
        "ORDER BY COUNT(*) DESC LIMIT ?",
        (limit,),
    ):
        r = row(url)
        r.update(pending=int(n), retrying=int(retrying or 0), oldest_s=now - float(oldest))
    for url, n in tx.query(
        "SELECT url, COUNT(*) FROM homing_http_outbox WHERE state = 'failed' "
        "GROUP BY url ORDER BY COUNT(*) DESC LIMIT ?",
        (limit,),
    ):
        row(url)["failed"] = int(n)
    for url, n in tx.query(
        "SELECT url, COUNT(*) FROM homing_http_outbox WHERE finished_at >= ? "
        "AND state = 'delivered' GROUP BY url ORDER BY COUNT(*) DESC LIMIT ?",
        (now - window, limit),
    ):
        row(url)["delivered"] = int(n)
    return sorted(out.values(), key=lambda r: (-r["pending"], -r["failed"], r["url"]))


def http_inbox(tx: Tx, *, now: float, window: float, limit: int) -> list[dict[str, Any]]:
    """Per receiving path: messages waiting for their handler, dead letters, and those
    received within ``window``."""
    out: dict[str, dict[str, Any]] = {}

    def row(path: Any) -> dict[str, Any]:
        return out.setdefault(str(path), {"path": str(path), "waiting": 0, "dead": 0, "recent": 0})

    for path, n in tx.query(
        "SELECT path, COUNT(*) FROM homing_http_inbox WHERE state = 'received' "
        "AND next_attempt_at IS NOT NULL GROUP BY path LIMIT ?",
        (limit,),
    ):
        row(path)["waiting"] = int(n)
    for path, n in tx.query(
        "SELECT path, COUNT(*) FROM homing_http_inbox WHERE dead_at IS NOT NULL "
        "GROUP BY path LIMIT ?",
        (limit,),
    ):
        row(path)["dead"] = int(n)
    for path, n in tx.query(
        "SELECT path, COUNT(*) FROM homing_http_inbox WHERE received_at >= ? GROUP BY path LIMIT ?",
        (now - window, limit),
    ):
        row(path)["recent"] = int(n)
    return sorted(out.values(), key=lambda r: r["path"])


def sessions(tx: Tx, *, limit: int) -> list[dict[str, Any]]:
    """The most recently active client sessions, with their requests by recovery state:
    A prepared (not enqueued), B queued, C replied (not taken), D taken and remembered."""
    clients = tx.query(
        "SELECT client_id, connects, created_at, active_at, last_enqueued_id, last_dequeued_id "
        "FROM homing_sessions ORDER BY active_at DESC LIMIT ?",
        (limit,),
    )
    out = []
    for client_id, connects, created, active, enq, deq in clients:
        states = {"A": 0, "B": 0, "C": 0, "D": 0}
        for state, n in tx.query(
            "SELECT state, COUNT(*) FROM homing_session_requests WHERE client_id = ? "
            "AND (state <> 'taken' OR remembered = 1) GROUP BY state",
            (client_id,),
        ):
            states[{"queued": "B", "replied": "C", "taken": "D"}.get(str(state), "D")] += int(n)
        prepared = tx.query_one(
            "SELECT COUNT(*) FROM homing_session_prepared WHERE client_id = ?", (client_id,)
        )
        states["A"] = int(prepared[0]) if prepared else 0
        out.append(
            {
                "client": str(client_id),
                "connects": int(connects),
                "created_at": created,
                "active_at": active,
                "last_enqueued": enq,
                "last_dequeued": deq,
                **states,
            }
        )
    return out


def messenger(tx: Tx, *, limit: int) -> dict[str, Any]:
    """Unacknowledged messages per owner and channel, and the latest dead letters."""
    pending = [
        {"owner": str(o), "channel": str(c), "unacked": int(n), "oldest_at": float(t)}
        for o, c, n, t in tx.query(
            "SELECT owner, channel, COUNT(*), MIN(created_at) FROM homing_messenger_out "
            "GROUP BY owner, channel ORDER BY COUNT(*) DESC LIMIT ?",
            (limit,),
        )
    ]
    names = (
        "owner",
        "direction",
        "peer",
        "channel",
        "message_id",
        "callback",
        "reason",
        "attempts",
        "failed_at",
    )
    dead = [
        dict(zip(names, r, strict=True))
        for r in tx.query(
            "SELECT owner, direction, peer, channel, message_id, callback_name, reason, "
            "attempts, failed_at FROM homing_messenger_dead ORDER BY failed_at DESC LIMIT ?",
            (limit,),
        )
    ]
    dead_counts = {
        str(o): int(n)
        for o, n in tx.query("SELECT owner, COUNT(*) FROM homing_messenger_dead GROUP BY owner")
    }
    return {"pending": pending, "dead": dead, "dead_counts": dead_counts}
