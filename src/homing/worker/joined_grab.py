"""The fetcher's grab made inside the completer's next transaction, on a single-writer store.

On SQLite every write transaction of every process takes the database's one write lock
in turn. A worker whose handlers finish while the fetcher wants more jobs made two turns:
the completer's commit of the outcomes, then the fetcher's grab. When outcomes are waiting
to be written, the fetcher now hands its grab to the completer, which makes it after the
outcomes in the same transaction: one turn. The jobs reach the fetcher only after that
commit (their leases are stored), and the fetcher hands them out as before. Measured: the
pipeline's delivery workers made ~370 grabs a run instead of ~1,000, but their throughput
did not move (the turns saved are unsynced ones; bench/results/pipeline-commits.txt,
make-run-ab-handoff-joined-grab-2026-11-27.log); the harness's SQLite worker cells
1.04x / 1.08x (ab-f9c0118-joined-grab.md).

A store with concurrent writers (PostgreSQL) keeps the two apart: there a grab does not
wait for other processes' commits, and a grab in a durable transaction would wait for
the completion's WAL flush that it does not need (``Store.statement``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from homing.database import Database, ShardedDatabase, Transaction
from homing.job_api import Job

if TYPE_CHECKING:
    from homing.worker.runtime import Worker


class GrabRequest:
    """A grab of up to ``limit`` jobs for the fetcher, answered by the completer."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.jobs: list[Job] = []
        self.error: BaseException | None = None
        self.done = threading.Event()

    def answer(self, jobs: list[Job] | None = None, error: BaseException | None = None) -> None:
        self.jobs, self.error = jobs or [], error
        self.done.set()


def grab_in(api: Database | ShardedDatabase | Transaction, w: Worker, limit: int) -> list[Job]:
    """The fetcher's grab (its types, lease, worker id and idle channel) through ``api``."""
    return api.grab_many(
        w.types,
        lock_for=w.lock_for,
        limit=limit,
        worker_id=w.worker_id,
        idle_channel=w.wakeup.channel,
    )


def joins(w: Worker) -> bool:
    """Whether this worker's grabs may join the completer's transactions."""
    return isinstance(w.db, Database) and not w.db.store.capabilities.concurrent_writers


def grab(w: Worker, limit: int) -> list[Job]:
    """Grab for the fetcher: in the completer's next transaction when outcomes are waiting
    for it (and the store has a single writer), else in a statement of its own."""
    with w._slots:
        outcomes_waiting = w._inflight > w._active
    if not (outcomes_waiting and w.joins_grabs):
        return grab_in(w.db, w, limit)
    request = GrabRequest(limit)
    w._outcomes.put(request)
    while not request.done.wait(1.0):
        if not w.completer_alive():  # it died or stopped: nobody will answer
            return grab_in(w.db, w, limit)
    if request.error is not None:
        raise request.error
    return request.jobs
