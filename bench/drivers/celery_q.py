"""Celery (PyPI) with the local Redis as broker, through its public API.

Producer: ``task.apply_async`` per job (Celery has no bulk publish). Consumer: one
``worker_main`` per process with the solo pool (the task runs in the worker process;
two of them match prefork's default of one child per core, without the pool's IPC).
Results ignored; default ``acks_late=False``: the message is acknowledged when received,
before the task runs. Redis here runs without AOF (``appendonly no``): not durable.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import QUEUE, REDIS_URL, Tally, payload
from bench.drivers import Driver


class CeleryDriver(Driver):
    name = "celery-redis"
    family = "redis"
    durability = "Redis broker (see redis settings: appendonly); acks_late=False (ack before run)"
    startup_s = 1.5

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from celery import Celery

        self.app = Celery("bench", broker=REDIS_URL)
        self.app.conf.update(
            task_ignore_result=True,
            task_default_queue=QUEUE,
            broker_connection_retry_on_startup=True,
            worker_hijack_root_logger=False,
        )

        @self.app.task(name="bench_noop")
        def noop(data: dict[str, Any]) -> None:
            Tally.started(data)
            Tally.done()

        self.task = noop

    def reset(self) -> None:
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()

    def settings(self) -> dict[str, Any]:
        import celery

        return {
            "version": celery.__version__,
            "pool": "solo (one worker process per consumer)",
            "prefetch_multiplier": self.app.conf.worker_prefetch_multiplier,
            "acks_late": self.app.conf.task_acks_late,
            "redis": redis_settings(),
        }

    def open_producer(self) -> Any:
        return _Producer(self.task)

    def consume(self, slot: int) -> None:
        logging.getLogger("celery").setLevel(logging.WARNING)
        self.app.worker_main(
            [
                "worker",
                "--pool=solo",
                f"--queues={QUEUE}",
                "--loglevel=WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                f"--hostname=bench{slot}@%h",
            ]
        )


class _Producer:
    def __init__(self, task: Any) -> None:
        self.task = task

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            self.task.apply_async((payload(i),))

    def close(self) -> None:
        pass


def redis_settings() -> dict[str, str]:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    out = {"version": str(r.info("server").get("redis_version"))}
    for key in ("appendonly", "appendfsync", "save"):
        out.update({k: str(v) for k, v in r.config_get(key).items()})
    return out
