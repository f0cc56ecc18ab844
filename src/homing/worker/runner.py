"""The runner threads: run each grabbed job's handler (sync, or async on the event loop),
then complete it in the handler's own transaction or hand the outcome to the completer."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from homing._failpoints import failpoint
from homing.errors import JobCancelled, JobTimedOut, StaleLease
from homing.worker import timeouts
from homing.worker.context import JobContext, LeaseLost, describe, lost_label
from homing.worker.outcome import Outcome, failure_outcome

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


def run_event_loop(w: Worker) -> None:
    assert w._loop is not None
    asyncio.set_event_loop(w._loop)
    w._loop.run_forever()


def run_jobs(w: Worker) -> None:
    while True:
        ctx = w._ready.get()
        if ctx is None:
            return
        if ctx.phase != "queued":
            continue
        if ctx.lease_lost:  # lost, cancelled (or released at shutdown) before it started
            w.finish_job(ctx, ctx.lost_kind, error=ctx._lost_reason)
            continue
        try:
            execute(w, ctx)
        except BaseException as exc:  # a runner must not die
            log.exception("internal error running job %s", ctx.job.handle)
            w.finish_job(ctx, "error", error=describe(exc))


def execute(w: Worker, ctx: JobContext) -> None:
    job, handler = ctx.job, ctx.handler
    ctx.phase = "running"
    ctx.started = time.monotonic()
    ctx._runner_ident = threading.get_ident()
    policy = handler.retry
    if policy.max_attempts is not None and job.attempts > policy.max_attempts:
        w.submit(
            Outcome(
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
    timeouts.arm(w, ctx)
    try:
        if handler.is_async:
            run_async(w, ctx)
        else:
            handler.fn(job, ctx)
    except BaseException as exc:  # every handler failure is recorded
        error = exc
    finally:
        timeouts.disarm(ctx)
    if error is None and ctx.lease_lost:
        error = LeaseLost(f"job {job.handle}: {ctx._lost_reason}")
    if error is None:
        error = commit(w, ctx)
        if error is None:
            return
    else:
        rollback(w, ctx, error)
    if ctx.lease_lost or isinstance(error, StaleLease | JobCancelled | JobTimedOut):
        label = ctx.lost_kind if ctx.lease_lost else lost_label(error)
        w.finish_job(ctx, label, error=str(error))
        return
    w.submit(failure_outcome(w, ctx, error))


def run_async(w: Worker, ctx: JobContext) -> None:
    """Run an async handler on the loop; serve its transaction requests meanwhile."""
    assert w._loop is not None
    requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
    ctx._requests = requests

    async def main() -> Any:
        ctx._task = asyncio.current_task()
        if ctx.lease_lost:
            raise LeaseLost(f"job {ctx.job.handle}: {ctx._lost_reason}")
        return await ctx.handler.fn(ctx.job, ctx)

    fut = asyncio.run_coroutine_threadsafe(main(), w._loop)
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


def commit(w: Worker, ctx: JobContext) -> BaseException | None:
    """Complete (or replace) a handler's job; None on success, else the error."""
    job = ctx.job
    if ctx._tx is None and ctx._children is None:
        failpoint("worker.after_effect_before_complete")
        w.submit(Outcome(ctx, "complete"))
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
        rollback(w, ctx, exc)
        return exc
    try:
        ctx._close(None)
    except BaseException as exc:  # the commit failed
        return exc
    if ctx._children is not None:
        w.finish_job(ctx, "replaced", children=len(ctx._children))
    else:
        w.finish_job(ctx, "done")
    return None


def rollback(w: Worker, ctx: JobContext, exc: BaseException) -> None:
    try:
        ctx._close(exc)
    except BaseException as rb:  # the connection is gone: same effect
        log.warning("rollback of job %s failed: %s", ctx.job.handle, rb)
