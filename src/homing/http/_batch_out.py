"""The dispatcher's batches: Option 2 messages to one homing receiver, many a request.

A receiver that takes batches says where in the ``Homing-Batch`` header of its answer to
an Option 2 message (``batch_wire``). From then on the dispatcher queues that
destination's due ``send`` messages by the receiver's batch URL, and at most
``BATCHES_IN_FLIGHT`` requests a batch URL carry them, each as many as have queued up to
``size`` (so the batches grow with the load, as a group commit's do). Each message's
outcome is its own (stored, retried or failed, fenced by the claim token as ever); a
lost answer leaves them all to be sent again, and the receiver's inbox drops the repeats.

Left out of batches: other modes, rows whose endpoint has a rate or concurrency limit or
Standard Webhooks signing (those go alone, as before), bodies over ``MAX_BATCH_BODY``.
A batch URL that answers 404/405/415/501 is dropped for the dispatcher's lifetime and its
messages go alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from homing._failpoints import failpoint
from homing.errors import InvalidArgument
from homing.http import batch_wire, wire
from homing.http._client import HttpError
from homing.http._endpoints import MAX_TRACKED, for_endpoint, origin, retry_after_seconds, target
from homing.http._waiters import notify_changed
from homing.http.policy import is_fatal
from homing.store import http_queries as q

if TYPE_CHECKING:
    from homing.http.dispatcher import Clients, Dispatcher

BATCHES_IN_FLIGHT = 2  # requests at once a batch URL, from one dispatcher
MAX_BATCH_BODY = 64 * 1024  # a bigger message goes alone
MAX_BATCH_BYTES = 1024 * 1024  # bodies in one batch (the receiver takes up to 8 MiB)
_NOT_TAKEN = frozenset({404, 405, 415, 501})
log = logging.getLogger("homing.http")


class Batcher:
    """Lives on the dispatcher's event loop (no locks: one thread)."""

    def __init__(self, dispatcher: Dispatcher, size: int) -> None:
        self.d = dispatcher
        self.size = size
        self.urls: dict[str, str] = {}  # destination URL -> its receiver's batch URL
        self.refused: set[str] = set()  # batch URLs that answered as if they had none
        self.queues: dict[str, deque[q.OutboxRow]] = {}
        self.senders: dict[str, int] = {}
        self.rows = 0  # rows queued or being sent (claimed: they count as in flight)
        self.tasks: set[asyncio.Task[None]] = set()
        self._serving: tuple[Clients, str, Callable[[asyncio.Task[None]], None]] | None = None

    def serve(
        self, clients: Clients, token: str, on_done: Callable[[asyncio.Task[None]], None]
    ) -> None:
        """Start taking rows (the dispatcher's clients, claim token, and what to call when
        a sender ends: a place is free)."""
        self._serving = (clients, token, on_done)

    def offer(self, row: q.OutboxRow) -> bool:
        """Take ``row`` into a batch if it can go in one (True), starting a sender for its
        batch URL when fewer than ``BATCHES_IN_FLIGHT`` run."""
        batch_url = self.batch_url(row)
        if batch_url is None or self._serving is None:
            return False
        self.queues.setdefault(batch_url, deque()).append(row)
        self.rows += 1
        running = self.senders.get(batch_url, 0)
        if running < BATCHES_IN_FLIGHT:
            self.senders[batch_url] = running + 1
            clients, token, on_done = self._serving
            task = asyncio.create_task(self._run(clients, batch_url, token))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            task.add_done_callback(on_done)
        return True

    def learn(self, url: str, header: str | None) -> None:
        """Note the batch URL a receiver's answer to a message to ``url`` named."""
        if not header or not header.startswith("/") or len(header) > 2048:
            return
        batch_url = origin(url) + header
        if batch_url in self.refused or self.urls.get(url) == batch_url:
            return
        if len(self.urls) >= MAX_TRACKED:
            self.urls.clear()
        self.urls[url] = batch_url

    def batch_url(self, row: q.OutboxRow) -> str | None:
        """Where ``row`` goes in a batch, or None: it goes alone."""
        batch_url = self.urls.get(row.url)
        if (
            batch_url is None
            or row.state != "pending"
            or row.kind != "send"
            or row.response_url
            or len(row.body) > MAX_BATCH_BODY
            or for_endpoint(self.d.webhook_signing, row.url)
            or self.d.endpoints.limited(row.url)
            or self.d.endpoints.disabled_reason(row.url) is not None
        ):
            return None
        return batch_url

    def _take(self, batch_url: str) -> list[q.OutboxRow]:
        queue = self.queues[batch_url]
        rows: list[q.OutboxRow] = []
        size = 0
        while queue and len(rows) < self.size:
            if rows and size + len(queue[0].body) > MAX_BATCH_BYTES:
                break
            row = queue.popleft()
            size += len(row.body)
            rows.append(row)
        return rows

    async def _run(self, clients: Clients, batch_url: str, token: str) -> None:
        """One sender of ``batch_url``'s queue: batches until the queue is empty."""
        try:
            while self.queues.get(batch_url):
                rows = self._take(batch_url)
                try:
                    async with self.d.endpoints.slot(rows[0].url):
                        await self._send(clients, batch_url, rows, token)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # never let one batch kill the loop
                    log.exception("a batch to %s failed unexpectedly", batch_url)
                    await self._each(self.d._retry, rows, token, f"internal error: {exc}")
                finally:
                    self.rows -= len(rows)
        finally:
            left = self.senders.get(batch_url, 1) - 1
            if left > 0:
                self.senders[batch_url] = left
            else:
                self.senders.pop(batch_url, None)
                if not self.queues.get(batch_url):
                    self.queues.pop(batch_url, None)

    async def _send(
        self, clients: Clients, batch_url: str, rows: list[q.OutboxRow], token: str
    ) -> None:
        d = self.d
        now = d.db.clock.now()
        live = [r for r in rows if now <= r.deadline]
        for row in rows:
            if now > row.deadline:  # its own path says how
                await d._deliver(clients, row, token)
        if not live:
            return
        if len(live) == 1:
            await d._deliver(clients, live[0], token)
            return
        body = batch_wire.encode_batch(
            [
                batch_wire.BatchMessage(row.method, target(row.url), d._headers(row), row.body)
                for row in live
            ]
        )
        failpoint("http.sender.batch_before_request")
        d.stats["attempts"] += len(live)
        d.stats["batches"] += 1
        try:
            resp = await clients.trusted.request(
                "POST", batch_url, content=body, headers={"content-type": batch_wire.BATCH_TYPE}
            )
        except HttpError as exc:
            await self._each(d._retry, live, token, f"{type(exc).__name__}: {exc}")
            return
        if resp.status_code in _NOT_TAKEN:  # no batches there (any more): each goes alone
            if len(self.refused) >= MAX_TRACKED:
                self.refused.clear()  # forgotten ones are tried once more, then refused again
            self.refused.add(batch_url)
            self.urls = {u: b for u, b in self.urls.items() if b != batch_url}
            for row in live:
                await d._deliver(clients, row, token)
            return
        try:
            if resp.status_code != 200:
                raise InvalidArgument(f"the receiver answered {resp.status_code} to a batch")
            results = batch_wire.decode_results(resp.content, len(live))
        except InvalidArgument as exc:
            after = retry_after_seconds(resp.headers.get("retry-after"))
            await self._each(d._retry, live, token, str(exc), after)
            return
        failpoint("http.sender.batch_after_2xx_before_tombstone")
        await self._outcomes(live, results, token)

    async def _outcomes(
        self, rows: list[q.OutboxRow], results: list[tuple[int, str]], token: str
    ) -> None:
        d = self.d
        assert d._group is not None
        waits: list[Any] = []
        for row, (status, detail) in zip(rows, results, strict=True):
            if 200 <= status < 300:
                tomb = functools.partial(
                    d._tombstone, row, token, "delivered", status, wire.BYTES_TYPE, b"", None, None
                )
                waits.append(d._group.run(tomb))
            elif is_fatal(status, d.fatal_statuses):
                error = f"the receiver answered {status}: {detail[:500]}"
                answer = (status, "text/plain", detail.encode())
                waits.append(d._db(d._fail_row, row, token, error, answer))
            else:
                waits.append(
                    d._retry(row, token, f"the receiver answered {status}: {detail}", None)
                )
        done = await asyncio.gather(*waits)
        for row, (status, _), stored in zip(rows, results, done, strict=True):
            if 200 <= status < 300 and stored:
                d.stats["delivered"] += 1
                notify_changed(row.id, sent=True)  # batches carry sends only (batch_url)

    @staticmethod
    async def _each(
        retry: Any, rows: list[q.OutboxRow], token: str, error: str, after: float | None = None
    ) -> None:
        await asyncio.gather(*(retry(row, token, error, after) for row in rows))
