"""procrastinate (PyPI) on the local PostgreSQL, through its public API.

Producer: ``task.defer_async`` (one job) or ``task.batch_defer_async`` (a batch). Consumer:
``App.run_worker`` with its defaults (concurrency 1, LISTEN/NOTIFY on), one per process.
Schema from ``schema_manager.apply_schema_async``; jobs are kept after success (default).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import JOB_TYPE, PG_URL, QUEUE, Tally, payload, reset_postgres
from bench.drivers import Driver


def _make_app() -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=PG_URL))

    @app.task(name=JOB_TYPE, queue=QUEUE)
    def noop(i: int, p: str) -> None:
        Tally.started({"i": i})
        Tally.done()

    return app, noop


class _Producer:
    def __init__(self, batch: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.app, self.task = _make_app()
        self.ctx = self.app.open_async()
        self.loop.run_until_complete(self.ctx.__aenter__())
        self.batch = batch

    def send(self, seqs: list[int]) -> None:
        if len(seqs) == 1 and self.batch == 1:
            coro = self.task.defer_async(**payload(seqs[0]))
        else:
            coro = self.task.batch_defer_async(*[payload(i) for i in seqs])
        self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.run_until_complete(self.ctx.__aexit__(None, None, None))
        self.loop.close()


class ProcrastinateDriver(Driver):
    name = "procrastinate"
    family = "postgres"
    batch_ok = False  # batch_defer exists, but the worker takes one job per fetch
    batch_enqueue_ok = True
    durability = "synchronous_commit=on (server default); finished jobs kept"
    startup_s = 0.8

    def reset(self) -> None:
        reset_postgres(PG_URL)
        app, _ = _make_app()

        async def apply() -> None:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(apply())

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"version": version("procrastinate"), "concurrency": 1, "connector": "Psycopg"}

    def open_producer(self) -> _Producer:
        return _Producer(self.batch)

    def consume(self, slot: int) -> None:
        import logging

        logging.getLogger("procrastinate").setLevel(logging.WARNING)
        app, _ = _make_app()
        app.run_worker(queues=[QUEUE], concurrency=1, wait=True)
