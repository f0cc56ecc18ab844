"""A worker's own Prometheus metrics: completions, failures, retries, lost leases, and
histograms of the wait from due to start and of the run time, per job type.

These are counted in the worker process (the store cannot know them cheaply), so each
worker serves its own ``/metrics`` (``homing worker --metrics-port``): one endpoint per
process, nothing shared between processes, which is what makes it multiprocess-safe.
The same endpoint also exports the store's gauges (jobs by state, backlog age, engine),
computed at scrape time. Needs ``homing[dashboard]`` (prometheus_client).
"""

from __future__ import annotations

import time
from typing import Any

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)


class WorkerMetrics:
    """Counters and histograms fed by a worker's ``observers`` (one call per finished job)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.finished = Counter(
            "homing_worker_jobs",
            "Jobs this worker finished, by type and outcome",
            ["type", "outcome"],
            registry=r,
        )
        self.retried = Counter(
            "homing_worker_retried_starts",
            "Starts of a job that had run before (retries and takeovers after a lease expiry)",
            ["type"],
            registry=r,
        )
        self.wait = Histogram(
            "homing_worker_job_wait_seconds",
            "From a job's due time (run_at) to its start",
            ["type"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.run = Histogram(
            "homing_worker_job_run_seconds",
            "Handler run time until the outcome is recorded",
            ["type"],
            buckets=_BUCKETS,
            registry=r,
        )

    def observe(self, job: Any, outcome: str, duration: float) -> None:
        """Record one finished job (``outcome``: done, replaced, retry, failed, lease_lost...)."""
        self.finished.labels(job.type, outcome).inc()
        if job.attempts > 1:
            self.retried.labels(job.type).inc()
        self.run.labels(job.type).observe(duration)
        self.wait.labels(job.type).observe(max(0.0, time.time() - duration - job.run_at))

    def serve(self, port: int, host: str = "127.0.0.1", store: Any = None) -> Any:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; with ``store`` (a
        Database) the store's gauges are exported too. Returns the server."""
        from prometheus_client import start_http_server

        if store is not None:
            from homing.dashboard.metrics import StoreCollector
            from homing.dashboard.views import Source

            self.registry.register(StoreCollector(Source(store)))
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
