"""chancy (PyPI): a PostgreSQL job queue, through its public API.

Producer: ``Chancy.sync_push`` (one job: one INSERT and one NOTIFY in a transaction) or
``Chancy.sync_push_many`` (a batch: one INSERT per job, one transaction and one NOTIFY).
Consumer: one ``Worker`` per process with chancy's defaults: its default plugins
(leadership, pruner, recovery, metrics, workflows), LISTEN/NOTIFY on (a push wakes the
queue at once, else it polls every ``polling_interval=5`` s), and the queue declared with
``Queue(name)`` defaults: the ``ProcessExecutor``, a pool of *spawned* processes, as many
as cores (2 here), in which each job runs; the worker fetches at most as many jobs as it
has free slots, and writes completions back in batches once a second.

Counting: the no-op handler runs in a spawned pool process, where the harness's shared
counters do not exist, so it returns its start time, and a small plugin in the worker
process (``on_job_completed``, called when the pool reports the handler returned, before
chancy writes the completion) records that start time and counts the job: a job is
counted when its handler ran, as for the other library workers.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import PG_URL, QUEUE, Tally, payload, reset_postgres, seq_of
from bench.drivers import Driver


def bench_noop(i: int, p: str) -> float:
    """The job: does nothing and reports when it started (it runs in a spawned process)."""
    return time.time()


def _job(i: int) -> Any:
    from chancy import Job

    return Job.from_func(bench_noop, queue=QUEUE, kwargs=payload(i))


def _chancy(**kwargs: Any) -> Any:
    import logging

    from chancy import Chancy

    log = logging.getLogger("chancy.bench")
    log.setLevel(logging.WARNING)
    return Chancy(PG_URL, log=log, **kwargs)


def _counter_plugin() -> Any:
    from chancy.plugin import Plugin

    class Count(Plugin):
        """Counts a job (and records its handler's start) once its handler returned."""

        @staticmethod
        def get_identifier() -> str:
            return "homing_bench.count"

        async def on_job_completed(
            self, *, worker: Any, job: Any, exc: Exception | None = None, result: Any = None
        ) -> Any:
            if exc is None:
                sh = Tally.shared
                i = seq_of(job.kwargs)
                if sh is not None and Tally.track_starts and 0 <= i < sh.max_jobs:
                    if sh.starts[i] == 0.0:
                        sh.starts[i] = float(result)
                Tally.done()
            return job

    return Count()


def _allow_pool_children() -> None:
    """Let this consumer start chancy's process pool, and take the pool with it when the
    harness SIGKILLs the consumer.

    The harness starts consumers as daemonic ``multiprocessing`` processes, which may not
    have children; chancy's default executor needs them (a manager and a spawned pool).
    The consumer becomes the leader of a process group of its own (the pool processes
    join it), and a forked watchdog kills the whole group once the consumer is gone, so
    no orphaned pool process outlives a run on the shared machine."""
    import multiprocessing
    import os
    import signal

    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    os.setpgid(0, 0)
    leader = os.getpid()
    if os.fork() == 0:  # the watchdog (no threads exist yet in this process)
        try:
            while os.getppid() == leader:
                time.sleep(0.2)
            os.killpg(leader, signal.SIGKILL)
        finally:
            os._exit(0)


class _Producer:
    def __init__(self, batch: int) -> None:
        self.chancy = _chancy()
        self.chancy.__enter__()
        self.batch = batch

    def send(self, seqs: list[int]) -> None:
        if len(seqs) == 1 and self.batch == 1:
            self.chancy.sync_push(_job(seqs[0]))
        else:
            for _ in self.chancy.sync_push_many([_job(i) for i in seqs]):
                pass

    def close(self) -> None:
        self.chancy.__exit__(None, None, None)


class ChancyDriver(Driver):
    name = "chancy"
    family = "postgres"
    batch_ok = False  # push_many exists; the worker fetches at most its free slots (2)
    batch_enqueue_ok = True
    durability = (
        "jobs in a logged table, synchronous_commit=on (server default); finished jobs "
        "kept (pruned after a day); completions written by the worker in batches every "
        "1 s: a crash re-runs the jobs finished in its last second (at-least-once)"
    )
    startup_s = 1.5

    def reset(self) -> None:
        import asyncio

        from chancy import Queue

        reset_postgres(PG_URL)

        async def setup() -> None:
            async with _chancy() as chancy:
                await chancy.migrate()
                await chancy.declare(Queue(QUEUE))

        asyncio.run(setup())

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        from chancy import Queue

        q = Queue(QUEUE)
        return {
            "version": version("chancy"),
            "executor": q.executor + " (spawn; pool size = cores)",
            "concurrency": q.concurrency,
            "polling_interval_s": q.polling_interval,
            "notifications": "LISTEN/NOTIFY on (chancy default)",
            "completion writes": "batched, every 1 s (Worker.send_outgoing_interval)",
            "producer": "sync_push / sync_push_many",
        }

    def open_producer(self) -> _Producer:
        return _Producer(self.batch)

    def consume(self, slot: int) -> None:
        import asyncio

        from chancy import Worker

        _allow_pool_children()

        async def main() -> None:
            async with _chancy(plugins=[_counter_plugin()]) as chancy:
                async with Worker(chancy) as worker:
                    await worker.wait_for_shutdown()

        asyncio.run(main())
