"""Checking what callers pass in, and turning rows into the engine's public types."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from homing._json import compact
from homing.engine.model import EntryState, Message, QueueInfo, SelectorInfo
from homing.errors import InvalidArgument, PayloadTooLarge
from homing.store import engine_queries as q

DEAD_LETTERS = q.DEAD_LETTERS
_MAX_NAME = 200


def name(what: str, value: Any, *, reserved_ok: bool = False) -> str:
    """A queue, selector or consumer name: printable, at most 200 characters, not ``$...``."""
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME:
        raise InvalidArgument(
            f"{what} must be a non-empty string of at most {_MAX_NAME} characters, got {value!r}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"{what} {value[:50]!r} must not contain control characters")
    if value.startswith("$") and not (reserved_ok and value == DEAD_LETTERS):
        raise InvalidArgument(
            f"{what} {value!r}: names starting with '$' are reserved for the engine "
            f"(its dead-letter queue is {DEAD_LETTERS!r})"
        )
    return value


def count(what: str, value: Any, *, allow_none: bool = True, minimum: int = 0) -> int | None:
    """A non-negative integer setting (None where ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value >= 2**62:
        raise InvalidArgument(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def seconds(
    what: str, value: Any, *, allow_none: bool = True, maximum: float = 10 * 365 * 86400.0
) -> float | None:
    """A positive, finite duration in seconds (None where ``allow_none``)."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (0 < value <= maximum)
        or value != value
    ):
        raise InvalidArgument(f"{what} must be seconds in (0, {maximum:g}], got {value!r}")
    return float(value)


def encode_body(body: Any, limit: int) -> tuple[bytes, str]:
    """Bytes stay bytes; anything else must be JSON (no NaN)."""
    if isinstance(body, bytes | bytearray | memoryview):
        data, kind = bytes(body), "bytes"
    else:
        text = compact(
            body,
            what="a message body is bytes or a JSON value (dict, list, str, number, bool, "
            "None; no NaN)",
        )
        data, kind = text.encode(), "json"
    if len(data) > limit:
        raise PayloadTooLarge(
            f"the message body is {len(data)} bytes, over the limit of {limit}; store large "
            "data elsewhere and send a reference, or raise max_body_bytes in Engine()"
        )
    return data, kind


def encode_headers(headers: Any, limit: int) -> str:
    if headers is None:
        return "{}"
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) for k in headers):
        raise InvalidArgument(f"headers must be a dict with string keys, got {headers!r}"[:300])
    text = compact(dict(headers), what="headers must be JSON values (no NaN)")
    if len(text.encode()) > limit:
        raise PayloadTooLarge(f"the headers are over the limit of {limit} bytes")
    return text


def _state(value: Any) -> EntryState:
    if value not in ("ready", "outstanding", "done"):
        raise ValueError(f"unknown engine entry state {value!r} in the store")
    return value


def message(row: Mapping[str, Any]) -> Message:
    body: Any = row["body"]
    if row["body_kind"] == "json":
        body = json.loads(bytes(body).decode()) if body is not None else None
    elif body is not None:
        body = bytes(body)
    return Message(
        seq=int(row["seq"]),
        id=str(row["id"]),
        queue=str(row["queue"]),
        state=_state(row["state"]),
        headers=json.loads(row["headers"]),
        body=body,
        address=str(row["address"]),
        return_address=row["return_address"],
        original_address=row["original_address"],
        reason=row["reason"],
        consumer=row["consumer"],
        job=row["job_id"],
        attempts=int(row["attempts"]),
        created_at=float(row["created_at"]),
        deaths=json.loads(row["deaths"]) if row.get("deaths") else [],
        expires_at=None if row.get("expires_at") is None else float(row["expires_at"]),
    )


def queue_info(row: Mapping[str, Any]) -> QueueInfo:
    return QueueInfo(
        name=row["name"],
        dead_letter=row["dead_letter"],
        max_unprocessed=row["max_unprocessed"],
        on_overflow=row["on_overflow"],
        max_history=row["max_history"],
        self_destruct=bool(row["self_destruct"]),
        discarded=int(row["discarded"]),
        created_at=float(row["created_at"]),
        ready=int(row.get("ready", 0)),
        outstanding=int(row.get("outstanding", 0)),
        done=int(row.get("done", 0)),
        max_deliveries=row.get("max_deliveries"),
        message_ttl=row.get("message_ttl"),
        expires=row.get("expires"),
    )


def selector_info(row: Mapping[str, Any]) -> SelectorInfo:
    return SelectorInfo(
        queue=row["queue"],
        name=row["name"],
        mode=row["mode"],
        role=row["role"],
        match=json.loads(row["match_rule"]),
        dest_kind=row["dest_kind"],
        dest=row["dest"],
        credits=int(row["credits"]),
        granted=int(row["granted"]),
        seen_at=None if row.get("seen_at") is None else float(row["seen_at"]),
    )


def uses_credit(sel: Mapping[str, Any]) -> bool:
    """MOVE and BOUNCE selectors are paid in credits; COPY ones are not."""
    return bool(sel["mode"] != "copy")


def from_row(
    row: Mapping[str, Any],
    *,
    queue: str,
    parent: int | None,
    address: str | None = None,
    return_address: Any = ...,
    original_address: Any = ...,
    reason: Any = ...,
    hops: int | None = None,
    deaths: Any = ...,
) -> q.NewEntry:
    """A new entry for the message of ``row``; unnamed envelope fields are kept."""
    body = row["body"]
    return q.NewEntry(
        id=row["id"],
        queue=queue,
        headers=row["headers"],
        body=bytes(body) if body is not None else None,
        body_kind=row["body_kind"],
        address=address if address is not None else row["address"],
        return_address=row["return_address"] if return_address is ... else return_address,
        original_address=row["original_address"] if original_address is ... else original_address,
        reason=row["reason"] if reason is ... else reason,
        parent_seq=parent,
        hops=int(row["hops"]) + 1 if hops is None else hops,
        created_at=float(row["created_at"]),
        deaths=row.get("deaths") if deaths is ... else deaths,
    )


def clone(
    e: q.NewEntry,
    *,
    queue: str,
    reason: str,
    parent: int | None,
    hops: int | None = None,
    deaths: str | None = None,
) -> q.NewEntry:
    """A not-yet-stored entry sent elsewhere (a dead letter of a message that never got in)."""
    return q.NewEntry(
        id=e.id,
        queue=queue,
        headers=e.headers,
        body=e.body,
        body_kind=e.body_kind,
        address=e.address,
        return_address=e.return_address,
        original_address=e.original_address,
        reason=reason,
        parent_seq=parent,
        hops=e.hops if hops is None else hops,
        created_at=e.created_at,
        deaths=deaths if deaths is not None else e.deaths,
    )
