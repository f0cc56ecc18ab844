"""The completer thread: writes the outcomes of handlers that did not write through
``ctx.connection``, many jobs per commit (group commit).

A batch's completions go in one statement (``complete_each``: one round trip on
PostgreSQL), which is not all-or-none: a refused one (a lost lease) is reported as lost
and its ``on_complete`` writes are not made; the others stand. A batch of plain
completions (no ``on_complete`` writes) is that statement alone, committing by itself; any
other mix (retries, failures, ``on_complete`` writes) is one transaction, so one commit
(one fsync) covers the whole batch. If an ``on_complete`` write fails, the transaction is
rolled back and the batch written job by job. A job counts as finished only after its
commit: nothing is acknowledged before it.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING

from homing.errors import InvalidState, JobNotFound, StaleLease
from homing.jobs import Job
from homing.worker.context import lost_label
from homing.worker.joined_grab import GrabRequest, grab_in
from homing.worker.outcome import OnCompleteFailed, Outcome, failure_outcome, record

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

BATCH = 256  # outcomes written per commit, at most


def complete_outcomes(w: Worker) -> None:
    while True:
        item = w._outcomes.get()
        if item is None:
            return
        batch: list[Outcome] = []
        grabs: list[GrabRequest] = []
        stop = False
        while True:
            if isinstance(item, GrabRequest):
                grabs.append(item)
            else:
                batch.append(item)
            if len(batch) >= BATCH:
                break
            try:
                next_item = w._outcomes.get_nowait()
            except queue.Empty:
                break
            if next_item is None:
                stop = True
                break
            item = next_item
        write_outcomes(w, batch, grabs[0] if grabs else None)
        for request in grabs:  # not served with the batch: a grab of its own
            if not request.done.is_set():
                serve_alone(w, request)
        if stop:
            return


def write_outcomes(w: Worker, batch: list[Outcome], grab: GrabRequest | None = None) -> None:
    """Write a batch of outcomes, per shard: plain completions alone in one statement that
    commits by itself; any other mix in one transaction. ``grab`` (a single-writer store's
    fetcher waiting for jobs) is made in that transaction after the outcomes, and answered
    once it committed."""
    by_shard: dict[int, list[Outcome]] = {}
    for outcome in batch:
        by_shard.setdefault(w.shard_of(outcome.ctx.job), []).append(outcome)
    for items in by_shard.values():
        if grab is not None:
            write(w, items, grab)
            grab = None
        elif all(o.action == "complete" and not o.ctx._on_complete for o in items):
            write_completions(w, items)
        else:
            write(w, items)


def serve_alone(w: Worker, request: GrabRequest) -> None:
    try:
        jobs = grab_in(w.db, w, request.limit)
    except Exception as exc:  # the fetcher logs it and retries, as with its own grabs
        request.answer(error=exc)
    else:
        request.answer(jobs)


def write_completions(w: Worker, items: list[Outcome]) -> None:
    """Plain completions: one statement that commits by itself (``complete_each``). A job
    whose lease was lost is refused there and reported as lost; the others are done."""
    items.sort(key=lambda o: o.ctx.job.id)  # one lock order: no deadlocks on PostgreSQL
    try:
        refused = w.db.complete_each([o.ctx.job for o in items])
    except Exception as exc:  # nothing was written; leases will expire
        unrecorded(w, items, exc)
        return
    lost = {job.id: exc for job, exc in refused}
    for o in items:
        o.result = lost.get(o.ctx.job.id)
    recorded(w, items)


def recorded(w: Worker, items: list[Outcome]) -> None:
    """The batch was written: each job ends as its outcome, or as lost where the store
    refused it (``result``)."""
    w.finish_jobs(
        [
            (o.ctx, lost_label(o.result), {"error": str(o.result)})
            if o.result is not None
            else (o.ctx, o.label, {"error": o.error, "retry_in": o.retry_in})
            for o in items
        ]
    )


def unrecorded(w: Worker, items: list[Outcome], exc: Exception) -> None:
    """Nothing of the batch was written: its jobs end here as errors; their leases expire
    and they run again."""
    w.finish_jobs(
        [
            (
                o.ctx,
                "error",
                {
                    "error": f"could not record the outcome ({o.label}): {exc}; the job runs "
                    "again when its lease expires"
                },
            )
            for o in items
        ]
    )


def write(w: Worker, items: list[Outcome], grab: GrabRequest | None = None) -> None:
    """Write a batch of outcomes in one transaction (one commit for all of them). Its
    completions go in one statement (``complete_each``): one whose lease was lost is
    refused there, its ``on_complete`` writes are not made, and it is reported as lost,
    while the others stand. If an ``on_complete`` write fails, the transaction is rolled
    back and the batch written job by job, so the others still count (and ``grab`` is
    then left to the caller: its jobs were not leased)."""
    items.sort(key=lambda o: o.ctx.job.id)  # one lock order: no deadlocks on PostgreSQL
    try:
        try:
            grabbed = write_batch(w, items, grab)
            if grab is not None and grabbed is not None:
                grab.answer(*grabbed)  # committed: the leases are stored
        except OnCompleteFailed:  # a refused lease does not raise: complete_each reports it
            items[:] = [write_alone(w, o) for o in items]
    except Exception as exc:  # nothing was written; leases will expire
        unrecorded(w, items, exc)
        return
    recorded(w, items)


def write_batch(
    w: Worker, items: list[Outcome], grab: GrabRequest | None = None
) -> tuple[list[Job], BaseException | None] | None:
    """The batch in one transaction: its completions in one ``complete_each`` (a refused
    one gets its error in ``result``, and its ``on_complete`` writes are not made), the
    other outcomes each recorded (a refused one likewise); then ``grab`` in a savepoint
    (a failed grab undoes nothing else). Returns the grab's (jobs, error), None without."""
    for o in items:
        o.result = None
    grabbed: tuple[list[Job], BaseException | None] | None = None
    with w.transaction_for(items[0].ctx.job) as tx:
        completions = [o for o in items if o.action == "complete"]
        if completions:
            refused = {j.id: exc for j, exc in tx.complete_each([o.ctx.job for o in completions])}
            for o in completions:
                o.result = refused.get(o.ctx.job.id)
                if o.result is None and o.ctx._on_complete:
                    try:
                        o.ctx._run_on_complete(tx)
                    except Exception as exc:  # roll back; written one by one instead
                        raise OnCompleteFailed(str(exc)) from exc
        for o in items:
            if o.action == "complete":
                continue
            try:
                record(tx, o)
            except (StaleLease, InvalidState, JobNotFound) as exc:
                o.result = exc
        if grab is not None:
            try:
                with tx.tx.savepoint():
                    grabbed = (grab_in(tx, w, grab.limit), None)
            except Exception as exc:
                grabbed = ([], exc)
    return grabbed


def write_alone(w: Worker, o: Outcome) -> Outcome:
    """One outcome in its own transaction (the fallback when a batch was refused). A
    completion whose ``on_complete`` writes raise becomes that job's failure."""
    o.result = None
    try:
        with w.transaction_for(o.ctx.job) as tx:
            record(tx, o)
            if o.action == "complete":
                o.ctx._run_on_complete(tx)
        return o
    except (StaleLease, InvalidState, JobNotFound) as exc:
        o.result = exc
        return o
    except Exception as exc:
        if o.action != "complete":
            raise
        failure = failure_outcome(w, o.ctx, exc)
        try:
            with w.transaction_for(o.ctx.job) as tx:
                record(tx, failure)
        except (StaleLease, InvalidState, JobNotFound) as lost:
            failure.result = lost
        return failure
