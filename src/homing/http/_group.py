"""Group commit: many small writes from concurrent asyncio tasks share one transaction.

Each write is a function of an open ``Tx``. The writes queued while one commit is in flight
go together in the next transaction, so N concurrent requests cost one fsync instead of N.
If a batch fails, its writes are retried one transaction each, so one bad write cannot take
the others down with it. A write's caller resumes only after its transaction committed.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from homing.store.protocol import Store, Tx

Runner = Callable[[Callable[[], Any]], Awaitable[Any]]

_locks: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def write_lock(store: Store) -> AbstractContextManager[Any]:
    """On SQLite, one writer at a time per store object in this process.

    SQLite admits one writer; threads that meet a held write lock sleep in its busy handler
    in steps of up to 100 ms, which ruins latency under concurrency. Queueing on a Python
    lock first hands the database over at once. (Re-entrant: a handler may write through
    homing.http while its own transaction is open.) PostgreSQL needs no such lock.
    """
    if store.dialect != "sqlite":
        return nullcontext()
    with _guard:
        lock = _locks.get(store)
        if lock is None:
            lock = _locks[store] = threading.RLock()
    return lock


class GroupCommit:
    def __init__(self, store: Store, run_in_thread: Runner, max_batch: int = 128) -> None:
        self.store = store
        self.run_in_thread = run_in_thread
        self.max_batch = max_batch
        self._queue: list[tuple[Callable[[Tx], Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, fn: Callable[[Tx], Any]) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((fn, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return await fut

    def _commit(self, fns: list[Callable[[Tx], Any]]) -> list[Any]:
        with write_lock(self.store), self.store.transaction() as tx:
            return [fn(tx) for fn in fns]

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
