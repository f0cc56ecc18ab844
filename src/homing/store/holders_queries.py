"""The lease holders' registry (jobs schema 9): who grabs, by a 4-byte id in the job row.

A grab names its holder (host, pid, worker id) by ``homing_holders.id`` instead of writing
the three into every row version it makes. A process registers each worker id once and
renews it while it grabs (``JobOps.holder_id``); ``gc`` forgets what nobody renewed for a
day and no running job names. Only a running job's holder is ever read.
"""

from __future__ import annotations

from typing import Any

from homing.store.protocol import Tx

# A registration not renewed for this long, and named by no job, is forgotten by gc. Live
# grabbers renew theirs every HOLDER_RENEW_S (JobOps.holder_id), far more often.
HOLDER_FORGOTTEN_AFTER_S = 86400.0
HOLDER_RENEW_S = 600.0
# A live grabber's registration is at most HOLDER_RENEW_S old: "live" looks back further.
WORKERS_WITHIN_S = 1.5 * HOLDER_RENEW_S


def register_holder(tx: Tx, host: str, pid: int, worker: str, *, now: float) -> int:
    """The id of the holder (host, pid, worker id), registered or renewed now."""
    row = tx.query_one(
        "INSERT INTO homing_holders (host, pid, worker, seen_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (host, pid, worker) DO UPDATE SET seen_at = excluded.seen_at RETURNING id",
        (host, pid, worker, now),
    )
    assert row is not None
    return int(row[0])


def leases_on_host(tx: Tx, host: str) -> list[tuple[str, str, int | None, str | None]]:
    """(id, lease token, holder pid, holder worker) of the jobs that processes of ``host``
    hold (read through the index of running jobs: they are few)."""
    rows = tx.query(
        "SELECT j.id, j.lease_token, h.pid, h.worker FROM homing_jobs j "
        "JOIN homing_holders h ON h.id = j.holder_id WHERE j.state = 'running' AND h.host = ?",
        (host,),
    )
    return [(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]


def forget_holders(tx: Tx, *, before: float) -> int:
    """Delete the holders not renewed since ``before`` that hold no running job; how many.

    Only a running job's holder is ever read, so a finished or rescheduled job may keep
    the id of a holder forgotten here (read through the index of running jobs: no scan)."""
    stale = [
        int(r[0]) for r in tx.query("SELECT id FROM homing_holders WHERE seen_at < ?", (before,))
    ]
    forgotten = 0
    for start in range(0, len(stale), 500):
        chunk = stale[start : start + 500]
        clause, params = tx.sql.in_list("holder_id", chunk)
        held = {
            r[0]
            for r in tx.query(
                f"SELECT DISTINCT holder_id FROM homing_jobs WHERE state = 'running' AND {clause}",
                params,
            )
        }
        gone = [i for i in chunk if i not in held]
        if gone:
            clause, params = tx.sql.in_list("id", gone)
            forgotten += tx.rowcount(f"DELETE FROM homing_holders WHERE {clause}", params)
    return forgotten


def live_holders(tx: Tx, *, seen_after: float, limit: int = 1000) -> list[dict[str, Any]]:
    """The holders that grabbed since ``seen_after`` (their last renewal) or hold running
    jobs now, with how many each holds; the most recently seen first, at most ``limit``."""
    running = {
        r[0]: int(r[1])
        for r in tx.query(
            "SELECT holder_id, count(*) FROM homing_jobs WHERE state = 'running' "
            "AND holder_id IS NOT NULL GROUP BY holder_id"
        )
    }
    rows = tx.query(
        "SELECT id, host, pid, worker, seen_at FROM homing_holders ORDER BY seen_at DESC",
    )
    out = []
    for holder, host, pid, worker, seen_at in rows:
        if seen_at >= seen_after or holder in running:
            out.append(
                {
                    "host": host,
                    "pid": pid,
                    "worker": worker,
                    "seen_at": seen_at,
                    "running": running.get(holder, 0),
                }
            )
            if len(out) >= limit:
                break
    return out
