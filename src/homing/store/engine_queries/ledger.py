"""SQL of the published-id ledger, of job destinations, and of the books' invariants."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homing.store.engine_queries._rows import (
    _dict,
)
from homing.store.protocol import Tx


def record_published_many(tx: Tx, rows: Sequence[tuple[str, str, int | None, str, float]]) -> None:
    """Ledger rows (id, queue, seq, outcome, at) of a batch publish."""
    tx.executemany(
        "INSERT INTO homing_engine_published (id, queue, seq, outcome, at) VALUES (?, ?, ?, ?, ?)",
        rows,
    )


def published_many(tx: Tx, message_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Ledger rows of the ids published before, by id."""
    out: dict[str, dict[str, Any]] = {}
    for start in range(0, len(message_ids), 500):
        chunk = list(message_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        for row in tx.query(
            f"SELECT id, queue, seq, outcome, at FROM homing_engine_published WHERE id IN ({marks})",
            chunk,
        ):
            d = _dict(("id", "queue", "seq", "outcome", "at"), row)
            assert d is not None
            out[str(d["id"])] = d
    return out


def forget_published(tx: Tx, *, before: float) -> int:
    return tx.rowcount("DELETE FROM homing_engine_published WHERE at < ?", (before,))


def finished_job_entries(tx: Tx, limit: int) -> list[tuple[int, str | None]]:
    """Outstanding entries given to a job whose job has finished (or was garbage-collected):
    (seq, job state or None)."""
    return [
        (int(seq), None if state is None else str(state))
        for seq, state in tx.query(
            "SELECT e.seq, j.state FROM homing_engine_entries e "
            f"LEFT JOIN homing_jobs j ON j.id = {tx.sql.job_id('e.job_id')} "
            "WHERE e.state = 'outstanding' AND e.job_id IS NOT NULL "
            "AND (j.id IS NULL OR j.state IN ('done', 'failed')) ORDER BY e.seq LIMIT ?",
            (limit,),
        )
    ]


def credit_books(tx: Tx) -> list[tuple[int, str, str, int, int, int]]:
    """Per selector: (id, queue, name, credits held, outstanding entries, credits granted)."""
    return [
        (int(i), str(q), str(n), int(c), int(o), int(g))
        for i, q, n, c, o, g in tx.query(
            "SELECT s.id, s.queue, s.name, s.credits, "
            "(SELECT COUNT(*) FROM homing_engine_entries e "
            " WHERE e.selector_id = s.id AND e.state = 'outstanding'), s.granted "
            "FROM homing_engine_selectors s ORDER BY s.id"
        )
    ]


def orphans(tx: Tx) -> list[tuple[str, int]]:
    """Entries that break the graph's bookkeeping, as (problem, seq)."""
    out: list[tuple[str, int]] = []
    for (seq,) in tx.query(
        "SELECT e.seq FROM homing_engine_entries e WHERE e.state = 'outstanding' AND "
        "NOT EXISTS (SELECT 1 FROM homing_engine_selectors s WHERE s.id = e.selector_id)"
    ):
        out.append(("outstanding entry without its selector", int(seq)))
    for (seq,) in tx.query(
        "SELECT e.seq FROM homing_engine_entries e WHERE e.state = 'outstanding' AND "
        "e.consumer IS NULL AND e.job_id IS NULL AND (SELECT COUNT(*) FROM homing_engine_entries c "
        "WHERE c.parent_seq = e.seq AND c.state <> 'done') <> 1"
    ):
        out.append(("outstanding entry moved to a queue without exactly one live child", int(seq)))
    for (seq,) in tx.query(
        "SELECT c.seq FROM homing_engine_entries c JOIN homing_engine_entries p "
        "ON p.seq = c.parent_seq WHERE c.state <> 'done' AND p.state <> 'outstanding'"
    ):
        out.append(("live child of an entry that is not outstanding", int(seq)))
    for (seq,) in tx.query(
        "SELECT e.seq FROM homing_engine_entries e WHERE NOT EXISTS "
        "(SELECT 1 FROM homing_engine_queues q WHERE q.name = e.queue)"
    ):
        out.append(("entry in a queue that does not exist", int(seq)))
    return out
