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

from homing.dashboard import views
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
        yield from _engine(views.engine_state(self.src))


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
