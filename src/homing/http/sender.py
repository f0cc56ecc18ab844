"""The sending side of seed 000: ``put`` (Option 1), ``send`` (Option 2), ``perform_job``.

Every call first stores the request, with a new UUIDv7 message id, in the durable outbox of
the sender's store; a dispatcher delivers it. Outside a transaction the call commits and
waits for the outcome. Inside one (``tx=`` or an open ``db.transaction()`` on this thread)
the request commits with the caller's writes (transactional outbox) and the call returns a
``Pending`` at once: wait on it after the commit.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from homing import ids
from homing._failpoints import failpoint
from homing.database import Database, Transaction
from homing.errors import InvalidArgument, NotFound, PayloadTooLarge
from homing.http import wire
from homing.http._claims import claimed_row
from homing.http._waiters import AsyncWake, waiters
from homing.http.dispatcher import DEADLINE_PREFIX, Dispatcher
from homing.http.errors import DeadlineExceeded, MessageFailed
from homing.http.policy import (
    DEFAULT_ABSURD_AFTER_S,
    DEFAULT_FATAL_STATUSES,
    EndpointLimit,
    RetryPolicy,
)
from homing.store import http_queries as q
from homing.store.protocol import Tx

DEFAULT_MAX_BODY = 1024 * 1024
#: How often a waiter looks at the store when no local dispatcher or reply node wakes it.
POLL_S = 0.25
#: Where a Receiver takes job results (``INTERNAL + "/reply"`` in the receiver).
REPLY_PATH = "/_homing/reply"


@dataclass(frozen=True)
class Response:
    """A stored answer: ``value`` is the body decoded (JSON parsed, else bytes)."""

    status: int
    content_type: str
    body: bytes

    @property
    def value(self) -> Any:
        if not self.body and self.status == 204:
            return None
        try:
            return wire.decode_body(self.content_type, self.body)
        except InvalidArgument:
            return self.body


@dataclass(frozen=True)
class Pending:
    """A message stored in the outbox; ``wait()`` blocks until it is delivered (or fails)."""

    id: str
    kind: str
    sender: Sender

    def wait(self, timeout: float | None = None) -> Any:
        return self.sender.wait(self.id, timeout=timeout)

    async def wait_async(self, timeout: float | None = None) -> Any:
        return await self.sender.wait_async(self.id, timeout=timeout)


class Sender:
    """Reliable HTTP requests from one store (the outbox lives there).

    ``dispatch=True`` runs a dispatcher in this process (a thread); with ``False`` another
    process (``homing serve``) drains the outbox and the calls here only store and wait.
    ``absurd_after`` seconds after it was stored a message that is still undelivered ends
    with ``DeadlineExceeded``; keep it below the receivers' inbox retention. The other
    options configure the dispatcher (see ``Dispatcher``): per-endpoint ``signing``,
    ``webhook_signing`` (Standard Webhooks), ``limits``, ``disable_after`` and ``batch``
    (Option 2 messages to a homing receiver, up to this many a request).
    """

    def __init__(
        self,
        db: Database,
        *,
        dispatch: bool = True,
        absurd_after: float = DEFAULT_ABSURD_AFTER_S,
        max_body: int = DEFAULT_MAX_BODY,
        retry: RetryPolicy | None = None,
        fatal_statuses: Iterable[int] = DEFAULT_FATAL_STATUSES,
        request_timeout: float = 30.0,
        per_destination: int = 8,
        max_in_flight: int = 64,
        allowed_hosts: Iterable[str] = (),
        signing: Mapping[str, tuple[str, bytes]] | None = None,
        webhook_signing: Mapping[str, Sequence[str | bytes]] | None = None,
        limits: Mapping[str, EndpointLimit] | None = None,
        disable_after: float | None = None,
        job_check: float = 30.0,
        batch: int = 0,
    ) -> None:
        if not isinstance(db, Database):
            raise InvalidArgument(
                f"Sender needs a homing.Database (homing.connect(url)), got {type(db).__name__}"
            )
        if absurd_after <= 0:
            raise InvalidArgument(f"absurd_after must be > 0 seconds, got {absurd_after!r}")
        self.db = db
        self.absurd_after = float(absurd_after)
        self.max_body = max_body
        #: makes message ids; a sharded sender sets it so each id is owned by this shard
        self.new_id: Callable[[], str] = ids.uuid7
        self.dispatcher: Dispatcher | None = None
        if dispatch:
            self.dispatcher = Dispatcher(
                db,
                retry=retry,
                fatal_statuses=fatal_statuses,
                request_timeout=request_timeout,
                per_destination=per_destination,
                max_in_flight=max_in_flight,
                allowed_hosts=allowed_hosts,
                signing=signing,
                webhook_signing=webhook_signing,
                limits=limits,
                disable_after=disable_after,
                job_check=job_check,
                batch=batch,
            ).start()

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher = None

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the three calls -------------------------------------------------------------------
    def put(
        self,
        url: str,
        body: Any,
        *,
        content_type: str | None = None,
        tx: Transaction | Tx | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        """Option 1: deliver ``body`` and return the receiver's (stored) response body.
        ``headers`` (e.g. ``Authorization``) and ``method`` are stored with the message."""
        return self._call("put", url, body, None, content_type, tx, timeout, headers, method)

    def send(
        self,
        url: str,
        body: Any,
        *,
        content_type: str | None = None,
        tx: Transaction | Tx | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        """Option 2: deliver ``body``; returns None once the receiver acknowledged (204)."""
        return self._call("send", url, body, None, content_type, tx, timeout, headers, method)

    def perform_job(
        self,
        url: str,
        local_url: str,
        body: Any,
        *,
        content_type: str | None = None,
        tx: Transaction | Tx | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        """A long job: the receiver acks with 202 and later delivers the result, reliably,
        to ``local_url``: the reply node (``/_homing/reply``) of a ``Receiver`` on this
        store, or that receiver's base URL. Returns that result."""
        local_url = reply_url(local_url)
        return self._call("job", url, body, local_url, content_type, tx, timeout, headers, method)

    # -- storing -------------------------------------------------------------------------
    def enqueue(
        self,
        kind: str,
        url: str,
        body: Any,
        *,
        local_url: str | None = None,
        content_type: str | None = None,
        tx: Transaction | Tx | None = None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> Pending:
        """Store one message in the outbox (in ``tx`` if given) and return its handle."""
        msg = self._new(kind, url, body, local_url, content_type, headers, method)
        self._store(msg, tx.tx if isinstance(tx, Transaction) else tx)
        return Pending(msg.id, kind, self)

    def _store(self, msg: q.NewOutgoing, tx: Tx | None) -> None:
        """Insert ``msg`` in ``tx`` (the caller commits), or in a transaction of its own."""
        if tx is not None:
            self._insert_many(tx, [msg])
            tx.call_after_commit(lambda: failpoint("http.sender.after_outbox_insert"))
            return
        with self.db.store.transaction() as own:
            self._insert_many(own, [msg])
        failpoint("http.sender.after_outbox_insert")

    def _new(
        self,
        kind: str,
        url: str,
        body: Any,
        local_url: str | None,
        content_type: str | None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> q.NewOutgoing:
        """The outbox row of one message, checked (kind, URLs, headers, method, size)."""
        if kind not in ("put", "send", "job"):
            raise InvalidArgument(f"kind must be put, send or job, got {kind!r}")
        if kind == "job":
            local_url = reply_url(local_url)
        wire.check_http(url)
        own = wire.check_headers(headers)
        verb = wire.check_method(method)
        ctype, data = wire.encode_body(body, content_type)
        if len(data) > self.max_body:
            raise PayloadTooLarge(
                f"the body is {len(data)} bytes, over the limit of {self.max_body}; send a "
                "reference to large data, or raise max_body on both sides"
            )
        now = self.db.clock.now()
        return q.NewOutgoing(
            id=self.new_id(),
            kind=kind,
            method=verb,
            url=url,
            content_type=ctype,
            body=data,
            response_url=local_url,
            in_reply_to=None,
            reply_status=None,
            deadline=now + self.absurd_after,
            created_at=now,
            headers=json.dumps(own) if own else None,
        )

    def _insert_many(self, tx: Tx, msgs: Sequence[q.NewOutgoing]) -> None:
        """Store the rows (one statement); with a dispatcher in this process, claimed by it
        and handed to it once ``tx`` commits (no claim transaction of its own:
        ``homing.http._claims``), as many as its hand-off queue has room for; the others
        are stored unclaimed, for any dispatcher's claim."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            q.insert_outgoing(tx, msgs)
            return
        claim = dispatcher.handoff.claim(self.db.clock.now())
        room = dispatcher.handoff.room() if claim is not None else 0
        claimed, rest = list(msgs[:room]), list(msgs[room:])
        if claim is not None and claimed:
            q.insert_outgoing(tx, claimed, claim=claim)
            rows = [claimed_row(m, *claim) for m in claimed]
            tx.call_after_commit(lambda: dispatcher.hand_off(*rows))
        if rest:
            q.insert_outgoing(tx, rest)
            tx.call_after_commit(dispatcher.wake)

    def _call(
        self,
        kind: str,
        url: str,
        body: Any,
        local_url: str | None,
        content_type: str | None,
        tx: Transaction | Tx | None,
        timeout: float | None,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        joined = tx if tx is not None else self.db.store.in_transaction()
        msg = self._new(kind, url, body, local_url, content_type, headers, method)
        if joined is not None:  # the caller commits; then pending.wait()
            self._store(msg, joined.tx if isinstance(joined, Transaction) else joined)
            return Pending(msg.id, kind, self)
        # Registered before the row exists: no outcome recorded in this process is missed,
        # and the first read waits for one instead of finding the message just stored.
        woken = threading.Event()
        waiters.add(msg.id, woken.set)
        try:
            self._store(msg, None)
            return self.wait(msg.id, timeout=timeout, woken=woken)
        finally:
            waiters.remove(msg.id, woken.set)

    # -- waiting -------------------------------------------------------------------------
    def poll(self, msg_id: str) -> tuple[bool, Any]:
        """(True, result) once the message is finished; raises if it failed. One read
        (on PostgreSQL one round trip, not a transaction's three)."""
        with self.db.store.read() as tx:
            row = q.outgoing(tx, msg_id)
        if row is None:
            raise NotFound(f"no outgoing message {msg_id!r} in the outbox of {self.db.url}")
        if row.state == "delivered":
            if row.kind == "send":
                return True, None
            return True, Response(
                row.status or 200, row.resp_content_type or wire.BYTES_TYPE, row.resp_body or b""
            ).value
        if row.state == "failed":
            error = row.last_error or ""
            cls = DeadlineExceeded if error.startswith(DEADLINE_PREFIX) else MessageFailed
            raise cls(
                f"message {msg_id} to {row.url} failed: {row.last_error}",
                msg_id=msg_id,
                status=row.status,
                body=row.resp_body,
            )
        if row.state == "accepted" and self.db.clock.now() > row.deadline:
            with self.db.store.transaction() as wtx:
                q.mark_failed(
                    wtx,
                    msg_id,
                    now=self.db.clock.now(),
                    error=f"{DEADLINE_PREFIX} while waiting for the job's result",
                    status=None,
                    content_type=None,
                    body=None,
                )
            return self.poll(msg_id)
        return False, None

    def wait(
        self,
        msg_id: str,
        *,
        timeout: float | None = None,
        woken: threading.Event | None = None,
    ) -> Any:
        """Block until the message is delivered (its result) or fails (raises).
        ``timeout`` only bounds this wait; the message stays in the outbox. ``woken``: a
        wake-up registered in ``waiters`` before the message was stored (by the caller that
        stores it, which also removes it): the first read waits for it, or ``POLL_S``."""
        end = None if timeout is None else time.monotonic() + timeout
        event = woken if woken is not None else threading.Event()
        if woken is None:
            waiters.add(msg_id, event.set)  # before the first poll: no outcome is missed
        try:
            if woken is not None:
                event.wait(_poll_interval(msg_id, end, timeout))
                event.clear()
            while True:
                if waiters.sent(msg_id):
                    return None  # a send this process delivered: nothing to read back
                done, result = self.poll(msg_id)
                if done:
                    return result
                event.wait(_poll_interval(msg_id, end, timeout))
                event.clear()
        finally:
            if woken is None:
                waiters.remove(msg_id, event.set)

    async def wait_async(
        self, msg_id: str, *, timeout: float | None = None, woken: AsyncWake | None = None
    ) -> Any:
        """``woken``: a wake-up registered before the message was stored (by the caller
        that stores it), so that its first poll can wait for a wake-up, or ``POLL_S``,
        instead of reading a row that cannot be finished yet."""
        end = None if timeout is None else time.monotonic() + timeout
        wake = woken if woken is not None else AsyncWake(msg_id)
        try:
            if woken is not None:
                await wake.wait(_poll_interval(msg_id, end, timeout))
            while True:
                if waiters.sent(msg_id):
                    return None  # a send this process delivered: nothing to read back
                done, result = await asyncio.to_thread(self.poll, msg_id)
                if done:
                    return result
                await wake.wait(_poll_interval(msg_id, end, timeout))
        finally:
            wake.close()


def reply_url(local_url: Any) -> str:
    """The reply node URL for ``perform_job``: a receiver's base URL gets ``/_homing/reply``
    appended; any other path is refused now, because a result sent there would be answered
    404 and the caller would wait for the absurd deadline."""
    wire.check_http(local_url)
    parts = urlsplit(local_url)
    if parts.path in ("", "/"):
        return local_url.rstrip("/") + REPLY_PATH
    if parts.path.rstrip("/").endswith(REPLY_PATH) and not parts.query:
        return local_url
    raise InvalidArgument(
        f"local_url {local_url[:200]!r} is not a reply node: give the URL of a homing "
        f"Receiver on this store (its base URL, or base + {REPLY_PATH!r})"
    )


def _poll_interval(msg_id: str, end: float | None, timeout: float | None) -> float:
    """How long to wait for a wake-up before polling again; TimeoutError once ``end`` passed."""
    left = POLL_S if end is None else min(POLL_S, end - time.monotonic())
    if left <= 0:
        raise TimeoutError(
            f"message {msg_id} is not delivered yet after {timeout}s; it stays in the outbox "
            "and is still retried: wait again with Sender.wait(id)"
        )
    return left
