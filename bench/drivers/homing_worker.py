"""homing's worker runtime (``homing.worker.App``): the consumers are homing's own worker,
one per process with its default concurrency, handlers registered with ``@app.job``."""

from __future__ import annotations

import logging
from typing import Any

import homing
from bench.common import JOB_TYPE, Tally
from bench.drivers.homing_jobs import HomingPostgres, HomingSQLite, _Homing


def available() -> bool:
    try:
        import homing.worker  # noqa: F401
    except ImportError:
        return False
    return True


class _WorkerMixin(_Homing):
    startup_s = 0.5

    def consume(self, slot: int) -> None:
        from homing.worker import App

        logging.getLogger("homing").setLevel(logging.WARNING)
        db = homing.connect(self.url(), durable=self.durable, migrate=False, pool_size=10)
        app = App(db)

        @app.job(JOB_TYPE)
        def noop(job: Any, ctx: Any) -> None:
            Tally.started(job.args)
            Tally.done()

        app.run()

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "consumer": "homing.worker.App.run() defaults"}


class HomingWorkerSQLite(_WorkerMixin, HomingSQLite):
    name = "homing-worker-sqlite"


class HomingWorkerPostgres(_WorkerMixin, HomingPostgres):
    name = "homing-worker-pg"
