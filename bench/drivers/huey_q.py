"""huey's ``SqliteHuey`` (PyPI), through its public API: a ``@huey.task`` called to enqueue,
and huey's own consumer (``huey.create_consumer``, one worker thread) in each process.

Default settings: WAL, huey leaves ``synchronous`` at SQLite's default (FULL); a dequeue
deletes the task row, so a job is gone before it runs: there is no acknowledgement.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import Tally
from bench.drivers import Driver


class HueySqlite(Driver):
    name = "huey-sqlite"
    family = "sqlite"
    durability = "WAL, SQLite default synchronous (FULL); no ack: a dequeue deletes the job"
    startup_s = 0.3

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from huey import SqliteHuey

        self.huey = SqliteHuey("bench", filename=str(self.workdir / "huey.db"))

        @self.huey.task(name="bench_noop")
        def noop(data: dict[str, Any]) -> None:
            Tally.started(data)
            Tally.done()

        self.task = noop

    def reset(self) -> None:
        self.huey.flush()

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        conn = self.huey.storage.conn
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        self.huey.storage.close()
        return {
            "version": version("huey"),
            "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL"}.get(sync, sync),
            "journal_mode": mode,
            "consumer": "workers=1, worker_type=thread (per process)",
        }

    def open_producer(self) -> Any:
        return _Producer(self)

    def consume(self, slot: int) -> None:
        logging.getLogger("huey").setLevel(logging.WARNING)
        self.huey.storage.close()  # the fork inherited the parent's connection
        consumer = self.huey.create_consumer(workers=1, worker_type="thread", periodic=False)
        consumer.run()


class _Producer:
    def __init__(self, drv: HueySqlite) -> None:
        self.drv = drv
        drv.huey.storage.close()

    def send(self, seqs: list[int]) -> None:
        from bench.common import payload

        for i in seqs:
            self.drv.task(payload(i))

    def close(self) -> None:
        self.drv.huey.storage.close()
