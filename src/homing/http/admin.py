"""Operating reliable HTTP: dead letters on the receiving side, failed deliveries on the
sending side; list them, redrive them (same message id, so the inbox still drops repeats),
or purge dead letters once they are understood. ``homing http ...`` is the shell form.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from homing.database import Database
from homing.errors import InvalidArgument
from homing.http.policy import DEFAULT_ABSURD_AFTER_S
from homing.store import http_dead_queries as dq
from homing.store import http_endpoint_queries as eq

MAX_LIST = 10_000


@dataclass(frozen=True)
class DeadLetter:
    """A message the receiver acknowledged (204/202) and no attempt could handle."""

    id: str
    path: str
    mode: str
    content_type: str
    body: bytes
    attempts: int
    received_at: float
    dead_at: float
    error: str | None
    history: list[dict[str, Any]]


@dataclass(frozen=True)
class FailedDelivery:
    """An outbox message that ended ``failed`` (a fatal answer or the absurd deadline)."""

    id: str
    kind: str
    method: str
    url: str
    attempts: int
    created_at: float
    finished_at: float | None
    status: int | None
    last_error: str | None


def _ids(ids: Sequence[str] | None) -> list[str] | None:
    if ids is None:
        return None
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument("ids must be a list of message id strings (or None for all)")
    return list(ids)


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIST:
        raise InvalidArgument(f"limit must be 1..{MAX_LIST}, got {limit}")
    return limit


def dead_letters(db: Database, *, limit: int = 100, path: str | None = None) -> list[DeadLetter]:
    """The receiver's dead letters, oldest first, with body and attempt history."""
    with db.store.transaction(write=False) as tx:
        rows = dq.dead_letters(tx, limit=_limit(limit), path=path)
    return [
        DeadLetter(
            r.id,
            r.path,
            r.mode,
            r.content_type,
            r.body or b"",
            r.attempts,
            r.received_at,
            r.dead_at or 0.0,
            r.error,
            json.loads(r.history) if r.history else [],
        )
        for r in rows
    ]


def redrive(db: Database, ids: Sequence[str] | None = None) -> int:
    """Dead letters (all, or ``ids``) back to the inbox, due now; returns how many.
    A running Receiver on this store handles them on its next poll."""
    with db.store.transaction() as tx:
        return dq.redrive_incoming(tx, _ids(ids), now=db.clock.now())


def purge_dead_letters(db: Database, ids: Sequence[str] | None = None) -> int:
    """Give up on dead letters for good: their bodies are dropped (ids stay known)."""
    with db.store.transaction() as tx:
        return dq.purge_dead(tx, _ids(ids))


def failed_deliveries(db: Database, *, limit: int = 100) -> list[FailedDelivery]:
    """The sender's failed outbox rows, oldest first (kept for the gc retention)."""
    with db.store.transaction(write=False) as tx:
        rows = dq.failed_outgoing(tx, limit=_limit(limit))
    return [
        FailedDelivery(
            r.id,
            r.kind,
            r.method,
            r.url,
            r.attempts,
            r.created_at,
            r.finished_at,
            r.status,
            r.last_error,
        )
        for r in rows
    ]


def redrive_failed(
    db: Database, ids: Sequence[str] | None = None, *, absurd_after: float = DEFAULT_ABSURD_AFTER_S
) -> int:
    """Failed outbox rows (all, or ``ids``) sent again under their own id, with a new
    deadline ``absurd_after`` seconds from now; returns how many."""
    if absurd_after <= 0:
        raise InvalidArgument(f"absurd_after must be > 0 seconds, got {absurd_after}")
    now = db.clock.now()
    with db.store.transaction() as tx:
        return dq.redrive_outgoing(tx, _ids(ids), now=now, deadline=now + absurd_after)


def endpoints(db: Database, *, limit: int = 100) -> list[eq.EndpointRow]:
    """Endpoints failing now (since when, last error) or disabled by ``disable_after``."""
    with db.store.transaction(write=False) as tx:
        return eq.endpoints(tx, limit=_limit(limit))


def enable(db: Database, endpoint: str) -> bool:
    """Enable a disabled endpoint (``scheme://host:port/path``) again; then redrive its
    failed deliveries. A dispatcher sees it within a few seconds."""
    with db.store.transaction() as tx:
        return eq.enable_endpoint(tx, endpoint)
