"""A handler's outcome on its way to the store: what to write, and how a failure becomes
an outcome under the handler's retry policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from homing.database import Transaction
from homing.errors import PermanentFailure
from homing.worker.context import JobContext, describe
from homing.worker.handler import RetryLater

if TYPE_CHECKING:
    from homing.worker.runtime import Worker


class OnCompleteFailed(Exception):
    """An ``on_complete`` write raised inside a batch: the batch is written job by job."""


@dataclass
class Outcome:
    ctx: JobContext
    action: str  # complete | temp_fail | perm_fail
    message: str = ""
    retry_in: float = 0.0
    label: str = "done"
    error: str | None = None
    result: BaseException | None = field(default=None)


def record(tx: Transaction, o: Outcome) -> None:
    """Write one outcome (complete, temp_fail or perm_fail) of a job in ``tx``."""
    if o.action == "complete":
        tx.complete(o.ctx.job)
    elif o.action == "temp_fail":
        tx.temp_fail(o.ctx.job, o.message, retry_in=o.retry_in)
    else:
        tx.perm_fail(o.ctx.job, o.message)


def failure_outcome(w: Worker, ctx: JobContext, error: BaseException) -> Outcome:
    text = describe(error)
    if isinstance(error, PermanentFailure):
        return Outcome(ctx, "perm_fail", message=text, label="failed", error=text)
    policy = ctx.handler.retry
    job = ctx.job
    delay = error.delay if isinstance(error, RetryLater) else policy.delay(job.attempts)
    age = max(0.0, w.db_clock_now() - job.created_at)
    reason = policy.gives_up(job.attempts, age, delay)
    if reason is not None:
        return Outcome(
            ctx,
            "perm_fail",
            message=f"{reason}; last error: {text}",
            label="failed",
            error=text,
        )
    return Outcome(ctx, "temp_fail", message=text, retry_in=delay, label="retry", error=text)
