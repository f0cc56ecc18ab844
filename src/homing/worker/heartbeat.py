"""The heartbeat thread: extends the lease of every held job whose lease is half gone; a
lease that cannot be extended (another worker holds the job now) marks the job lost, so
its completion is refused (fencing) and an async handler is cancelled."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from homing.errors import InvalidState, JobNotFound, StaleLease

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
            try:
                w.db.extend(ctx.job, w.lock_for)
            except (StaleLease, JobNotFound) as exc:
                ctx._mark_lost(f"lease lost: {exc}")
                log.warning("job %s: lease lost; its completion will be refused", ctx.job.handle)
            except InvalidState:
                pass  # finished meanwhile
            except Exception as exc:  # try again next beat
                log.warning("heartbeat for job %s failed: %s", ctx.job.handle, exc)
