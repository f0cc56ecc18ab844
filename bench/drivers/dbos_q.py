"""DBOS (``dbos`` on PyPI): durable workflow queues on PostgreSQL, through its public API.

The closest Python peer in promise: a workflow enqueued on a DBOS queue runs to completion
even if the process dies. Each job is a one-function workflow ``bench_noop`` (no steps),
so DBOS records its status row, its input and its output, nothing more.

Producer: ``DBOSClient.enqueue`` (DBOS's documented way for a service that does not run
the workflows to enqueue them; the same ``init_workflow`` insert as ``Queue.enqueue``).
DBOS has no batch enqueue for workflows, so it is in the per-job groups only.
Consumer: one DBOS application per process, ``DBOS(config=...)`` + ``DBOS.launch()``,
which starts DBOS's queue threads with its defaults: the queue is polled every
``polling_interval_sec=1.0`` (no LISTEN/NOTIFY for queues), no concurrency limit, each
dequeued workflow run on DBOS's thread pool. The queue is declared once per reset with
``DBOS.register_queue(name)`` (defaults), by a throw-away launch in a child process, which
also runs DBOS's migrations (its ``dbos`` schema).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from bench.common import FORK, JOB_TYPE, PG_URL, QUEUE, Tally, payload, reset_postgres
from bench.drivers import Driver

APP_NAME = "homing-bench"

_workflow: Any = None


def _register() -> Any:
    """Declare the no-op workflow once per process (DBOS keeps a global registry, so the
    fork inherits it); idempotent."""
    global _workflow
    if _workflow is None:
        from dbos import DBOS

        @DBOS.workflow(name=JOB_TYPE)
        def bench_noop(i: int, p: str) -> None:
            Tally.started({"i": i})
            Tally.done()

        _workflow = bench_noop
    return _workflow


def _quiet() -> None:
    logging.getLogger("dbos").setLevel(logging.WARNING)


def _config() -> dict[str, Any]:
    # Only what a bench needs to point DBOS at its own database; every other setting is
    # DBOS's default.
    return {"name": APP_NAME, "system_database_url": PG_URL, "log_level": "WARNING"}


def _declare_queue() -> None:
    """In a child process: launch DBOS (runs its migrations), register the queue, stop."""
    from dbos import DBOS

    _quiet()
    _register()
    DBOS(config=_config())  # type: ignore[arg-type]
    DBOS.launch()
    DBOS.register_queue(QUEUE)
    DBOS.destroy()
    os._exit(0)


class _Producer:
    def __init__(self) -> None:
        from dbos import DBOSClient

        _quiet()
        self.client = DBOSClient(system_database_url=PG_URL, application_name=APP_NAME)
        self.options: Any = {"queue_name": QUEUE, "workflow_name": JOB_TYPE}

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            self.client.enqueue(self.options, **payload(i))

    def close(self) -> None:
        self.client.destroy()


class DBOSDriver(Driver):
    name = "dbos"
    family = "postgres"
    batch_ok = False  # no batch enqueue of workflows
    durability = (
        "synchronous_commit=on (server default), logged tables; an enqueue is one commit "
        "(status row + input); status, input and output kept after it finishes"
    )
    startup_s = 1.5

    def reset(self) -> None:
        reset_postgres(PG_URL)
        # DBOS starts threads at launch: keep them out of the cell process, which forks.
        proc = FORK.Process(target=_declare_queue)
        proc.start()
        proc.join(120)
        if proc.exitcode != 0:
            raise RuntimeError(f"DBOS launch / register_queue failed (exit {proc.exitcode})")

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {
            "version": version("dbos"),
            "producer": "DBOSClient.enqueue (one job per call; no batch API)",
            "consumer": "DBOS.launch() per process, queue registered with defaults",
            "polling_interval_sec": 1.0,
            "worker_concurrency": None,
            "executor threads": "unbounded (max_executor_threads default)",
            "executor_id": "local (default without Conductor; the same in both processes)",
            "queue notification": "none (polled)",
        }

    def open_producer(self) -> _Producer:
        return _Producer()

    def consume(self, slot: int) -> None:
        import threading

        from dbos import DBOS

        _quiet()
        _register()
        DBOS(config=_config())  # type: ignore[arg-type]
        DBOS.launch()
        threading.Event().wait()
