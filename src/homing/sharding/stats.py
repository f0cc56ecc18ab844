"""Summing per-shard job statistics into one table."""

from __future__ import annotations

from typing import Any

_COUNTS = (
    "ready",
    "scheduled",
    "staged",
    "running",
    "expired",
    "done",
    "failed",
    "cancelled",
    "waiting",
    "done_per_s",
)


def merge_stats(per_shard: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Counts and rates add up; the oldest ready job is the oldest of any shard."""
    merged: dict[str, dict[str, Any]] = {}
    for rows in per_shard:
        for row in rows:
            m = merged.setdefault(
                row["type"],
                {
                    **row,
                    **{k: 0 for k in _COUNTS},
                    "done_per_s": 0.0,
                    "oldest_ready_age_s": None,
                    "paused": False,
                },
            )
            for k in _COUNTS:
                m[k] += row.get(k, 0)
            m["paused"] = bool(m["paused"] or row.get("paused"))
            ages = [
                a for a in (m["oldest_ready_age_s"], row["oldest_ready_age_s"]) if a is not None
            ]
            m["oldest_ready_age_s"] = max(ages) if ages else None
    return [merged[k] for k in sorted(merged)]
