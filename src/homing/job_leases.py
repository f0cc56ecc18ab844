"""Leasing jobs: a grab's arguments checked, its lease made (the holder registered), the
rows leased and made into ``Job`` objects, after the commit where the caller can (on
SQLite the write lock is then not held while args are parsed).

``Leasing`` is the part of ``JobOps`` (``homing.jobs``) that grabs; ``JobOps`` sets the
attributes it names.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from homing import ids
from homing.errors import InvalidArgument
from homing.job_checks import check_seconds
from homing.job_controls import TypeControl, limited_grab
from homing.job_model import Job
from homing.store import holders_queries as hq
from homing.store import jobs_queries as q
from homing.store.dialect import SqlDialect
from homing.store.protocol import Store, Tx

MAX_LOCK_FOR_S = 30 * 24 * 3600.0
_MAX_HOLDERS_REMEMBERED = 1024  # holder ids a process keeps (Leasing.holder_id)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


class Grabbed(NamedTuple):
    """Rows leased by ``JobOps.lease_rows``, not yet made into jobs."""

    lease: q.Lease
    rows: list[tuple[Any, ...]]
    sql: SqlDialect  # decodes the args


class Leasing:
    """Grabs: the holder registry, the lease, the rows made into jobs."""

    store: Store
    shard: int | None
    _host: str
    # (pid, worker id) -> (homing_holders.id, when registered by the store's clock)
    _holders: dict[tuple[int, str], tuple[int, float]]

    def holder_id(self, tx: Tx, worker: str, now: float) -> int:
        """This process's holder id for ``worker``: registered in ``tx`` the first time,
        renewed every ``HOLDER_RENEW_S`` so that gc never forgets a live one. Remembered
        only once ``tx`` commits: a rolled-back registration names no row."""
        key = (os.getpid(), worker)
        known = self._holders.get(key)
        if known is not None and known[1] <= now < known[1] + hq.HOLDER_RENEW_S:
            return known[0]
        holder = hq.register_holder(tx, self._host, key[0], worker, now=now)
        holders = self._holders

        def remember() -> None:
            if len(holders) >= _MAX_HOLDERS_REMEMBERED:  # threads named afresh each time
                holders.clear()
            holders[key] = (holder, now)

        tx.call_after_commit(remember)
        return holder

    def handle_of(self, job_id: str) -> str:
        return job_id if self.shard is None else f"{self.shard}:{job_id}"

    @staticmethod
    def check_grab(lock_for: Any, limit: Any, worker_id: Any) -> float:
        """A grab's arguments, refused when wrong; returns the lease in seconds."""
        seconds = check_seconds("lock_for", lock_for, allow_zero=False, maximum=MAX_LOCK_FOR_S)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
        if worker_id is not None and not isinstance(worker_id, str):
            raise InvalidArgument(f"worker_id must be a string, got {worker_id!r}")
        return seconds

    def grab_limited(
        self,
        tx: Tx,
        control: TypeControl,
        *,
        lock_for: Any,
        where: Mapping[str, Any] | None,
        limit: int,
        worker_id: str | None,
    ) -> list[Job]:
        """Lease up to ``limit`` jobs of ``control``'s type under its limits (the caller's
        transaction must be a real one: it holds the type's lock)."""
        now, lease = self._new_lease(tx, lock_for, limit, worker_id)
        rows = limited_grab(tx, control, now=now, lease=lease, limit=limit, where=where)
        return self._jobs(lease, rows)

    def _new_lease(
        self, tx: Tx, lock_for: Any, limit: Any, worker_id: str | None
    ) -> tuple[float, q.Lease]:
        """(now, a lease for this grab), after checking the grab's arguments."""
        seconds = self.check_grab(lock_for, limit, worker_id)
        now = self.store.clock.now()
        holder = self.holder_id(tx, worker_id or default_worker_id(), now)
        return now, q.Lease(token=ids.uuid7(), until=now + seconds, holder=holder)

    def lease_rows(
        self,
        tx: Tx,
        names: Sequence[str],
        *,
        lock_for: Any,
        where: Mapping[str, Any] | None,
        limit: int,
        worker_id: str | None,
        idle_channel: str | None = None,
    ) -> Grabbed:
        """``grab``'s lease alone (types checked already, no type controls): the rows as
        stored, made into jobs by ``jobs_of`` after the commit, so that on SQLite the
        write lock is not held while their args are decoded."""
        now, lease = self._new_lease(tx, lock_for, limit, worker_id)
        rows = q.grab_rows(
            tx, names, now=now, lease=lease, limit=limit, where=where, idle_channel=idle_channel
        )
        return Grabbed(lease, rows, tx.sql)

    def jobs_of(self, grabbed: Grabbed) -> list[Job]:
        """The jobs of a ``lease_rows`` (no transaction needed)."""
        return self._jobs(grabbed.lease, q.decode_grabbed(grabbed.sql, grabbed.rows))

    def _jobs(self, lease: q.Lease, rows: Sequence[Mapping[str, Any]]) -> list[Job]:
        return [
            Job(
                handle=self.handle_of(r["id"]),
                id=r["id"],
                type=r["type"],
                args=r["args"],
                priority=r["priority"],
                attempts=r["attempts"],
                lease_token=lease.token,
                lease_expires_at=lease.until,
                run_at=r["run_at"],
                created_at=r["created_at"],
                unique_key=r["unique_key"],
                timeout=r["timeout_s"],
            )
            for r in rows
        ]
