"""The worker runtime: grab jobs, run their handlers, keep their leases alive, record outcomes.

Threads of one ``Worker``, each in a module of its own:

- the *fetcher* (``fetcher.py``) grabs as many jobs as there are free handler slots (one ``grab_many``
  transaction) and hands them to the runners; when nothing is available it waits for a
  PostgreSQL ``NOTIFY`` (the *waker* thread listens) or, on SQLite, polls with a back-off;
- ``concurrency`` *runner* threads (``runner.py``) run handlers; ``async def`` handlers run on one event
  loop thread while their runner waits for them and serves their transaction;
- the *heartbeat* (``heartbeat.py``) extends the lease of every held job whose lease is half gone; a lease
  that cannot be extended because another worker holds the job now marks the job lost:
  its completion is refused (fencing) and an async handler is cancelled;
- the *completer* (``completer.py``) writes the outcomes of handlers that did not write through
  ``ctx.connection`` (done, retry, failed), several jobs per transaction. A job counts
  as finished only after that commit.

A handler that uses ``ctx.connection`` / ``ctx.transaction`` gets a transaction of its own,
opened on first use, in which the job is completed (or replaced) before the commit: the
handler's writes and the completion are one atomic unit (DESIGN §3.1).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from homing.averages import rise_fast_fall_slow
from homing.database import Database, ShardedDatabase, Transaction, connect
from homing.errors import ConfigurationError, InvalidArgument, InvalidState, JobNotFound, StaleLease
from homing.jobs import Job, check_seconds
from homing.worker import (
    completer,
    fetcher,
    heartbeat,
    housekeeper,
    joined_grab,
    runner,
    takeover,
    watcher,
)
from homing.worker.context import JobContext
from homing.worker.handler import Handlers
from homing.worker.joined_grab import GrabRequest
from homing.worker.outcome import Outcome
from homing.worker.scheduler import Scheduler

log = logging.getLogger("homing.worker")

_COUNTERS = {
    "done": "done",
    "replaced": "replaced",
    "retry": "retried",
    "failed": "failed",
    "lease_lost": "lease_lost",
    "cancelled": "cancelled",
    "timed_out": "timed_out",
}


@dataclass
class WorkerStats:
    """Counts of job outcomes since the worker started."""

    grabbed: int = 0
    grabs: int = 0  # grab statements made
    empty_grabs: int = 0  # of those, the ones that found nothing
    done: int = 0
    replaced: int = 0
    retried: int = 0
    failed: int = 0
    lease_lost: int = 0
    cancelled: int = 0  # the job was cancelled while this worker held it
    timed_out: int = 0  # the attempt ran past its timeout (failed, retryable)
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
    grabbed beyond the free handler slots; by default at least ``max(4, concurrency)``
    and, when handlers are short, as many as the runners get through in about 20 ms (at
    most 16 per handler slot): fewer, larger grabs and commits; they wait leased in memory,
    covered by the heartbeat; a number fixes it; use 0 for long jobs, so that an idle
    worker elsewhere takes them instead), ``gc_every`` (seconds between
    ``homing gc`` passes run by this worker, default an hour, 0 to leave it to a cron
    job), ``vacuum_every`` (PostgreSQL without autovacuum only: seconds between this
    worker's VACUUMs of homing's tables that hold dead rows, shared with the other workers
    through the server's statistics; default 60, 0 never), ``gather`` (seconds an idle worker woken by an insert waits before it grabs, so
    that one grab and one completion commit cover the jobs of the next moments; default
    5 ms; 0 grabs at once), ``watch_every`` (seconds between looks for cancelled jobs among
    those held, default 0.5), ``schedules`` (run the app's periodic schedules, default
    True), ``name``.
    """

    def __init__(
        self,
        app: Handlers,
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
        gc_every: float = 3600.0,
        vacuum_every: float = 60.0,
        gather: float = 0.005,
        watch_every: float = 0.5,
        schedules: bool = True,
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
        self.gc_every = check_seconds("gc_every", gc_every, allow_zero=True)
        self.vacuum_every = check_seconds("vacuum_every", vacuum_every, allow_zero=True)
        self.gather = check_seconds("gather", gather, allow_zero=True)
        self.watch_every = check_seconds("watch_every", watch_every, allow_zero=False)
        self.schedules = list(getattr(app, "schedules", [])) if schedules else []
        # prefetch=None: at least max(4, concurrency), more for short handlers (fetcher.py)
        self.adaptive_prefetch = prefetch is None
        if prefetch is None:
            prefetch = max(4, concurrency)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise InvalidArgument(f"prefetch must be an integer >= 0, got {prefetch!r}")
        self.prefetch = prefetch
        self.handler_seconds: float | None = None  # moving average of handlers' run time
        self.name = name
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}"
        self.stats = WorkerStats()
        # Called as fn(job, outcome, seconds) once per finished job (e.g. homing.metrics).
        self.observers: list[Callable[[Job, str, float], None]] = []

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
        self.joins_grabs = joined_grab.joins(self)  # grabs ride on completion commits

        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)
        self._inflight = 0  # jobs held: grabbed and not yet finished (committed)
        self._active = 0  # of those, jobs waiting for or in a handler
        self._held: dict[str, JobContext] = {}
        self._ready: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[Outcome | GrabRequest | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0
        self._started = False
        self._running = False
        self._shutdown_lock = threading.Lock()

    # -- store helpers -----------------------------------------------------------------------
    def transaction_for(self, job: Job) -> AbstractContextManager[Transaction]:
        if isinstance(self.db, ShardedDatabase):
            return self.db.transaction(int(job.handle.split(":", 1)[0]))
        return self.db.transaction()

    def shard_of(self, job: Job) -> int:
        return int(job.handle.split(":", 1)[0]) if isinstance(self.db, ShardedDatabase) else 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Worker:
        """Start the worker's threads and return at once (``run`` blocks instead)."""
        if self._started:
            raise InvalidState("this worker was already started; make a new one")
        self._started = True
        if any(self.app.handler(t).is_async for t in self.types):
            self._loop = asyncio.new_event_loop()
            self._spawn("loop", lambda: runner.run_event_loop(self))
        self.wakeup = self.db.idle_wakeup(
            min_poll=self.min_poll, max_poll=self.max_poll, idle_wait=self.idle_wait
        )
        takeover.take_back(self)  # before the fetcher: its first grab may take them
        for i in range(self.concurrency):
            self._spawn(f"runner-{i}", lambda: runner.run_jobs(self))
        self._spawn("completer", lambda: completer.complete_outcomes(self))
        if self.heartbeat > 0:
            self._spawn("heartbeat", lambda: heartbeat.keep_leases(self))
        self._spawn("fetcher", lambda: fetcher.fetch_jobs(self))
        if (self.gc_every > 0 or self.vacuum_every > 0) and not self.until_idle:
            self._spawn("housekeeper", lambda: housekeeper.keep_tidy(self))
        self._spawn("watcher", lambda: watcher.watch_cancels(self))
        if self.schedules and not self.until_idle:
            ticker = Scheduler(self.db, self.schedules)
            self._spawn("scheduler", lambda: ticker.run(self._stopping))
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

    def completer_alive(self) -> bool:
        return any(t.name == "homing-completer" and t.is_alive() for t in self._threads)

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
        self._interrupt_wait()
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
        self._interrupt_wait()

    def _interrupt_wait(self) -> None:
        wakeup = getattr(self, "wakeup", None)
        if wakeup is not None:
            wakeup.interrupt()

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
        channel = getattr(getattr(self, "wakeup", None), "channel", None)
        if channel is not None:  # no insert should wake this worker any more
            try:
                self.db.forget_idle(channel)
            except Exception as exc:  # the registration ages out (homing gc)
                log.warning("could not unregister idle channel %s: %s", channel, exc)
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
                log_job(ctx, "released", 0.0)
            except (StaleLease, InvalidState, JobNotFound):
                pass  # finished or taken over meanwhile: nothing to give back
            except Exception as exc:  # the lease will expire instead
                log.warning("could not release job %s: %s", ctx.job.handle, exc)
        self._stopped.set()
        self._interrupt_wait()
        for _ in range(self.concurrency):
            self._ready.put(None)
        self._outcomes.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            if thread is threading.current_thread():
                continue
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

    def db_clock_now(self) -> float:
        if isinstance(self.db, ShardedDatabase):
            return self.db.shards[0].clock.now()
        return self.db.clock.now()

    # -- recording outcomes ------------------------------------------------------------------

    def submit(self, outcome: Outcome) -> None:
        ran = time.monotonic() - outcome.ctx.started if outcome.ctx.started else None
        with self._slots:
            if ran is not None:
                self.handler_seconds = handler_average(self.handler_seconds, ran)
            if outcome.ctx.phase != "completing":
                outcome.ctx.phase = "completing"
                self._active -= 1
                self._slots.notify_all()
        self._outcomes.put(outcome)

    def finish_job(self, ctx: JobContext, outcome: str, **extra: Any) -> None:
        self.finish_jobs([(ctx, outcome, extra)])

    def finish_jobs(self, finished: Sequence[tuple[JobContext, str, dict[str, Any]]]) -> None:
        """Count jobs as finished (outcome committed, or the job lost) and free their
        places: a completer's batch under one lock and one wake-up of the fetcher."""
        ended: list[tuple[JobContext, str, dict[str, Any]]] = []
        with self._slots:
            for ctx, outcome, extra in finished:
                if ctx.phase == "done":
                    continue
                if ctx.phase != "completing":
                    self._active -= 1
                ctx.phase = "done"
                name = _COUNTERS.get(outcome, "errors")
                setattr(self.stats, name, getattr(self.stats, name) + 1)
                self._held.pop(ctx.job.id, None)
                self._inflight -= 1
                ended.append((ctx, outcome, extra))
            if ended:
                self._slots.notify_all()
            settled = self.until_idle and self._inflight == 0
        if settled:  # the fetcher's last grab proved nothing: let it look again now
            self.wakeup.interrupt()
        now = time.monotonic()
        for ctx, outcome, extra in ended:
            duration = now - ctx.started if ctx.started else 0.0
            log_job(ctx, outcome, duration, **extra)
            for observe in self.observers:
                try:
                    observe(ctx.job, outcome, duration)
                except Exception:  # an observer must not stop the worker
                    log.exception("job observer %r failed", observe)

    # -- heartbeat ---------------------------------------------------------------------------


def handler_average(mean: float | None, ran: float) -> float:
    """The handlers' moving average run time, quick to rise and slow to fall: one slow
    handler shrinks the prefetch at once (fewer jobs wait behind it), fast ones grow it back
    over a few dozen jobs."""
    return rise_fast_fall_slow(mean, ran)


def log_job(ctx: JobContext, outcome: str, duration: float, **extra: Any) -> None:
    if outcome == "error":
        level = logging.ERROR
    else:
        level = logging.INFO if outcome in ("done", "replaced") else logging.WARNING
    if not log.isEnabledFor(level):  # per job: build nothing that nobody reads
        return
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
    summary = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("event", "error"))
    err = fields.get("error")
    if err:
        summary += " error=" + str(err).splitlines()[0]
    log.log(level, "job %s", summary, extra={"homing": fields})
