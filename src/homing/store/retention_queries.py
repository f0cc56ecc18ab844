"""Retention promises: how long a running component told its users it keeps their rows.

A reliable HTTP receiver publishes its inbox retention to every sender, which may retry a
message until then and count on the receiver knowing its id; a durable messenger keeps
its dead letters and its senders' seen state for its ``retention``. Those rows are
deleted by more than the component itself: ``homing gc`` (from cron, or every hour by a
worker's or a sessions server's upkeep) runs with defaults of its own. So a component
records its promise here while it runs, and every gc of such rows keeps them for the
longest promise still binding.

A promise refreshed at ``promised_at`` covers the rows written until ``PROMISE_GRACE_S``
seconds later (components refresh every 10 minutes or more often; the grace leaves room for a
slow or failed refresh, and for the rows written just before a component stopped), and
binds for ``retention_s`` seconds after that.
"""

from __future__ import annotations

from homing.store.protocol import Tx

PROMISE_GRACE_S = 1800.0
REFRESH_EVERY_S = 600.0  # how often a running component refreshes its promise

HTTP_INBOX = "http.inbox"
MESSENGER = "messenger"


def promise(tx: Tx, kind: str, retention_s: float, *, now: float) -> None:
    """Record (or refresh) that a component keeps rows of ``kind`` for ``retention_s``."""
    tx.execute(
        "INSERT INTO homing_retention_promises (kind, retention_s, promised_at) "
        "VALUES (?, ?, ?) ON CONFLICT (kind, retention_s) "
        "DO UPDATE SET promised_at = excluded.promised_at",
        (kind, retention_s, now),
    )


def binding(tx: Tx, kind: str, *, now: float) -> float:
    """The longest retention of ``kind`` promised that may still cover a row; 0 if none."""
    row = tx.query_one(
        "SELECT MAX(retention_s) FROM homing_retention_promises "
        "WHERE kind = ? AND promised_at + ? + retention_s > ?",
        (kind, PROMISE_GRACE_S, now),
    )
    return float(row[0]) if row is not None and row[0] is not None else 0.0


def keep_before(tx: Tx, kind: str, before: float, *, now: float) -> float:
    """``before`` (a gc's cut-off time), moved back as far as a binding promise of ``kind``
    needs: rows older than the result may go."""
    return min(before, now - binding(tx, kind, now=now))


def forget_unbinding(tx: Tx, *, now: float) -> int:
    """Delete the promises that cover no row any more (for ``homing gc``): the table holds
    one row per kind and retention in use."""
    return tx.rowcount(
        "DELETE FROM homing_retention_promises WHERE promised_at + ? + retention_s <= ?",
        (PROMISE_GRACE_S, now),
    )
