"""Group commit: many small writes from concurrent asyncio tasks share one transaction.

Each write is a function of an open ``Tx``. (On SQLite the store itself queues this
process's writers on one lock, so a commit here never sleeps in SQLite's busy handler.) The writes queued while one commit is in flight
go together in the next transaction, so N concurrent requests cost one fsync instead of N.
If a batch fails, its writes are retried one transaction each, so one bad write cannot take
the others down with it. A write's caller resumes only after its transaction committed.

``batch``: hooks around each transaction's writes, for writes that are cheaper done for
the whole batch at once (the receiver stores its new messages in one statement before
their writes run and marks the handled ones done in one statement after).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from homing.store.protocol import Store, Tx

Runner = Callable[[Callable[[], Any]], Awaitable[Any]]


class BatchHooks(Protocol):
    def begin(self, tx: Tx, fns: list[Callable[[Tx], Any]]) -> Any:
        """Before the writes, in their transaction; returns what ``end`` gets."""

    def end(self, tx: Tx, state: Any) -> None:
        """After the writes, before the commit."""


class GroupCommit:
    def __init__(
        self,
        store: Store,
        run_in_thread: Runner,
        max_batch: int = 128,
        batch: BatchHooks | None = None,
    ) -> None:
        self.store = store
        self.run_in_thread = run_in_thread
        self.max_batch = max_batch
        self.batch = batch
        self._queue: list[tuple[Callable[[Tx], Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, fn: Callable[[Tx], Any]) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((fn, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return await fut

    def _commit(self, fns: list[Callable[[Tx], Any]]) -> list[Any]:
        with self.store.transaction() as tx:
            if self.batch is None:
                return [fn(tx) for fn in fns]
            state = self.batch.begin(tx, fns)
            results = [fn(tx) for fn in fns]
            self.batch.end(tx, state)
            return results

    async def _flush(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            fns = [fn for fn, _ in batch]
            try:
                results = await self.run_in_thread(lambda fns=fns: self._commit(fns))  # type: ignore[misc]
            except Exception:
                for fn, fut in batch:
                    try:
                        result = await self.run_in_thread(lambda fn=fn: self._commit([fn])[0])  # type: ignore[misc]
                    except Exception as exc:
                        if not fut.done():
                            fut.set_exception(exc)
                    else:
                        if not fut.done():
                            fut.set_result(result)
                continue
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
