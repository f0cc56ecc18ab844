"""The server side of queued request/reply (seed 004): Transaction 2.

One transaction dequeues a request, runs the handler (which gets that transaction for its
own writes) and enqueues the reply to the client's private reply queue. A crash anywhere
before the commit rolls all of it back and leaves the request in the request queue, so the
handler's writes take effect exactly once. Taking the request (a lease, counted as an
attempt) is a short transaction of its own, so a poison request that kills its server is
counted and dead-lettered after ``max_attempts``, and a hung handler blocks nobody.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from homing._failpoints import failpoint
from homing.backoff import Backoff
from homing.database import Database, Transaction
from homing.errors import ConfigurationError, HomingError, InvalidArgument, PermanentFailure
from homing.ids import uuid7
from homing.jobs import check_seconds
from homing.sessions._model import (
    DEFAULT_MAX_BODY_BYTES,
    Request,
    check_name,
    decode,
    encode_body,
)
from homing.store import sessions_queries as q
from homing.store import sessions_server_queries as sq

RequestHandler = Callable[[Request, Transaction], Any]
MAX_BACKOFF_S = 3600.0
DEFAULT_LEASE_S = 10.0
DEFAULT_HANDLER_TIMEOUT_S = 300.0
_DEFERRED_TRIES = 2  # SQLite: deferred tries before a handler runs under the write lock


class _HandlerFailed(Exception):
    """The handler raised (or returned what cannot be a reply): ``exc`` says what."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


class _LeaseLost(Exception):
    """Another server took the request after this one's lease ran out."""


class _WriteConflict(Exception):
    """SQLite refused a deferred transaction's write (another writer came first)."""


class _LeaseKeeper:
    """Extends the leases of the requests a server's handlers are running, each for at
    most ``handler_timeout`` seconds: a server that dies stops extending at once, a hung
    handler after the timeout; either way the request becomes due again when its lease
    runs out. One thread per server (and process), started on first use and ended after
    ``IDLE_S`` with nothing to keep: a thread a request cost ~290 us of CPU to start and
    join (an ad hoc timeit here; the round trips it saved are in
    bench/results/sessions-ab-one-lease-keeper.md)."""

    IDLE_S = 2.0

    def __init__(self, server: Server) -> None:
        self.server = server
        self._cond = threading.Condition()
        self._held: dict[str, _Held] = {}
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @contextmanager
    def keeping(self, request_id: str, token: str) -> Iterator[None]:
        """Keep the request leased while the block runs."""
        beat = self.server.lease / 3
        now = time.monotonic()
        with self._cond:
            if self._pid != os.getpid():  # a forked child: its parent's thread is not here
                self._pid, self._thread, self._held = os.getpid(), None, {}
            self._held[request_id] = _Held(token, now + beat, now + self.server.handler_timeout)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="homing-sessions-lease", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._held.pop(request_id, None)

    def holds(self, request_id: str) -> bool:
        """Whether the request's lease is still being extended."""
        with self._cond:
            return request_id in self._held

    def _run(self) -> None:
        while True:
            due = self._wait_for_beats()
            if due is None:
                return
            for request_id, token in due:
                if not self._extend(request_id, token):
                    with self._cond:
                        held = self._held.get(request_id)
                        if held is not None and held.token == token:
                            del self._held[request_id]  # lost: another server has it

    def _wait_for_beats(self) -> list[tuple[str, str]] | None:
        """The leases due an extension now (those past ``handler_timeout`` are let go);
        None when nothing was held for ``IDLE_S`` (the thread ends)."""
        beat = self.server.lease / 3
        with self._cond:
            while True:
                if not self._held:
                    if not self._cond.wait(self.IDLE_S) and not self._held:
                        self._thread = None
                        return None
                    continue
                now = time.monotonic()
                next_beat = min(h.beat for h in self._held.values())
                if next_beat <= now:
                    break
                self._cond.wait(next_beat - now)
            due = []
            for request_id, held in list(self._held.items()):
                if held.give_up <= now:
                    del self._held[request_id]  # a hung handler: let the lease run out
                elif held.beat <= now:
                    held.beat = now + beat
                    due.append((request_id, held.token))
            return due

    def _extend(self, request_id: str, token: str) -> bool:
        """False if the lease was lost; True if kept, or if the store could not be asked
        (busy or away: tried again on the next beat). Not durable by itself, as the take:
        an extension lost in a crash is a lease that ran out."""
        store = self.server.db.store
        try:
            with store.statement(durable=False) as tx:
                return sq.extend_lease(
                    tx, request_id, token, until=store.clock.now() + self.server.lease
                )
        except HomingError:
            return True


