"""``/metrics``: gauges read from the store at scrape time (Prometheus text format).

Each scrape runs the overview's cheap queries (partial indexes, a bounded window) and the
engine's queue/selector reads, so any process that can reach the store can export what
it holds: ``homing dashboard``, ``homing serve`` and each ``homing worker
--metrics-port`` (which adds its own counters and histograms, see ``homing.metrics``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from homing.dashboard import ops, views
from homing.dashboard.views import Source

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StoreCollector(Collector):
    """Jobs by type and state, backlog age, engine depths and credits, from the store."""

    def __init__(self, src: Source) -> None:
        self.src = src

    def collect(self) -> Iterator[GaugeMetricFamily]:
        data = views.overview(self.src)
        jobs = GaugeMetricFamily("homing_jobs", "Jobs by type and state", labels=["type", "state"])
        age = GaugeMetricFamily(
            "homing_jobs_oldest_ready_age_seconds",
            "Age of the oldest due job not yet started, per type",
            labels=["type"],
        )
        recent = GaugeMetricFamily(
            "homing_jobs_finished_last_hour",
            "Jobs finished in the last hour, by type and final state",
            labels=["type", "state"],
        )
        for row in data["types"]:
            for state in (
                "ready",
                "scheduled",
                "staged",
                "running",
                "expired",
                *data["other_states"],
            ):
                jobs.add_metric([row["type"], state], row.get(state, 0))
            age.add_metric([row["type"]], row["oldest_ready_age_s"] or 0.0)
            recent.add_metric([row["type"], "done"], row["done_window"])
        yield jobs
        yield age
        yield recent
        yield from _workers(data["workers"])
        yield from _engine(views.engine_state(self.src))
        yield from _http(ops.http_state(self.src))
        yield from _messenger(ops.messenger_state(self.src))


def _workers(rows: list[dict[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """From the holder registry (docs/jobs.md, "Leases and fencing"): one series per
    worker id, as many as grabbed in the last 15 minutes or hold jobs (at most 1,000)."""
    live = GaugeMetricFamily(
        "homing_workers_live", "Workers that grabbed in the last 15 minutes or hold jobs"
    )
    live.add_metric([], len(rows))
    held = GaugeMetricFamily(
        "homing_workers_jobs_held", "Running jobs a worker holds", labels=["host", "worker"]
    )
    for w in rows:
        held.add_metric([w["host"], w["worker"]], w["running"])
    yield from (live, held)


def _engine(state: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    depth = GaugeMetricFamily(
        "homing_engine_queue_messages", "Engine queue entries by state", labels=["queue", "state"]
    )
    discarded = GaugeMetricFamily(
        "homing_engine_queue_discarded", "Messages a queue discarded at its limit", labels=["queue"]
    )
    for q in state["queues"]:
        for s in ("ready", "outstanding", "done"):
            depth.add_metric([q["key"], s], q[s])
        discarded.add_metric([q["key"]], q["discarded"] or 0)
    credits = GaugeMetricFamily(
        "homing_engine_selector_credits", "Credits a selector holds", labels=["queue", "selector"]
    )
    granted = GaugeMetricFamily(
        "homing_engine_selector_granted",
        "Credits granted to a selector",
        labels=["queue", "selector"],
    )
    for s in state["selectors"]:
        credits.add_metric([s["queue_key"], s["name"]], s["credits"])
        granted.add_metric([s["queue_key"], s["name"]], s["granted"])
    yield from (depth, discarded, credits, granted)


def _http(state: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    pending = GaugeMetricFamily(
        "homing_http_outbox_pending",
        "Outbox messages waiting for delivery, per destination",
        labels=["destination"],
    )
    lag = GaugeMetricFamily(
        "homing_http_outbox_lag_seconds",
        "Age of the oldest undelivered outbox message",
        labels=["destination"],
    )
    failed = GaugeMetricFamily(
        "homing_http_outbox_failed", "Outbox messages that ended in failure", labels=["destination"]
    )
    for r in state["outbox"]:
        dest = r["shard"] + r["url"]
        pending.add_metric([dest], r["pending"])
        lag.add_metric([dest], r["oldest_s"] or 0.0)
        failed.add_metric([dest], r["failed"])
    dead = GaugeMetricFamily(
        "homing_http_inbox_dead_letters", "Inbox dead letters per path", labels=["path"]
    )
    for r in state["inbox"]:
        dead.add_metric([r["shard"] + r["path"]], r["dead"])
    yield from (pending, lag, failed, dead)


def _messenger(state: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    unacked = GaugeMetricFamily(
        "homing_messenger_unacked",
        "Durable messenger messages not yet acknowledged",
        labels=["owner", "channel"],
    )
    for p in state["pending"]:
        unacked.add_metric([p["shard"] + p["owner"], p["channel"]], p["unacked"])
    dead = GaugeMetricFamily(
        "homing_messenger_dead_letters",
        "Durable messenger dead letters (latest ones counted)",
        labels=["owner"],
    )
    per_owner: dict[str, int] = {}
    for d in state["dead"]:
        key = d["shard"] + d["owner"]
        per_owner[key] = per_owner.get(key, 0) + 1
    for owner, n in per_owner.items():
        dead.add_metric([owner], n)
    yield from (unacked, dead)


def store_registry(src: Source) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(src))
    return registry


def metrics_route(src: Source) -> Route:
    registry = store_registry(src)

    async def metrics(_request: Request) -> Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE)

    return Route("/metrics", metrics)
