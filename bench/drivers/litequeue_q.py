"""litequeue (PyPI): ``put`` to enqueue, ``pop`` + ``done`` to consume (it has no worker;
the loop polls every 1 ms when empty). It sets ``PRAGMA synchronous = NORMAL`` itself: in
WAL mode a commit is not fsynced, so the last commits can be lost on power failure."""

from __future__ import annotations

import json
import time
from typing import Any

from bench.common import Tally, payload
from bench.drivers import Driver


class LiteQueueDriver(Driver):
    name = "litequeue"
    family = "sqlite"
    durability = "WAL, synchronous=NORMAL (set by litequeue): commits not fsynced"

    @property
    def path(self) -> str:
        return str(self.workdir / "litequeue.db")

    def _queue(self) -> Any:
        from litequeue import LiteQueue

        return LiteQueue(self.path)

    def reset(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            (self.workdir / f"litequeue.db{suffix}").unlink(missing_ok=True)
        self._queue().close()

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        q = self._queue()
        sync = q.conn.execute("PRAGMA synchronous").fetchone()[0]
        q.close()
        return {
            "version": version("litequeue"),
            "synchronous": {1: "NORMAL", 2: "FULL"}.get(sync, sync),
        }

    def open_producer(self) -> Any:
        return _Producer(self._queue())

    def consume(self, slot: int) -> None:
        q = self._queue()
        while True:
            msg = q.pop()
            if msg is None:
                time.sleep(0.001)
                continue
            Tally.started(msg.data)
            q.done(msg.message_id)
            Tally.done()


class _Producer:
    def __init__(self, q: Any) -> None:
        self.q = q

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            self.q.put(json.dumps(payload(i)))

    def close(self) -> None:
        self.q.close()