@dataclass
class _Held:
    token: str
    beat: float  # monotonic time of the next extension
    give_up: float  # monotonic time after which the handler counts as hung


class Server:
    """Answers requests of ``queues`` with ``handler(request, txn) -> reply body``.

    Taking a request counts an attempt and leases it for ``lease`` seconds (extended while
    the handler runs, for at most ``handler_timeout`` seconds). A server that crashes or
    hangs stops extending, so its request returns to the queue when the lease runs out,
    and the late handler's commit is refused. If the handler raises, its writes are rolled
    back and the request is retried after ``retry_in * 2**(attempts-1)`` seconds. After
    ``max_attempts`` takes without an answer (exceptions, crashes and hangs alike), or at
    once for ``PermanentFailure``, the client gets a dead reply whose ``error`` says why.

    The handler runs in its own transaction, not in the one that took the request. On
    SQLite that transaction is deferred: it takes the write lock at the handler's first
    write, so a handler that computes or waits before writing blocks nobody's submit.
    """

    def __init__(
        self,
        db: Database,
        queues: str | Sequence[str],
        handler: RequestHandler,
        *,
        max_attempts: int = 5,
        retry_in: float = 1.0,
        lease: float = DEFAULT_LEASE_S,
        handler_timeout: float = DEFAULT_HANDLER_TIMEOUT_S,
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
        self.lease = check_seconds("lease", lease, allow_zero=False)
        self.handler_timeout = check_seconds("handler_timeout", handler_timeout, allow_zero=False)
        self.max_body_bytes = max_body_bytes
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._leases = _LeaseKeeper(self)

    def process_one(self) -> bool:
        """Take one due request, if any, and answer, retry or dead-letter it; True if one
        was taken."""
        store = self.db.store
        # SQLite: look first without locking, so that idle servers do not take the write
        # lock on every poll. PostgreSQL's take skips locked rows and, with nothing due,
        # locks and writes nothing: a look first would be one more round trip a request.
        if not store.capabilities.skip_locked:
            with store.read() as tx:
                if not sq.request_due(tx, self.queues, now=store.clock.now()):
                    return False
        taken = self._take()
        if taken is None:
            return False
        if taken != "dead":
            request, token = taken
            with self._leases.keeping(request.id, token):
                self._serve(request, token)
        return True

    def _take(self) -> tuple[Request, str] | Literal["dead"] | None:
        """Transaction 2a: lease the oldest due request (short; the handler is not in it),
        in one statement that need not reach the disk by itself (``Store.statement(
        durable=False)``, as a job's lease): a lease lost with the database server's crash
        is one that ran out, the request is due again and the late answer is refused; the
        answer's durable commit makes the lease before it durable too. When it leased
        nothing because a due request is dead (taken ``max_attempts`` times, which the same
        statement tells), ``_take_or_bury`` (a durable transaction) only then: a server
        that lost the race for the last request, or polls an empty queue, makes one round
        trip, not a transaction of three."""
        store = self.db.store
        token = uuid7()
        now = store.clock.now()
        with store.statement(durable=False) as tx:
            leased = sq.lease_due_request(
                tx,
                self.queues,
                now=now,
                token=token,
                until=now + self.lease,
                server=self.name,
                max_attempts=self.max_attempts,
            )
        if leased is None:
            return None
        if leased == "dead":
            return self._take_or_bury()
        failpoint("sessions.server_after_take")
        rid, queue, body = leased
        return Request(rid, queue, decode(body)), token

    def _take_or_bury(self) -> tuple[Request, str] | Literal["dead"] | None:
        """The oldest due request in a durable transaction: a request taken
        ``max_attempts`` times already gets its dead reply here; a live one (it came due
        since the statement of ``_take`` looked) is leased as there."""
        store = self.db.store
        with store.transaction() as tx:
            now = store.clock.now()
            row = sq.next_due_request(tx, self.queues, now=now)
            if row is None:
                return None
            rid = str(row["id"])
            if int(row["attempts"]) >= self.max_attempts:
                last = row["last_error"] or "the server died or hung (its lease ran out)"
                sq.enqueue_reply(
                    tx,
                    rid,
                    reply=None,
                    error=f"dead: taken {row['attempts']} times (max_attempts "
                    f"{self.max_attempts}) without an answer; last: {last}",
                    now=now,
                    server=self.name,
                    token=None,
                )
                return "dead"
            token = uuid7()
            sq.lease_request(tx, rid, token=token, until=now + self.lease, server=self.name)
        failpoint("sessions.server_after_take")
        return Request(rid, str(row["queue"]), decode(row["body"])), token

    def _serve(self, request: Request, token: str) -> None:
        """Transaction 2b: run the handler and move the request to the reply queue, both in
        one transaction that commits only while this server still holds the lease."""
        for attempt in range(_DEFERRED_TRIES + 1):
            # one writer at a time (SQLite): write lock only from the handler's first write
            deferred = not self.db.store.capabilities.concurrent_writers
            deferred = deferred and attempt < _DEFERRED_TRIES
            try:
                self._answer(request, token, deferred=deferred)
                return
            except _WriteConflict:
                continue
            except _LeaseLost:
                return  # another server has it now; our writes were rolled back
            except _HandlerFailed as failed:
                self._record_failure(request, token, failed.exc)
                return

    def _answer(self, request: Request, token: str, *, deferred: bool) -> None:
        """The handler and the reply in one transaction. On PostgreSQL it is pipelined:
        the BEGIN waits to travel with the first statement (the handler's, or the reply's
        UPDATE when the handler runs none) and the reply's announcement with the COMMIT,
        two round trips between the take and the client's wake-up where there were four."""
        store = self.db.store
        opened = store.transaction(write=False) if deferred else store.transaction(pipelined=True)
        try:
            with opened as tx:
                txn = self.db.bind(tx)
                try:
                    with tx.handed_over():
                        body = self.handler(request, txn)
                    text = encode_body("reply body", body, self.max_body_bytes)
                except Exception as exc:
                    if deferred and sq.is_write_conflict(exc):
                        raise _WriteConflict() from exc
                    raise _HandlerFailed(exc) from exc
                if not sq.enqueue_reply(
                    txn.tx,
                    request.id,
                    reply=text,
                    error=None,
                    now=store.clock.now(),
                    server=self.name,
                    token=token,
                ):
                    raise _LeaseLost()
                failpoint("sessions.server_before_commit")
        except (_WriteConflict, _LeaseLost, _HandlerFailed):
            raise
        except Exception as exc:
            if deferred and sq.is_write_conflict(exc):
                raise _WriteConflict() from exc
            raise

    def _record_failure(self, request: Request, token: str, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"[:10_000]
        store = self.db.store
        with store.transaction() as tx:
            row = q.get_request(tx, request.id)
            if row is None or row["state"] != "queued" or row["lease_token"] != token:
                return  # another server took it meanwhile (our lease ran out)
            attempts = int(row["attempts"])
            now = store.clock.now()
            if isinstance(exc, PermanentFailure) or attempts >= self.max_attempts:
                why = (
                    "permanent failure"
                    if isinstance(exc, PermanentFailure)
                    else f"gave up after {attempts} attempts"
                )
                sq.release_request(tx, request.id, token, error=message, available_at=now)
                sq.enqueue_reply(
                    tx,
                    request.id,
                    reply=None,
                    error=f"{why}: {message}",
                    now=now,
                    server=self.name,
                    token=None,
                )
            else:
                backoff = Backoff(first=self.retry_in, factor=2, maximum=MAX_BACKOFF_S)
                delay = backoff.wait(attempts - 1)
                sq.release_request(tx, request.id, token, error=message, available_at=now + delay)

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
        wakeup = self.db.store.wakeup(q.REQUEST_CHANNEL, min_poll=0.01, max_poll=idle_wait)
        try:
            while stop is None or not stop.is_set():
                if self.process_one():
                    handled += 1
                    wakeup.reset()
                    continue
                if until_idle:
                    break
                wakeup.wait(idle_wait)
        finally:
            wakeup.close()
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
