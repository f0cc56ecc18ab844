"""The server side of queued request/reply (seed 004): Transaction 2.

One transaction dequeues a request, runs the handler (which gets that transaction for its
own writes) and enqueues the reply to the client's private reply queue. A crash anywhere
before the commit rolls all of it back and leaves the request in the request queue, so the
handler's writes take effect exactly once.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from homing._failpoints import failpoint
from homing.database import Database, Transaction
from homing.errors import ConfigurationError, InvalidArgument, PermanentFailure
from homing.jobs import check_seconds
from homing.sessions._model import (
    DEFAULT_MAX_BODY_BYTES,
    Request,
    check_name,
    decode,
    encode_body,
)
from homing.store import sessions_queries as q

RequestHandler = Callable[[Request, Transaction], Any]
MAX_BACKOFF_S = 3600.0


class Server:
    """Answers requests of ``queues`` with ``handler(request, txn) -> reply body``.

    The handler's return value (JSON) becomes the reply. If it raises, its writes are rolled
    back and the request is retried after ``retry_in * 2**(attempts-1)`` seconds; after
    ``max_attempts`` failures, or at once for ``PermanentFailure``, the client gets a reply
    whose ``error`` says why. Several servers may serve the same queues (on PostgreSQL they
    work in parallel; SQLite runs one write transaction at a time, so keep handlers short).
    """

    def __init__(
        self,
        db: Database,
        queues: str | Sequence[str],
        handler: RequestHandler,
        *,
        max_attempts: int = 5,
        retry_in: float = 1.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        name: str | None = None,
    ) -> None:
        if not isinstance(db, Database):
            raise ConfigurationError(f"Server needs one homing.Database, got {type(db).__name__}")
        if isinstance(queues, str):
            queues = [queues]
        if not isinstance(queues, list | tuple) or not queues:
            raise InvalidArgument(f"queues must be a queue name or a list of them, got {queues!r}")
        self.queues = sorted({check_name("queue", x) for x in queues})
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {handler!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.db = db
        self.handler = handler
        self.max_attempts = max_attempts
        self.retry_in = check_seconds("retry_in", retry_in, allow_zero=True)
        self.max_body_bytes = max_body_bytes
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"

    def process_one(self) -> bool:
        """Handle one due request, if any; True if one was answered or retried."""
        store = self.db.store
        # Look first without locking, so idle servers do not hold SQLite's write lock or
        # make PostgreSQL commit a row lock on every poll.
        with store.transaction(write=False) as tx:
            if not q.request_due(tx, self.queues, now=store.clock.now()):
                return False
        failed: tuple[Request, BaseException] | None = None
        try:
            with self.db.transaction() as txn:
                row = q.next_request(txn.tx, self.queues, now=store.clock.now())
                if row is None:
                    return False
                request = Request(str(row["id"]), str(row["queue"]), decode(row["body"]))
                try:
                    body = self.handler(request, txn)
                    text = encode_body("reply body", body, self.max_body_bytes)
                except Exception as exc:
                    failed = (request, exc)
                    raise
                q.enqueue_reply(
                    txn.tx,
                    request.id,
                    reply=text,
                    error=None,
                    now=store.clock.now(),
                    server=self.name,
                    count_attempt=True,
                )
                failpoint("sessions.server_before_commit")
            return True
        except Exception as exc:
            if failed is None or failed[1] is not exc:
                raise  # the store failed, not the handler
        self._record_failure(*failed)
        return True

    def _record_failure(self, request: Request, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"[:10_000]
        store = self.db.store
        with store.transaction() as tx:
            row = q.get_request(tx, request.id)
            if row is None or row["state"] != "queued":
                return  # another server answered it meanwhile
            attempts = int(row["attempts"]) + 1
            now = store.clock.now()
            if isinstance(exc, PermanentFailure) or attempts >= self.max_attempts:
                why = (
                    "permanent failure"
                    if isinstance(exc, PermanentFailure)
                    else (f"gave up after {attempts} attempts")
                )
                q.postpone_request(tx, request.id, error=message, available_at=now)
                q.enqueue_reply(
                    tx,
                    request.id,
                    reply=None,
                    error=f"{why}: {message}",
                    now=now,
                    server=self.name,
                    count_attempt=False,
                )
            else:
                delay = min(MAX_BACKOFF_S, self.retry_in * 2 ** (attempts - 1))
                q.postpone_request(tx, request.id, error=message, available_at=now + delay)

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        until_idle: bool = False,
        idle_wait: float = 0.2,
    ) -> int:
        """Serve until ``stop`` is set (or, with ``until_idle``, until no request is due);
        returns how many requests were handled."""
        handled = 0
        poll = 0.01 if self.db.store.dialect == "sqlite" else idle_wait
        while stop is None or not stop.is_set():
            if self.process_one():
                handled += 1
                continue
            if until_idle:
                break
            if stop is not None and self.db.store.dialect == "sqlite":
                stop.wait(poll)
            else:
                self.db.store.wait_for_notification(q.REQUEST_CHANNEL, poll)
        return handled

    def run_for(self, seconds: float) -> int:
        """Serve for ``seconds`` (handy in scripts and tests)."""
        stop = threading.Event()
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        try:
            return self.run(stop, idle_wait=min(0.2, seconds))
        finally:
            timer.cancel()
