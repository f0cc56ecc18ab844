"""The asyncio form of ``Sender``: concurrent calls store their messages together (one
transaction and one statement for the messages that arrive while the previous commit is
in flight) and wait for their outcomes on wake-ups registered before the messages exist."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from homing._failpoints import failpoint
from homing.database import Database, Transaction
from homing.http._group import GroupCommit
from homing.http._waiters import AsyncWake
from homing.http.sender import Sender, reply_url
from homing.store import http_queries as q
from homing.store.protocol import Tx


class _Enqueue:
    """One message for ``GroupCommit``: stored by the batch's ``begin`` with the others."""

    __slots__ = ("msg",)

    def __init__(self, msg: q.NewOutgoing) -> None:
        self.msg = msg

    def __call__(self, tx: Tx) -> None:
        return None  # stored already, in this transaction (_EnqueueBatch.begin)


class _EnqueueBatch:
    """``GroupCommit`` hooks: a batch's messages go in one ``insert_outgoing``."""

    def __init__(self, sender: Sender) -> None:
        self.sender = sender

    def begin(self, tx: Tx, fns: list[Callable[[Tx], Any]]) -> None:
        msgs = [fn.msg for fn in fns if isinstance(fn, _Enqueue)]
        if msgs:
            self.sender._insert_many(tx, msgs)

    def end(self, tx: Tx, state: Any) -> None:
        pass


class AsyncSender:
    """The asyncio form of ``Sender``: the same calls, awaitable; store work runs in a thread."""

    def __init__(self, db: Database, **options: Any) -> None:
        self.sync = Sender(db, **options)
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit] = (
            weakref.WeakKeyDictionary()
        )
        self._batch = _EnqueueBatch(self.sync)

    async def put(self, url: str, body: Any, **kw: Any) -> Any:
        return await self._call("put", url, body, None, **kw)

    async def send(self, url: str, body: Any, **kw: Any) -> Any:
        return await self._call("send", url, body, None, **kw)

    async def perform_job(self, url: str, local_url: str, body: Any, **kw: Any) -> Any:
        return await self._call("job", url, body, reply_url(local_url), **kw)

    async def _call(
        self,
        kind: str,
        url: str,
        body: Any,
        local_url: str | None,
        *,
        content_type: str | None = None,
        tx: Transaction | Tx | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        if tx is not None:  # the caller's transaction is bound to its thread: stay on it
            return self.sync.enqueue(
                kind,
                url,
                body,
                local_url=local_url,
                content_type=content_type,
                tx=tx,
                headers=headers,
                method=method,
            )
        msg = self.sync._new(kind, url, body, local_url, content_type, headers, method)
        # Registered before the row exists: no outcome recorded in this process is missed,
        # and the first read waits for one instead of finding the message just stored.
        wake = AsyncWake(msg.id)
        try:
            # concurrent calls share one commit (and one statement, _EnqueueBatch); each
            # returns only after its message is durable
            await self._group().run(_Enqueue(msg))
        except BaseException:
            wake.close()
            raise
        failpoint("http.sender.after_outbox_insert")
        return await self.sync.wait_async(msg.id, timeout=timeout, woken=wake)

    def _group(self) -> GroupCommit:
        loop = asyncio.get_running_loop()
        group = self._groups.get(loop)
        if group is None:
            group = self._groups[loop] = GroupCommit(
                self.sync.db.store, asyncio.to_thread, batch=self._batch
            )
        return group

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
