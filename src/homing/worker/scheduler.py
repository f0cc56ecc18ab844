"""The scheduler: inserts the jobs of periodic schedules, exactly one per tick (see
``homing.schedules`` for how). Every worker whose app has schedules runs one; any number
may run at once, on any hosts, and any may be killed at any moment."""

from __future__ import annotations

import logging
import threading

from homing import schedules as sched
from homing.database import Database, ShardedDatabase
from homing.schedules import Schedule

log = logging.getLogger("homing.worker")

MAX_SLEEP_S = 0.5  # a scheduler looks at least this often (a changed clock, a new row)


class Scheduler:
    """Runs ``schedules`` on ``db`` (a sharded store keeps them on shard 0)."""

    def __init__(self, db: Database | ShardedDatabase, schedules: list[Schedule]) -> None:
        self.db = db.shards[0] if isinstance(db, ShardedDatabase) else db
        self.schedules = list(schedules)
        self.inserted = 0

    def register(self) -> None:
        sched.register(self.db.store, self.schedules, max_args_bytes=self.db._ops.max_args_bytes)

    def run_pending(self) -> list[str]:
        """Insert the jobs of every due tick now; the handles inserted."""
        handles: list[str] = []
        for s in self.schedules:
            handles += sched.run_due(self.db, s.name)
        self.inserted += len(handles)
        return handles

    def seconds_to_next(self) -> float:
        now = self.db.clock.now()
        soonest = min(sched.next_tick(s.cron, s.tz, now) for s in self.schedules)
        return min(MAX_SLEEP_S, max(0.005, soonest - now + 0.005))

    def run(self, stop: threading.Event) -> None:
        """Register the schedules, then insert due ticks until ``stop`` is set."""
        if not self.schedules:
            return
        errors, registered = 0, False
        while not stop.is_set():
            try:
                if not registered:
                    self.register()
                    registered = True
                self.run_pending()
                errors = 0
                wait = self.seconds_to_next()
            except Exception as exc:  # the store is down: retry with a back-off
                errors += 1
                registered = False  # again after an error: the store may have been reset
                wait = min(5.0, 0.1 * 2**errors)
                log.warning("scheduler: %s; retrying in %.1fs", exc, wait)
            stop.wait(wait)
