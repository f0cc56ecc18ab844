"""The heartbeat thread: extends the lease of every held job whose lease is half gone; a
lease that cannot be extended (another worker holds the job now) marks the job lost, so
its completion is refused (fencing) and an async handler is cancelled."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from homing.errors import InvalidState, JobCancelled, JobNotFound, StaleLease

if TYPE_CHECKING:
    from homing.worker.runtime import Worker

log = logging.getLogger("homing.worker")


def keep_leases(w: Worker) -> None:
    while not w._stopped.wait(w.heartbeat):
        now = w.db_clock_now()
        with w._slots:
            contexts = list(w._held.values())
        for ctx in contexts:
            if ctx.phase == "done" or ctx.lease_lost:
                continue
            if ctx.job.lease_expires_at - now > w.lock_for / 2:
                continue
            lock_for = w.lock_for
            if ctx.deadline is not None:  # never past the attempt's timeout
                lock_for = min(lock_for, ctx.deadline - now)
                if lock_for <= 0 or ctx.job.lease_expires_at >= ctx.deadline:
                    continue
            try:
                w.db.extend(ctx.job, lock_for, not_after=ctx.deadline)
            except (StaleLease, JobNotFound) as exc:
                ctx._mark_lost(f"lease lost: {exc}")
                log.warning("job %s: lease lost; its completion will be refused", ctx.job.handle)
            except JobCancelled as exc:
                ctx._mark_lost(str(exc), "cancelled")
            except InvalidState:
                pass  # finished meanwhile
            except Exception as exc:  # try again next beat
                log.warning("heartbeat for job %s failed: %s", ctx.job.handle, exc)
