"""Row shapes shared by the engine's SQL: column lists, row dicts, a new entry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEAD_LETTERS = "$dead"
_ENGINE_LOCK_KEY = 0x686F6D656E67  # "homeng"

QUEUE_COLUMNS = (
    "name",
    "dead_letter",
    "max_unprocessed",
    "on_overflow",
    "max_history",
    "self_destruct",
    "discarded",
    "created_at",
    "max_deliveries",
    "message_ttl",
    "expires",
    "last_active",
)
SELECTOR_COLUMNS = (
    "id",
    "queue",
    "name",
    "mode",
    "role",
    "match_rule",
    "dest_kind",
    "dest",
    "credits",
    "granted",
    "last_used",
    "created_at",
    "seen_at",
)
ENTRY_COLUMNS = (
    "seq",
    "id",
    "queue",
    "state",
    "headers",
    "body",
    "body_kind",
    "address",
    "return_address",
    "original_address",
    "reason",
    "parent_seq",
    "selector_id",
    "consumer",
    "job_id",
    "copied",
    "hops",
    "lease_token",
    "lease_until",
    "attempts",
    "created_at",
    "done_at",
    "deaths",
    "expires_at",
    "waiting_for",
)
_Q = ", ".join(QUEUE_COLUMNS)
_S = ", ".join(SELECTOR_COLUMNS)
_E = ", ".join(ENTRY_COLUMNS)


def _dict(columns: Sequence[str], row: Sequence[Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(zip(columns, row, strict=True))
    if "body" in out and isinstance(out["body"], memoryview):
        out["body"] = bytes(out["body"])
    return out


def _dicts(columns: Sequence[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [d for d in (_dict(columns, r) for r in rows) if d is not None]


@dataclass(frozen=True)
class NewEntry:
    id: str
    queue: str
    headers: str
    body: bytes | None
    body_kind: str
    address: str
    return_address: str | None
    original_address: str | None
    reason: str | None
    parent_seq: int | None
    hops: int
    created_at: float
    deaths: str | None = None
    expires_at: float | None = None


def entry_row(seq: int, e: NewEntry) -> dict[str, Any]:
    """The row ``insert_entry`` just stored, without reading it back."""
    return {
        "seq": seq,
        "id": e.id,
        "queue": e.queue,
        "state": "ready",
        "headers": e.headers,
        "body": e.body,
        "body_kind": e.body_kind,
        "address": e.address,
        "return_address": e.return_address,
        "original_address": e.original_address,
        "reason": e.reason,
        "parent_seq": e.parent_seq,
        "selector_id": None,
        "consumer": None,
        "job_id": None,
        "copied": 0,
        "hops": e.hops,
        "lease_token": None,
        "lease_until": None,
        "attempts": 0,
        "created_at": e.created_at,
        "done_at": None,
        "deaths": e.deaths,
        "expires_at": e.expires_at,
        "waiting_for": None,
    }
