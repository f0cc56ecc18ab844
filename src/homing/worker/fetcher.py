"""The fetcher thread: grabs as many jobs as there are free handler slots (plus
``prefetch``), in one ``grab_many``, and hands them to the runners. When nothing is
available it waits on the store's wake-up (``Database.wakeup``): a NOTIFY on PostgreSQL,
a back-off poll on SQLite; after a grab that got fewer jobs than it asked for it waits
too, rather than making one more (empty) grab. On PostgreSQL such a grab registers the
worker as idle (``Database.idle_wakeup``), so that an insert wakes as many workers as it
inserted jobs, not every one."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from homing._failpoints import failpoint
from homing.worker import joined_grab
from homing.worker.context import JobContext

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


PREFETCH_WAIT_S = 0.02  # how long a prefetched job may wait for a runner, about
MAX_PREFETCH_PER_SLOT = 16


def prefetch_for(w: Worker) -> int:
    """Jobs to grab beyond the free handler slots. A number given as ``prefetch`` is kept.
    By default: ``max(4, concurrency)``, or more when handlers are short: as many as the
    runners get through in about ``PREFETCH_WAIT_S`` at the handlers' average run time, up
    to ``MAX_PREFETCH_PER_SLOT`` per slot. Short jobs then share a grab and a completion
    commit by the dozen (docs/worker.md, "Throughput", has the measured effect), while a
    prefetched job waits ~20 ms at most for a runner."""
    mean = w.handler_seconds
    if not w.adaptive_prefetch or mean is None:
        return w.prefetch
    fits = int(PREFETCH_WAIT_S * w.concurrency / max(mean, 1e-6))
    return max(w.prefetch, min(fits, MAX_PREFETCH_PER_SLOT * w.concurrency))


def free_slots(w: Worker) -> int:
    """Wait until a handler slot is free and nothing waits to run; return how many jobs
    to grab: the free slots plus ``prefetch_for(w)`` more, so one grab serves several
    handlers. Outcomes waiting for the completer hold no slot, so grabbing overlaps with
    writing them; their backlog is bounded by four times the capacity. 0 when stopping."""
    prefetch = prefetch_for(w)
    low_water = w.concurrency if prefetch else w.concurrency - 1
    capacity = w.concurrency + prefetch
    with w._slots:
        while (
            w._active > low_water or w._inflight - w._active > 4 * capacity
        ) and not w._stopping.is_set():
            w._slots.wait(1.0)
        return 0 if w._stopping.is_set() else capacity - w._active


def fetch_jobs(w: Worker) -> None:
    errors = 0
    wakeup = w.wakeup
    while not w._stopping.is_set():
        free = free_slots(w)
        if not free:
            break
        with w._slots:  # until_idle: only a grab begun with nothing held can prove idleness
            settled = w._inflight == 0
        try:
            jobs = joined_grab.grab(w, free)  # with the completer's commit, when it can
            errors = 0
        except Exception as exc:  # the store is down: wait and retry
            errors += 1
            log.warning("grab failed (%s); retrying", exc)
            w._stopping.wait(min(5.0, 0.1 * 2**errors))
            continue
        with w._slots:
            w.stats.grabs += 1
            w.stats.empty_grabs += 0 if jobs else 1
        if jobs:
            hand_out(w, [JobContext(w, j, w.app.handler(j.type)) for j in jobs])
            wakeup.reset()
            if len(jobs) >= free or w.until_idle:
                continue  # there may be more: grab again at once
            # Fewer than asked: nothing else was ready, and the same statement registered
            # this worker as idle (it has room), so the next insert wakes it: wait for that
            # instead of an empty grab.
        elif w.until_idle and settled and stop_if_idle(w):
            break
        if wakeup.wait(w.idle_wait) and w.gather > 0:
            # woken by an insert: let the jobs of the next moments gather, so that one grab
            # takes several and one completion commit covers them (fewer commits per job)
            w._stopping.wait(w.gather)


def hand_out(w: Worker, contexts: list[JobContext]) -> None:
    with w._slots:
        w._inflight += len(contexts)
        w._active += len(contexts)
        for ctx in contexts:
            w._held[ctx.job.id] = ctx
        w.stats.grabbed += len(contexts)
    failpoint("worker.after_grab")
    for ctx in contexts:
        w._ready.put(ctx)


def stop_if_idle(w: Worker) -> bool:
    """``until_idle``: stop once a grab found nothing and nothing is held. The grab must
    have begun with nothing held: one made while a job's outcome was still being written
    cannot see that job ready again (a retry), so it proves nothing."""
    with w._slots:
        idle = w._inflight == 0
    if idle:
        w._stopping.set()
        if not w._running:  # started with start(): nobody else shuts down
            threading.Thread(target=w._shutdown, daemon=True).start()
    return idle
