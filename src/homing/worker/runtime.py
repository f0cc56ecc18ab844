"""The worker runtime: grab jobs, run their handlers, keep their leases alive, record outcomes.

Threads of one ``Worker``:

- the *fetcher* grabs as many jobs as there are free handler slots (one ``grab_many``
  transaction) and hands them to the runners; when nothing is available it waits for a
  PostgreSQL ``NOTIFY`` (the *waker* thread listens) or, on SQLite, polls with a back-off;
- ``concurrency`` *runner* threads run handlers; ``async def`` handlers run on one event
  loop thread while their runner waits for them and serves their transaction;
- the *heartbeat* extends the lease of every held job whose lease is half gone; a lease
  that cannot be extended because another worker holds the job now marks the job lost:
  its completion is refused (fencing) and an async handler is cancelled;
- the *completer* writes the outcomes of handlers that did not write through
  ``ctx.connection`` (done, retry, failed), several jobs per transaction. A job counts
  as finished only after that commit.

A handler that uses ``ctx.connection`` / ``ctx.transaction`` gets a transaction of its own,
opened on first use, in which the job is completed (or replaced) before the commit: the
handler's writes and the completion are one atomic unit (DESIGN §3.1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from homing._failpoints import failpoint
from homing.database import Database, ShardedDatabase, Transaction, connect
from homing.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidState,
    JobNotFound,
    PermanentFailure,
    StaleLease,
)
from homing.jobs import Job, JobSpec, check_seconds
from homing.worker.app import App, Handler, RetryLater

log = logging.getLogger("homing.worker")

_BATCH = 256
_COUNTERS = {
    "done": "done",
    "replaced": "replaced",
    "retry": "retried",
    "failed": "failed",
    "lease_lost": "lease_lost",
}  # outcomes written per completer transaction, at most


class LeaseLost(StaleLease):
    """The worker lost the job's lease (another worker holds it, or it was released at
    shutdown); the handler's transaction was rolled back and the job was not completed here."""


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_tb(exc.__traceback__, limit=-8)) if exc.__traceback__ else ""
    return text + ("\n" + tb if tb else "")


