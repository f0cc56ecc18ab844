"""Per-type and per-job timeouts: an attempt that runs past its timeout is failed in the
store (retryable, under the handler's retry policy) and its lease ends, so its late
completion is refused (``JobTimedOut``); an async handler is cancelled as well. A sync
handler's thread cannot be stopped from outside: it runs on, and ``ctx.timed_out`` tells
it to stop early; its slot stays busy until it returns.

A timer per attempt, armed only for jobs that have a timeout: jobs without one cost
nothing here."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from homing.errors import HomingError, InvalidState, JobNotFound, StaleLease
from homing.worker.context import JobContext
from homing.worker.outcome import failure_outcome, record

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


class JobTimeout(HomingError):
    """The handler ran past its timeout (the attempt's failure, as recorded)."""


def timeout_of(ctx: JobContext) -> float | None:
    """The shorter of the job's own timeout and its type's (None: no timeout)."""
    own, of_type = ctx.job.timeout, ctx.handler.timeout
    if own is None:
        return of_type
    return own if of_type is None else min(own, of_type)


def arm(w: Worker, ctx: JobContext) -> None:
    seconds = timeout_of(ctx)
    if seconds is None:
        return
    ctx.deadline = w.db_clock_now() + seconds
    timer = threading.Timer(seconds, expire, (w, ctx, seconds))
    timer.daemon = True
    ctx._timer = timer
    timer.start()


def disarm(ctx: JobContext) -> None:
    timer, ctx._timer = ctx._timer, None
    if timer is not None:
        timer.cancel()


def expire(w: Worker, ctx: JobContext, seconds: float) -> None:
    """Fail the attempt in the store (the store decides between this and a completion
    racing it: exactly one applies), then tell the handler."""
    if ctx.phase != "running" or ctx.lease_lost:
        return  # finished (or finishing) in time, or lost already
    error = JobTimeout(f"the handler ran past its timeout of {seconds:g}s")
    outcome = failure_outcome(w, ctx, error)
    try:
        with w.transaction_for(ctx.job) as tx:
            record(tx, outcome)
    except (StaleLease, InvalidState, JobNotFound):
        return  # completed, cancelled or taken over first
    except Exception as exc:  # the store is down: the lease runs out instead
        log.warning("job %s: could not record its timeout: %s", ctx.job.handle, exc)
    ctx._mark_lost(
        f"timed out after {seconds:g}s: the attempt was failed ({outcome.action}) and its "
        "completion will be refused",
        "timed_out",
    )
