"""RQ (PyPI) on the local Redis, through its public API: ``Queue.enqueue`` per job,
``Queue.enqueue_many`` for a batch; consumer ``SimpleWorker`` (runs jobs in the worker
process; RQ's default ``Worker`` forks a child per job, which is far slower)."""

from __future__ import annotations

import logging
from typing import Any

from bench.common import QUEUE, REDIS_URL, Tally, payload
from bench.drivers import Driver


def noop(data: dict[str, Any]) -> None:
    """The job function; RQ imports it by its dotted path."""
    Tally.started(data)
    Tally.done()


class RQDriver(Driver):
    name = "rq-redis"
    family = "redis"
    batch_ok = False  # enqueue_many exists; the worker still takes one job at a time
    batch_enqueue_ok = True
    durability = "Redis (see redis settings: appendonly); job hashes and results kept"
    startup_s = 0.5

    def _queue(self) -> Any:
        import redis
        from rq import Queue

        return Queue(QUEUE, connection=redis.Redis.from_url(REDIS_URL))

    def reset(self) -> None:
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        from bench.drivers.celery_q import redis_settings

        return {"version": version("rq"), "worker": "SimpleWorker", "redis": redis_settings()}

    def open_producer(self) -> Any:
        return _Producer(self._queue(), self.batch)

    def consume(self, slot: int) -> None:
        from rq import SimpleWorker

        logging.getLogger("rq.worker").setLevel(logging.WARNING)
        q = self._queue()
        worker = SimpleWorker([q], connection=q.connection)
        worker.work(burst=False, logging_level="WARNING", with_scheduler=False)


class _Producer:
    def __init__(self, q: Any, batch: int) -> None:
        self.q = q
        self.batch = batch

    def send(self, seqs: list[int]) -> None:
        from rq import Queue

        if len(seqs) == 1:
            self.q.enqueue(noop, payload(seqs[0]))
        else:
            self.q.enqueue_many([Queue.prepare_data(noop, args=(payload(i),)) for i in seqs])

    def close(self) -> None:
        pass
