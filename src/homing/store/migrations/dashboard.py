"""Schema the dashboard needs: one partial index so that its pages stay cheap on big stores.

Failed (and any other unsuccessful terminal state, such as cancelled) jobs are few and are
what an operator looks for; this index lets the overview count them per type and the jobs
list find them without reading the done jobs. Only rows in such a state enter it, so the
hot path (ready -> running -> done) pays nothing for it.
"""

from __future__ import annotations

from homing.store.migrations import Migration

_UNSUCCESSFUL = (
    "CREATE INDEX homing_jobs_unsuccessful ON homing_jobs (type, state, seq) "
    "WHERE state NOT IN ('ready', 'running', 'done')"
)

MIGRATIONS: list[Migration] = [
    Migration(1, "unsuccessful_jobs_index", (_UNSUCCESSFUL,), (_UNSUCCESSFUL,)),
]
