"""The dashboard's pages over the other parts: the HTTP outbox and inbox per destination,
client sessions with their requests' recovery states, the durable messenger."""

from __future__ import annotations

from typing import Any

from homing.dashboard.views import Source
from homing.store import dashboard_ops_queries as oq
from homing.store import http_endpoint_queries as eq

LIMIT = 200
WINDOW = 3600.0


def _each(src: Source) -> Any:
    for i, shard in enumerate(src.shards):
        yield (f"{i}/" if src.sharded else ""), shard


def http_state(src: Source) -> dict[str, Any]:
    now = src.now()
    outbox: list[dict[str, Any]] = []
    inbox: list[dict[str, Any]] = []
    endpoints: list[dict[str, Any]] = []
    for prefix, shard in _each(src):
        with shard.store.transaction(write=False) as tx:
            outbox += [
                {**r, "shard": prefix}
                for r in oq.http_outbox(tx, now=now, window=WINDOW, limit=LIMIT)
            ]
            inbox += [
                {**r, "shard": prefix}
                for r in oq.http_inbox(tx, now=now, window=WINDOW, limit=LIMIT)
            ]
            endpoints += [
                {
                    "endpoint": e.endpoint,
                    "failing_s": now - e.failing_since,
                    "error": e.last_error,
                    "disabled": e.disabled_at is not None,
                    "reason": e.reason,
                    "shard": prefix,
                }
                for e in eq.endpoints(tx, limit=LIMIT)
            ]
    return {
        "outbox": outbox,
        "inbox": inbox,
        "endpoints": endpoints,
        "now": now,
        "window_min": int(WINDOW / 60),
    }


def sessions_state(src: Source) -> dict[str, Any]:
    clients: list[dict[str, Any]] = []
    for prefix, shard in _each(src):
        with shard.store.transaction(write=False) as tx:
            clients += [{**c, "shard": prefix} for c in oq.sessions(tx, limit=LIMIT)]
    return {"clients": clients, "now": src.now(), "limit": LIMIT}


def messenger_state(src: Source) -> dict[str, Any]:
    pending: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    dead_counts: dict[str, int] = {}
    for prefix, shard in _each(src):
        with shard.store.transaction(write=False) as tx:
            state = oq.messenger(tx, limit=LIMIT)
        pending += [{**p, "shard": prefix} for p in state["pending"]]
        dead += [{**d, "shard": prefix} for d in state["dead"]]
        dead_counts.update({prefix + o: n for o, n in state["dead_counts"].items()})
    return {
        "pending": pending,
        "dead": dead,
        "dead_counts": dead_counts,
        "now": src.now(),
        "limit": LIMIT,
    }
