"""Reliable HTTP's endpoints that keep failing: the disable-after rule (Standard Webhooks)."""

from __future__ import annotations

from dataclasses import dataclass

from homing.store.protocol import Tx


@dataclass(frozen=True)
class EndpointRow:
    endpoint: str
    failing_since: float
    last_error: str | None
    disabled_at: float | None
    reason: str | None


def endpoint_failed(tx: Tx, endpoint: str, *, now: float, error: str, disable_after: float) -> bool:
    """Record a failed attempt; True if the endpoint has now failed for ``disable_after``
    seconds without a success in between and is disabled by this call."""
    tx.execute(
        "INSERT INTO homing_http_endpoints (endpoint, failing_since, last_error) "
        "VALUES (?, ?, ?) ON CONFLICT (endpoint) DO UPDATE SET last_error = excluded.last_error",
        (endpoint, now, error[:2000]),
    )
    return (
        tx.rowcount(
            "UPDATE homing_http_endpoints SET disabled_at = ?, reason = ? "
            "WHERE endpoint = ? AND disabled_at IS NULL AND failing_since <= ?",
            (
                now,
                f"failing without a success for {disable_after / 86400:g} days; last: {error}"[
                    :2000
                ],
                endpoint,
                now - disable_after,
            ),
        )
        == 1
    )


def endpoint_ok(tx: Tx, endpoint: str) -> None:
    """A delivery succeeded: the endpoint is not failing (a disabled one stays disabled)."""
    tx.execute(
        "DELETE FROM homing_http_endpoints WHERE endpoint = ? AND disabled_at IS NULL",
        (endpoint,),
    )


def endpoints(tx: Tx, *, limit: int) -> list[EndpointRow]:
    rows = tx.query(
        "SELECT endpoint, failing_since, last_error, disabled_at, reason "
        "FROM homing_http_endpoints ORDER BY failing_since, endpoint LIMIT ?",
        (limit,),
    )
    return [EndpointRow(str(r[0]), float(r[1]), r[2], r[3], r[4]) for r in rows]


def disabled_endpoints(tx: Tx) -> dict[str, str]:
    rows = tx.query(
        "SELECT endpoint, reason FROM homing_http_endpoints WHERE disabled_at IS NOT NULL"
    )
    return {str(r[0]): str(r[1] or "") for r in rows}


def endpoint_disabled(tx: Tx, endpoint: str) -> str | None:
    """The reason ``endpoint`` is disabled, None if it is not."""
    row = tx.query_one(
        "SELECT reason FROM homing_http_endpoints WHERE endpoint = ? AND disabled_at IS NOT NULL",
        (endpoint,),
    )
    return None if row is None else str(row[0] or "disabled")


def enable_endpoint(tx: Tx, endpoint: str) -> bool:
    return tx.rowcount("DELETE FROM homing_http_endpoints WHERE endpoint = ?", (endpoint,)) == 1
