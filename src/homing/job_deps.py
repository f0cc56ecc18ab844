"""Job dependencies: ``insert(type, args, after=[h1, h2])`` stores a job that runs once
all of ``h1, h2`` are done.

The dependant is inserted as a ready job that is never due (``run_at`` far in the future)
plus one ``homing_job_deps`` row per dependency, in the insert's transaction. A sweep
(every worker runs one with its watcher, every 0.5 s; ``Database.release_waiting`` runs
one by hand) looks at the waiting jobs in one transaction:

- every dependency done: the job is released (due at its own ``run_at``, or now), once:
  the release is a conditional update that only one sweep can apply;
- a dependency perm-failed, cancelled, or gone (garbage-collected): the dependant is
  **cancelled**, with the reason in its history (the rule: a dependant never runs after a
  failed dependency; ``redrive`` the dependency and insert the dependant again);
- otherwise it keeps waiting.

Nothing is added to the grab or the completion: a job that waits is not due, and the
release is the sweep's. A dependency that was replaced counts as done at its replace: to
wait for its children, pass their handles (``replace`` returns them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from homing.errors import InvalidArgument, JobNotFound
from homing.store import job_deps_queries as dq
from homing.store.jobs_queries import JOBS_CHANNEL
from homing.store.protocol import Store, Tx

if TYPE_CHECKING:
    from homing.jobs import JobOps
    from homing.store.jobs_queries import NewJob

WAIT_AT = dq.WAIT_AT
MAX_AFTER = 1000
SWEEP_BATCH = 500  # waiting jobs looked at per sweep transaction


def check_after(ops: JobOps, after: Any) -> tuple[str, ...]:
    """The job ids of ``after`` (handles or Jobs), checked; () for None."""
    if after is None:
        return ()
    if isinstance(after, str) or not isinstance(after, Iterable):
        raise InvalidArgument(f"after must be a list of job handles, got {after!r}")
    handles = list(after)
    if not handles or len(handles) > MAX_AFTER:
        raise InvalidArgument(f"after takes 1 to {MAX_AFTER} job handles, got {len(handles)}")
    return tuple(dict.fromkeys(ops.id_of(h) for h in handles))


def record(tx: Tx, jobs: Sequence[NewJob], inserted: set[str]) -> None:
    """Write the dependency rows of the jobs just inserted; a dependency that does not exist
    raises ``JobNotFound`` (and the caller's transaction inserts nothing)."""
    rows = [
        (j.id, a, j.release_at if j.release_at is not None else j.created_at)
        for j in jobs
        if j.after and j.id in inserted
        for a in j.after
    ]
    if not rows:
        return
    unknown = dq.missing(tx, sorted({a for _, a, _ in rows}))
    if unknown:
        raise JobNotFound(
            f"after= names jobs that do not exist (or were garbage-collected): "
            f"{', '.join(sorted(unknown)[:5])}"
        )
    dq.add(tx, rows)


def has_waiting(store: Store) -> bool:
    with store.transaction(write=False) as tx:
        return dq.any_waiting(tx)


def sweep(store: Store, ops: JobOps) -> tuple[list[str], list[str]]:
    """Release or cancel the waiting jobs whose dependencies have ended; the handles
    (released, cancelled)."""
    released: list[str] = []
    cancelled: list[str] = []
    if not has_waiting(store):
        return released, cancelled
    with store.transaction() as tx:
        now = store.clock.now()
        by_job: dict[str, list[dict[str, Any]]] = {}
        for row in dq.waiting(tx, SWEEP_BATCH):
            by_job.setdefault(str(row["job_id"]), []).append(row)
        ended: list[str] = []
        for job_id, deps in by_job.items():
            first = deps[0]
            if first["state"] != "ready" or first["run_at"] != WAIT_AT:
                ended.append(job_id)  # cancelled (or released) meanwhile
                continue
            failed = [d for d in deps if d["dep_state"] in ("failed", None)]
            if failed:
                d = failed[0]
                what = (
                    "no longer exists"
                    if d["dep_state"] is None
                    else "was cancelled"
                    if d["dep_cancelled"] is not None
                    else "perm-failed"
                )
                ops.cancel(tx, ops.handle_of(job_id), f"dependency {d['after_id']} {what}")
                cancelled.append(ops.handle_of(job_id))
                ended.append(job_id)
            elif all(d["dep_state"] == "done" for d in deps):
                if dq.release(tx, job_id, run_at=max(now, float(first["release_at"]))):
                    released.append(ops.handle_of(job_id))
                ended.append(job_id)
        dq.forget(tx, ended)
        if released:
            tx.sql.announce_jobs(tx, JOBS_CHANNEL, len(released))
    return released, cancelled
