"""The watcher thread: tells the handlers of cancelled jobs (``ctx.cancelled``; an async
handler is cancelled) within ``Worker.watch_every`` seconds of ``db.cancel``. It asks the
store about the jobs this worker holds, and nothing when it holds none. At the same pace
it releases the jobs whose dependencies are done (one read of an empty table when no job
waits)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from homing.database import Database, ShardedDatabase
from homing.job_controls import cancelled_among

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


def shard_db(w: Worker, shard: int) -> Database:
    return w.db.shards[shard] if isinstance(w.db, ShardedDatabase) else w.db


def release_waiting(w: Worker) -> None:
    """Release the jobs whose dependencies are done (``homing.job_deps``)."""
    try:
        w.db.release_waiting()
    except Exception as exc:  # again at the next look
        log.warning("could not release waiting jobs: %s", exc)


def watch_cancels(w: Worker) -> None:
    while not w._stopped.wait(w.watch_every):
        release_waiting(w)
        with w._slots:
            held = [c for c in w._held.values() if c.phase in ("queued", "running")]
        held = [c for c in held if not c.lease_lost]
        if not held:
            continue
        by_shard: dict[int, list[str]] = {}
        for ctx in held:
            by_shard.setdefault(w.shard_of(ctx.job), []).append(ctx.job.id)
        try:
            cancelled: set[str] = set()
            for shard, job_ids in by_shard.items():
                cancelled |= cancelled_among(shard_db(w, shard).store, job_ids)
        except Exception as exc:  # try again at the next look
            log.warning("could not look for cancelled jobs: %s", exc)
            continue
        for ctx in held:
            if ctx.job.id in cancelled:
                ctx._mark_lost(f"job {ctx.job.handle} was cancelled", "cancelled")
                log.info("job %s: cancelled; its completion will be refused", ctx.job.handle)