class JobContext:
    """What a handler gets besides the job: its transaction, replace, and the lease state.

    ``ctx.connection`` / ``ctx.transaction`` open (on first use) the transaction in which the
    job will be completed: writes made through it commit atomically with the completion, or
    not at all. On SQLite that transaction holds the database's single write lock until the
    handler returns, so do slow work (network calls) *before* the first use.
    """

    def __init__(self, worker: Worker, job: Job, handler: Handler) -> None:
        self.job = job
        self.handler = handler
        self.attempt = job.attempts
        self.worker_id = worker.worker_id
        self.phase = "queued"  # queued | running | completing | done
        self.started = 0.0
        self._worker = worker
        self._stack: ExitStack | None = None
        self._tx: Transaction | None = None
        self._children: list[JobSpec | tuple[str, Any]] | None = None
        self._on_complete: list[Callable[[Transaction], Any]] = []
        self._lost = threading.Event()
        self._lost_reason = ""
        self._runner_ident: int | None = None
        self._requests: queue.SimpleQueue[Any] | None = None
        self._task: asyncio.Task[Any] | None = None

    # -- the lease -------------------------------------------------------------------------
    @property
    def lease_lost(self) -> bool:
        """True once this worker no longer holds the job; the handler should stop early."""
        return self._lost.is_set()

    def _mark_lost(self, reason: str) -> None:
        if self._lost.is_set():
            return
        self._lost_reason = reason
        self._lost.set()
        task, loop = self._task, self._worker._loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    # -- the transaction -------------------------------------------------------------------
    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgres"``: which SQL ``ctx.connection`` speaks."""
        return self._worker.dialect

    @property
    def transaction(self) -> Transaction:
        """The transaction the job will be completed in (opened now if not yet open)."""
        if self._tx is not None:
            return self._tx
        if threading.get_ident() == self._runner_ident:
            return self._open()
        if self._requests is None:
            raise InvalidState(
                "ctx.transaction / ctx.connection must be used in the handler's own thread "
                "(or in its coroutine); pass the connection to helper threads instead"
            )
        raise InvalidState(
            "an async handler must open its transaction with `await ctx.atransaction()` (or "
            "`await ctx.aconnection()`) first; blocking the event loop while the transaction "
            "opens could deadlock with another handler's transaction. After that, "
            "ctx.connection returns it"
        )

    @property
    def connection(self) -> Any:
        """The DB-API connection of ``ctx.transaction`` (sqlite3 or psycopg)."""
        return self.transaction.connection

    async def atransaction(self) -> Transaction:
        """Open ``ctx.transaction`` from an async handler without blocking the event loop
        (on SQLite it may wait for the write lock). Statements on the connection still
        block the loop while they run; keep them short."""
        if self._tx is not None:
            return self._tx
        if self._requests is None:
            return self.transaction
        return await asyncio.wrap_future(self._via_runner())

    async def aconnection(self) -> Any:
        """``ctx.connection`` for async handlers; see ``atransaction``."""
        return (await self.atransaction()).connection

    def _via_runner(self) -> concurrent.futures.Future[Transaction]:
        fut: concurrent.futures.Future[Transaction] = concurrent.futures.Future()
        assert self._requests is not None
        self._requests.put((self._open, fut))
        return fut

    def _open(self) -> Transaction:
        if self._tx is not None:
            return self._tx
        if self._lost.is_set():
            raise LeaseLost(f"job {self.job.handle}: {self._lost_reason}")
        stack = ExitStack()
        self._tx = stack.enter_context(self._worker._transaction_for(self.job))
        self._stack = stack
        return self._tx

    def _close(self, exc: BaseException | None) -> None:
        """Commit (``exc`` None) or roll back the handler's transaction, if one is open."""
        stack, self._stack, self._tx = self._stack, None, None
        if stack is None:
            return
        if exc is None:
            stack.close()
        else:
            stack.__exit__(type(exc), exc, exc.__traceback__)

    def on_complete(self, write: Callable[[Transaction], Any]) -> None:
        """Run ``write(tx)`` in the transaction that records this job's completion.

        Its writes commit if and only if the job is completed: not if the handler fails
        afterwards, not if the lease was lost meanwhile. Unlike ``ctx.transaction``, which
        commits each job on its own and (on SQLite) holds the write lock while the handler
        runs, these writes are batched with other jobs' completions in one commit: the
        transactional outbox at the disk's group-commit rate (for example
        ``ctx.on_complete(lambda tx: sender.enqueue("send", url, body, tx=tx))``). Keep
        ``write`` short and free of network calls; if it raises, the job is retried (or
        failed) by its retry policy and nothing it wrote is kept."""
        if not callable(write):
            raise InvalidArgument(f"on_complete takes a callable write(tx), got {write!r}")
        self._on_complete.append(write)

    def _run_on_complete(self, tx: Transaction) -> None:
        for write in self._on_complete:
            write(tx)

    # -- fan-out ---------------------------------------------------------------------------
    def replace(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> None:
        """Replace this job with ``jobs`` when the handler returns: the job is marked done
        and the new jobs are inserted in the same transaction (all or nothing). An empty
        list completes the job with no children."""
        if self._children is not None:
            raise InvalidState(f"job {self.job.handle} was already replaced; call replace once")
        children = list(jobs)
        self._children = children


class _OnCompleteFailed(Exception):
    """An ``on_complete`` write raised inside a batch: the batch is written job by job."""


@dataclass
class _Outcome:
    ctx: JobContext
    action: str  # complete | temp_fail | perm_fail
    message: str = ""
    retry_in: float = 0.0
    label: str = "done"
    error: str | None = None
    result: BaseException | None = field(default=None)


def _record(tx: Transaction, o: _Outcome) -> None:
    """Write one outcome (complete, temp_fail or perm_fail) of a job in ``tx``."""
    if o.action == "complete":
        tx.complete(o.ctx.job)
    elif o.action == "temp_fail":
        tx.temp_fail(o.ctx.job, o.message, retry_in=o.retry_in)
    else:
        tx.perm_fail(o.ctx.job, o.message)


@dataclass
class WorkerStats:
    """Counts of job outcomes since the worker started."""

    grabbed: int = 0
    done: int = 0
    replaced: int = 0
    retried: int = 0
    failed: int = 0
    lease_lost: int = 0
    released: int = 0
    errors: int = 0


class Worker:
    """Runs an ``App``'s handlers over one store; see the module docstring for the threads.

    Options: ``lock_for`` (lease seconds; default the app's), ``heartbeat`` (seconds between
    lease checks; default ``lock_for / 4``; 0 disables it, for tests of fencing),
    ``grace`` (seconds running handlers get to finish on SIGTERM), ``min_poll`` and
    ``max_poll`` (SQLite's idle polling back-off), ``idle_wait`` (PostgreSQL: longest wait
    for a NOTIFY before polling anyway; catches jobs whose ``run_at`` came due),
    ``until_idle`` (stop once nothing is available and nothing runs), ``prefetch`` (jobs
    grabbed beyond the free handler slots, default ``max(4, concurrency)``: fewer, larger
    grabs; they wait leased in memory, covered by the heartbeat; use 0 for long jobs, so
    that an idle worker elsewhere takes them instead), ``name``.
    """

    def __init__(
        self,
        app: App,
        *,
        db: str | Database | ShardedDatabase | None = None,
        concurrency: int = 4,
        types: Sequence[str] | None = None,
        lock_for: float | None = None,
        heartbeat: float | None = None,
        grace: float = 30.0,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        idle_wait: float = 0.5,
        until_idle: bool = False,
        prefetch: int | None = None,
        name: str = "worker",
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency must be a positive integer, got {concurrency!r}")
        self.app = app
        self.concurrency = concurrency
        self.types = sorted(set(types)) if types else app.types
        if not self.types:
            raise ConfigurationError(
                "the app has no handlers; register some with @app.job('type') before running"
            )
        for t in self.types:
            app.handler(t)  # raises for a type without a handler
        self.lock_for = check_seconds(
            "lock_for", app.lock_for if lock_for is None else lock_for, allow_zero=False
        )
        self.heartbeat = (
            max(0.02, self.lock_for / 4)
            if heartbeat is None
            else check_seconds("heartbeat", heartbeat, allow_zero=True)
        )
        self.grace = check_seconds("grace", grace, allow_zero=True)
        self.min_poll = check_seconds("min_poll", min_poll, allow_zero=False)
        self.max_poll = max(self.min_poll, check_seconds("max_poll", max_poll, allow_zero=False))
        self.idle_wait = check_seconds("idle_wait", idle_wait, allow_zero=False)
        self.until_idle = until_idle
        if prefetch is None:
            prefetch = max(4, concurrency)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise InvalidArgument(f"prefetch must be an integer >= 0, got {prefetch!r}")
        self.prefetch = prefetch
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}"
        self.stats = WorkerStats()

        source = db if db is not None else app.db
        if source is None:
            raise ConfigurationError(
                "no store for the worker: give App(url), Worker(db=...) or homing --db URL"
            )
        self._own_db = isinstance(source, str)
        if isinstance(source, str):
            urls = [u for u in source.split(",") if u] if "," in source else source
            self.db: Database | ShardedDatabase = connect(urls, pool_size=concurrency + 6)
        else:
            self.db = source
        self.dialect = self.db.dialect

        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)
        self._inflight = 0  # jobs held: grabbed and not yet finished (committed)
        self._active = 0  # of those, jobs waiting for or in a handler
        self._held: dict[str, JobContext] = {}
        self._ready: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[_Outcome | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0
        self._started = False
        self._running = False
        self._shutdown_lock = threading.Lock()

    # -- store helpers -----------------------------------------------------------------------
    def _transaction_for(self, job: Job) -> AbstractContextManager[Transaction]:
        if isinstance(self.db, ShardedDatabase):
            return self.db.transaction(int(job.handle.split(":", 1)[0]))
        return self.db.transaction()

    def _shard_of(self, job: Job) -> int:
        return int(job.handle.split(":", 1)[0]) if isinstance(self.db, ShardedDatabase) else 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Worker:
        """Start the worker's threads and return at once (``run`` blocks instead)."""
        if self._started:
            raise InvalidState("this worker was already started; make a new one")
        self._started = True
        if any(self.app.handler(t).is_async for t in self.types):
            self._loop = asyncio.new_event_loop()
            self._spawn("loop", self._run_loop)
        for i in range(self.concurrency):
            self._spawn(f"runner-{i}", self._runner)
        self._spawn("completer", self._completer)
        if self.heartbeat > 0:
            self._spawn("heartbeat", self._heartbeater)
        if self.dialect == "postgres":
            self._spawn("waker", self._waker)
        self._spawn("fetcher", self._fetcher)
        log.info(
            "worker %s started: types=%s concurrency=%d lock_for=%gs on %s",
            self.worker_id,
            ",".join(self.types),
            self.concurrency,
            self.lock_for,
            self.dialect,
            extra={"homing": {"event": "worker_started", "worker": self.worker_id}},
        )
        return self

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"homing-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, *, grace: float | None = None) -> None:
        """Stop grabbing; let running handlers finish within ``grace`` seconds (default the
        worker's); release the leases of those that do not, so other workers take them at
        once; then stop the threads. Safe to call from any thread, more than once."""
        if grace is not None:
            self.grace = check_seconds("grace", grace, allow_zero=True)
        self._stopping.set()
        self._wake.set()
        with self._slots:
            self._slots.notify_all()
        if threading.current_thread() in self._threads:
            return  # called from a handler: the thread in run() finishes the shutdown
        if self._running:
            self._stopped.wait(self.grace + 70.0)  # run() is shutting down
            return
        self._shutdown()

    def run(self, *, ready: Callable[[], None] | None = None) -> None:
        """Run until SIGTERM / SIGINT (in the main thread), ``stop()``, or idle with
        ``until_idle``. A second signal cuts the grace period to zero. ``ready()`` is
        called once the signal handlers are in place and the threads run."""
        installed: list[tuple[signal.Signals, Any]] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                installed.append((sig, signal.signal(sig, self._on_signal)))
        self._running = True
        try:
            if not self._started:
                self.start()
            if ready is not None:
                ready()
            while not self._stopping.wait(0.2):
                pass
            self._shutdown()
        finally:
            self._running = False
            for sig, previous in installed:
                signal.signal(sig, previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        # No locks here: the handler runs between two bytecodes of the main thread, which
        # may hold them. The shutdown loop re-reads ``grace`` every 0.1 s.
        if self._signals > 1:
            self.grace = 0.0
            log.warning("second signal: releasing running jobs now")
        else:
            log.info(
                "signal %d: no more grabs; running handlers have %gs to finish",
                signum,
                self.grace,
            )
        self._stopping.set()
        self._wake.set()

    def _shutdown(self) -> None:
        with self._shutdown_lock:
            if not self._stopped.is_set():
                self._shutdown_now()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the worker has stopped (e.g. ``until_idle``); True if it has."""
        return self._stopped.wait(timeout)

    def _shutdown_now(self) -> None:
        began = time.monotonic()
        # No grab may land after the leases are given back: let the fetcher finish first.
        for thread in self._threads:
            if thread.name == "homing-fetcher" and thread is not threading.current_thread():
                thread.join(timeout=60.0)
        with self._slots:
            while self._inflight > 0 and time.monotonic() < began + self.grace:
                self._slots.wait(min(0.1, max(0.0, began + self.grace - time.monotonic())))
        # Outcomes already handed to the completer are written first (a few ms) ...
        flush_until = time.monotonic() + 5.0
        with self._slots:
            while any(c.phase == "completing" for c in self._held.values()):
                if time.monotonic() > flush_until:
                    break
                self._slots.wait(0.05)
            remaining = [c for c in self._held.values() if c.phase in ("queued", "running")]
        # ... then the leases of handlers still running are given back.
        for ctx in remaining:
            ctx._mark_lost("released: the worker shut down before the handler finished")
            try:
                self.db.release(
                    ctx.job,
                    f"worker {self.worker_id} shut down; the handler did not finish within "
                    f"the grace period of {self.grace:g}s",
                )
                with self._slots:
                    self.stats.released += 1
                _log_job(ctx, "released", 0.0)
            except (StaleLease, InvalidState, JobNotFound):
                pass  # finished or taken over meanwhile: nothing to give back
            except Exception as exc:  # the lease will expire instead
                log.warning("could not release job %s: %s", ctx.job.handle, exc)
        self._stopped.set()
        self._wake.set()
        for _ in range(self.concurrency):
            self._ready.put(None)
        self._outcomes.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            if thread is threading.current_thread() or thread.name == "homing-waker":
                continue  # the waker sleeps in LISTEN for up to a second; it is a daemon
            if thread.name.startswith("homing-runner") and remaining:
                continue  # stuck in a handler; daemon threads die with the process
            thread.join(timeout=2.0)
        log.info(
            "worker %s stopped: %s",
            self.worker_id,
            self.stats,
            extra={"homing": {"event": "worker_stopped", "worker": self.worker_id}},
        )
        if self._own_db:
            self.db.close()

    # -- fetching ----------------------------------------------------------------------------
    def _fetcher(self) -> None:
        backoff = self.min_poll
        errors = 0
        while not self._stopping.is_set():
            # Grab when a handler slot is free and nothing waits to run; take enough for
            # the free slots plus ``prefetch`` more, so one grab serves several handlers.
            low_water = self.concurrency if self.prefetch else self.concurrency - 1
            # Outcomes waiting for the completer do not hold a slot, so grabbing overlaps
            # with writing them; ``max_pending`` bounds that backlog.
            capacity = self.concurrency + self.prefetch
            with self._slots:
                while (
                    self._active > low_water or self._inflight - self._active > 4 * capacity
                ) and not self._stopping.is_set():
                    self._slots.wait(1.0)
                free = capacity - self._active
            if self._stopping.is_set():
                break
            self._wake.clear()
            try:
                jobs = self.db.grab_many(
                    self.types, lock_for=self.lock_for, limit=free, worker_id=self.worker_id
                )
                errors = 0
            except Exception as exc:  # the store is down: wait and retry
                errors += 1
                log.warning("grab failed (%s); retrying", exc)
                self._stopping.wait(min(5.0, 0.1 * 2**errors))
                continue
            if jobs:
                contexts = [JobContext(self, j, self.app.handler(j.type)) for j in jobs]
                with self._slots:
                    self._inflight += len(jobs)
                    self._active += len(jobs)
                    for ctx in contexts:
                        self._held[ctx.job.id] = ctx
                    self.stats.grabbed += len(jobs)
                failpoint("worker.after_grab")
                for ctx in contexts:
                    self._ready.put(ctx)
                backoff = self.min_poll
                continue
            if self.until_idle:
                with self._slots:
                    idle = self._inflight == 0
                if idle:
                    self._stopping.set()
                    if not self._running:  # started with start(): nobody else shuts down
                        threading.Thread(target=self._shutdown, daemon=True).start()
                    break
            if self.dialect == "postgres":
                self._wake.wait(self.idle_wait)
            else:
                self._stopping.wait(backoff)
                backoff = min(self.max_poll, backoff * 2)

    def _waker(self) -> None:
        """PostgreSQL: turn NOTIFYs sent by inserts into a wake-up of the fetcher."""
        while not self._stopped.is_set():
            try:
                if self.db.wait_for_jobs(1.0):
                    self._wake.set()
            except Exception as exc:  # fall back to polling
                log.warning("LISTEN failed (%s); polling instead", exc)
                self._stopped.wait(1.0)

    # -- running handlers --------------------------------------------------------------------
    def _run_loop(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _runner(self) -> None:
        while True:
            ctx = self._ready.get()
            if ctx is None:
                return
            if ctx.phase != "queued":
                continue
            if ctx.lease_lost:  # lost (or released at shutdown) before it started
                self._done(ctx, "lease_lost", error=ctx._lost_reason)
                continue
            try:
                self._execute(ctx)
            except BaseException as exc:  # a runner must not die
                log.exception("internal error running job %s", ctx.job.handle)
                self._done(ctx, "error", error=_describe(exc))

    def _execute(self, ctx: JobContext) -> None:
        job, handler = ctx.job, ctx.handler
        ctx.phase = "running"
        ctx.started = time.monotonic()
        ctx._runner_ident = threading.get_ident()
        policy = handler.retry
        if policy.max_attempts is not None and job.attempts > policy.max_attempts:
            self._submit(
                _Outcome(
                    ctx,
                    "perm_fail",
                    message=(
                        f"attempt {job.attempts} is over max_attempts={policy.max_attempts}: "
                        "earlier attempts never finished (did the worker crash or get killed? "
                        "see the lease_expired entries)"
                    ),
                    label="failed",
                )
            )
            return
        error: BaseException | None = None
        try:
            if handler.is_async:
                self._run_async(ctx)
            else:
                handler.fn(job, ctx)
        except BaseException as exc:  # every handler failure is recorded
            error = exc
        if error is None and ctx.lease_lost:
            error = LeaseLost(f"job {job.handle}: {ctx._lost_reason}")
        if error is None:
            error = self._commit(ctx)
            if error is None:
                return
        else:
            self._rollback(ctx, error)
        if ctx.lease_lost or isinstance(error, StaleLease):
            self._done(ctx, "lease_lost", error=str(error))
            return
        self._submit(self._failure(ctx, error))

    def _run_async(self, ctx: JobContext) -> None:
        """Run an async handler on the loop; serve its transaction requests meanwhile."""
        assert self._loop is not None
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        ctx._requests = requests

        async def main() -> Any:
            ctx._task = asyncio.current_task()
            if ctx.lease_lost:
                raise LeaseLost(f"job {ctx.job.handle}: {ctx._lost_reason}")
            return await ctx.handler.fn(ctx.job, ctx)

        fut = asyncio.run_coroutine_threadsafe(main(), self._loop)
        fut.add_done_callback(lambda _f: requests.put(None))
        while True:
            item = requests.get()
            if item is None:
                break
            fn, reply = item
            if reply.set_running_or_notify_cancel():
                try:
                    reply.set_result(fn())
                except BaseException as exc:  # handed to the coroutine
                    reply.set_exception(exc)
        ctx._task = None
        fut.result()

    def _commit(self, ctx: JobContext) -> BaseException | None:
        """Complete (or replace) a handler's job; None on success, else the error."""
        job = ctx.job
        if ctx._tx is None and ctx._children is None:
            failpoint("worker.after_effect_before_complete")
            self._submit(_Outcome(ctx, "complete"))
            return None
        try:
            tx = ctx._open()
            failpoint("worker.after_effect_before_complete")
            if ctx._children is not None:
                tx.replace(job, ctx._children)
                failpoint("worker.in_replace")
            else:
                tx.complete(job)
            ctx._run_on_complete(tx)
        except BaseException as exc:  # rolled back, then recorded
            self._rollback(ctx, exc)
            return exc
        try:
            ctx._close(None)
        except BaseException as exc:  # the commit failed
            return exc
        if ctx._children is not None:
            self._done(ctx, "replaced", children=len(ctx._children))
        else:
            self._done(ctx, "done")
        return None

    def _rollback(self, ctx: JobContext, exc: BaseException) -> None:
        try:
            ctx._close(exc)
        except BaseException as rb:  # the connection is gone: same effect
            log.warning("rollback of job %s failed: %s", ctx.job.handle, rb)

    def _failure(self, ctx: JobContext, error: BaseException) -> _Outcome:
        text = _describe(error)
        if isinstance(error, PermanentFailure):
            return _Outcome(ctx, "perm_fail", message=text, label="failed", error=text)
        policy = ctx.handler.retry
        job = ctx.job
        delay = error.delay if isinstance(error, RetryLater) else policy.delay(job.attempts)
        age = max(0.0, self.db_clock_now() - job.created_at)
        reason = policy.gives_up(job.attempts, age, delay)
        if reason is not None:
            return _Outcome(
                ctx,
                "perm_fail",
                message=f"{reason}; last error: {text}",
                label="failed",
                error=text,
            )
        return _Outcome(ctx, "temp_fail", message=text, retry_in=delay, label="retry", error=text)

    def db_clock_now(self) -> float:
        if isinstance(self.db, ShardedDatabase):
            return self.db.shards[0].clock.now()
        return self.db.clock.now()

    # -- recording outcomes ------------------------------------------------------------------
    def _submit(self, outcome: _Outcome) -> None:
        with self._slots:
            if outcome.ctx.phase != "completing":
                outcome.ctx.phase = "completing"
                self._active -= 1
                self._slots.notify_all()
        self._outcomes.put(outcome)

    def _completer(self) -> None:
        while True:
            first = self._outcomes.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < _BATCH:
                try:
                    item = self._outcomes.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            by_shard: dict[int, list[_Outcome]] = {}
            for outcome in batch:
                by_shard.setdefault(self._shard_of(outcome.ctx.job), []).append(outcome)
            for items in by_shard.values():
                self._write(items)
            if stop:
                return

    def _write(self, items: list[_Outcome]) -> None:
        """Write a batch of outcomes in one transaction. Completions go in one statement
        per lease (``complete_many``, all or none); if one of them is refused (a lost
        lease), the transaction is rolled back and the batch written job by job, so the
        others still count."""
        items.sort(key=lambda o: o.ctx.job.id)  # one lock order: no deadlocks on PostgreSQL
        try:
            try:
                self._write_batch(items, bulk=True)
            except (StaleLease, InvalidState, JobNotFound, _OnCompleteFailed):
                if any(o.ctx._on_complete for o in items):
                    items[:] = [self._write_alone(o) for o in items]
                else:
                    self._write_batch(items, bulk=False)
        except Exception as exc:  # nothing was written; leases will expire
            for o in items:
                self._done(
                    o.ctx,
                    "error",
                    error=f"could not record the outcome ({o.label}): {exc}; the job runs "
                    "again when its lease expires",
                )
            return
        for o in items:
            if o.result is not None:
                self._done(o.ctx, "lease_lost", error=str(o.result))
            else:
                self._done(o.ctx, o.label, error=o.error, retry_in=o.retry_in)

    def _write_batch(self, items: list[_Outcome], *, bulk: bool) -> None:
        for o in items:
            o.result = None
        with self._transaction_for(items[0].ctx.job) as tx:
            completions = [o.ctx.job for o in items if o.action == "complete"]
            if bulk and completions:
                tx.complete_many(completions)
                for o in items:
                    if o.action == "complete" and o.ctx._on_complete:
                        try:
                            o.ctx._run_on_complete(tx)
                        except Exception as exc:  # roll back; written one by one instead
                            raise _OnCompleteFailed(str(exc)) from exc
            for o in items:
                if bulk and o.action == "complete":
                    continue
                try:
                    _record(tx, o)
                except (StaleLease, InvalidState, JobNotFound) as exc:
                    o.result = exc

    def _write_alone(self, o: _Outcome) -> _Outcome:
        """One outcome in its own transaction (the fallback when a batch was refused). A
        completion whose ``on_complete`` writes raise becomes that job's failure."""
        o.result = None
        try:
            with self._transaction_for(o.ctx.job) as tx:
                _record(tx, o)
                if o.action == "complete":
                    o.ctx._run_on_complete(tx)
            return o
        except (StaleLease, InvalidState, JobNotFound) as exc:
            o.result = exc
            return o
        except Exception as exc:
            if o.action != "complete":
                raise
            failure = self._failure(o.ctx, exc)
            try:
                with self._transaction_for(o.ctx.job) as tx:
                    _record(tx, failure)
            except (StaleLease, InvalidState, JobNotFound) as lost:
                failure.result = lost
            return failure

    def _done(self, ctx: JobContext, outcome: str, **extra: Any) -> None:
        with self._slots:
            if ctx.phase == "done":
                return
            if ctx.phase != "completing":
                self._active -= 1
            ctx.phase = "done"
            name = _COUNTERS.get(outcome, "errors")
            setattr(self.stats, name, getattr(self.stats, name) + 1)
            self._held.pop(ctx.job.id, None)
            self._inflight -= 1
            self._slots.notify_all()
        duration = time.monotonic() - ctx.started if ctx.started else 0.0
        _log_job(ctx, outcome, duration, **extra)

    # -- heartbeat ---------------------------------------------------------------------------
    def _heartbeater(self) -> None:
        while not self._stopped.wait(self.heartbeat):
            now = self.db_clock_now()
            with self._slots:
                contexts = list(self._held.values())
            for ctx in contexts:
                if ctx.phase == "done" or ctx.lease_lost:
                    continue
                if ctx.job.lease_expires_at - now > self.lock_for / 2:
                    continue
                try:
                    self.db.extend(ctx.job, self.lock_for)
                except (StaleLease, JobNotFound) as exc:
                    ctx._mark_lost(f"lease lost: {exc}")
                    log.warning(
                        "job %s: lease lost; its completion will be refused", ctx.job.handle
                    )
                except InvalidState:
                    pass  # finished meanwhile
                except Exception as exc:  # try again next beat
                    log.warning("heartbeat for job %s failed: %s", ctx.job.handle, exc)


def _log_job(ctx: JobContext, outcome: str, duration: float, **extra: Any) -> None:
    job = ctx.job
    fields = {
        "event": "job",
        "type": job.type,
        "handle": job.handle,
        "attempt": job.attempts,
        "duration_ms": round(duration * 1000, 3),
        "outcome": outcome,
        **{k: v for k, v in extra.items() if v not in (None, 0, 0.0, "")},
    }
    level = logging.INFO if outcome in ("done", "replaced") else logging.WARNING
    if outcome == "error":
        level = logging.ERROR
    if log.isEnabledFor(level):
        summary = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("event", "error"))
        err = fields.get("error")
        if err:
            summary += " error=" + str(err).splitlines()[0]
        log.log(level, "job %s", summary, extra={"homing": fields})
