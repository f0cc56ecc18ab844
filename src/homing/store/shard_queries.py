"""Queries a sharded store needs beyond the job API: unique keys, for moving placement."""

from __future__ import annotations

from collections.abc import Sequence

from homing.store.protocol import Tx


def job_ids_by_key(tx: Tx, keys: Sequence[str]) -> dict[str, str]:
    """The id of the retained job holding each of ``keys`` (absent keys are left out)."""
    found: dict[str, str] = {}
    for start in range(0, len(keys), 500):
        clause, params = tx.sql.in_list("unique_key", list(keys[start : start + 500]))
        rows = tx.query(f"SELECT unique_key, id FROM homing_jobs WHERE {clause}", params)
        found.update({str(k): str(i) for k, i in rows})
    return found


def unique_keys_page(tx: Tx, after: str, limit: int) -> list[str]:
    """The retained jobs' unique keys greater than ``after``, in order (a page of them)."""
    rows = tx.query(
        "SELECT unique_key FROM homing_jobs WHERE unique_key IS NOT NULL AND unique_key > ? "
        "ORDER BY unique_key LIMIT ?",
        (after, limit),
    )
    return [str(r[0]) for r in rows]
