"""One driver per system under test, all with the same small shape.

A driver is made in the cell process (``python -m bench.drivers``), which then forks its
producer and consumer processes, so everything a driver sets up before forking (a task
registry, a huey instance) is shared by them. Connections are opened after the fork.

- ``reset()``: a fresh database / file / queue / stream (before every run).
- ``settings()``: what the reader needs to judge durability (sync levels, versions).
- ``open_producer()``: an object whose ``send(seqs)`` enqueues one job per seq, with the
  one-job API when ``batch == 1`` and the system's batch API otherwise.
- ``consume()``: the consumer loop of one process; it calls ``Tally.started(payload)``
  when the no-op handler begins and ``Tally.done(n)`` once jobs are acknowledged.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, ClassVar, Protocol


class Producer(Protocol):
    def send(self, seqs: list[int]) -> None: ...

    def close(self) -> None: ...


class Driver:
    name: ClassVar[str] = ""
    #: "postgres" | "sqlite" | "redis" | "rabbitmq" | "nats" | "transport"
    family: ClassVar[str] = ""
    #: True when both sides have a batch API (insert many / grab many or prefetch).
    batch_ok: ClassVar[bool] = False
    #: True when the producer side has a batch API (enqueue-only workload).
    batch_enqueue_ok: ClassVar[bool | None] = None
    #: How durable an acknowledged enqueue is, in words (shown in the report).
    durability: ClassVar[str] = ""
    #: Seconds the consumers need after their processes start (library start-up).
    startup_s: ClassVar[float] = 0.3
    #: Fixed number of consumer processes (None: the harness's setting).
    consumers: ClassVar[int | None] = None

    @classmethod
    def can_batch_enqueue(cls) -> bool:
        return cls.batch_ok if cls.batch_enqueue_ok is None else cls.batch_enqueue_ok

    def __init__(self, *, batch: int, workdir: Path, options: dict[str, Any]) -> None:
        self.batch = batch
        self.workdir = workdir
        self.options = options

    def reset(self) -> None:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        return {}

    def open_producer(self) -> Producer:
        raise NotImplementedError

    def consume(self, slot: int) -> None:
        raise NotImplementedError

    def preload(self, n: int, deadline: float) -> int:
        """Insert up to ``n`` jobs as fast as the system allows (not timed); returns how many."""
        import time

        p = self.open_producer()
        step = 500 if self.can_batch_enqueue() else 1
        done = 0
        try:
            while done < n and time.monotonic() < deadline:
                k = min(step, n - done)
                p.send(list(range(done, done + k)))
                done += k
        finally:
            p.close()
        return done

    def close(self) -> None:
        pass


# name -> "module:Class"
REGISTRY: dict[str, str] = {
    "homing-sqlite": "bench.drivers.homing_jobs:HomingSQLite",
    "homing-sqlite-nd": "bench.drivers.homing_jobs:HomingSQLiteNonDurable",
    "homing-sqlite-joined": "bench.drivers.homing_jobs:HomingSQLiteJoined",
    "homing-pg": "bench.drivers.homing_jobs:HomingPostgres",
    "homing-pg-nd": "bench.drivers.homing_jobs:HomingPostgresNonDurable",
    "homing-pg-joined": "bench.drivers.homing_jobs:HomingPostgresJoined",
    "homing-worker-sqlite": "bench.drivers.homing_worker:HomingWorkerSQLite",
    "homing-worker-pg": "bench.drivers.homing_worker:HomingWorkerPostgres",
    "raw-sqlite": "bench.drivers.raw_sql:RawSQLite",
    "raw-pg": "bench.drivers.raw_sql:RawPostgres",
    "huey-sqlite": "bench.drivers.huey_q:HueySqlite",
    "litequeue": "bench.drivers.litequeue_q:LiteQueueDriver",
    "pgqueuer": "bench.drivers.pgqueuer_q:PgQueuerDriver",
    "procrastinate": "bench.drivers.procrastinate_q:ProcrastinateDriver",
    "dbos": "bench.drivers.dbos_q:DBOSDriver",
    "chancy": "bench.drivers.chancy_q:ChancyDriver",
    "celery-redis": "bench.drivers.celery_q:CeleryDriver",
    "rq-redis": "bench.drivers.rq_q:RQDriver",
    "rabbitmq": "bench.drivers.rabbitmq:RabbitDriver",
    "nats-js": "bench.drivers.nats_js:NatsDriver",
    "zmq-pushpull": "bench.drivers.transports:ZmqPushPull",
    "zmq-dealer-router": "bench.drivers.transports:ZmqDealerRouter",
    "starlette": "bench.drivers.transports:StarletteNoop",
}


def driver_class(name: str) -> type[Driver]:
    target = REGISTRY[name]
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
