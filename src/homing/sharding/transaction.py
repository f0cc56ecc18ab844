"""A transaction of a sharded store: one shard's transaction that refuses other shards.

A transaction is atomic on one database, so it lives on one shard. Inside it, every write
is checked against the placement: a job handle of another shard, or a ``unique_key`` that
another shard owns, raises ``CrossShardWrite`` (naming the shard to open instead) rather
than quietly making a second job with the same key on the wrong shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from homing.database import Transaction
from homing.errors import CrossShardWrite
from homing.jobs import Job, JobOps, JobSpec
from homing.store.protocol import Tx


def shard_of_handle(handle: Job | str) -> str:
    text = handle.handle if isinstance(handle, Job) else handle
    return text.split(":", 1)[0] if isinstance(text, str) and ":" in text else ""


class ShardTransaction(Transaction):
    """The job API inside one shard's transaction (``shard``: its number)."""

    def __init__(
        self,
        tx: Tx,
        ops: JobOps,
        *,
        shard: int,
        owner: Callable[[str], int],
        moved: Callable[[str], str | None],
    ) -> None:
        super().__init__(tx, ops)
        self.shard = shard
        self._owner = owner
        self._moved = moved

    def _check_key(self, key: str | None) -> None:
        if key is not None and self._owner(key) != self.shard:
            raise CrossShardWrite(
                f"unique_key {key!r} lives on shard {self._owner(key)}, and this transaction "
                f"is on shard {self.shard}; open the transaction with "
                f"transaction(unique_key={key!r}) so the job and your writes commit together"
            )

    def _check_specs(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> list[Any]:
        specs = list(jobs)
        for spec in specs:
            if isinstance(spec, JobSpec):
                self._check_key(spec.unique_key)
                if spec.after and not isinstance(spec.after, str):
                    for dependency in spec.after:
                        self._check_handle(dependency)
        return specs

    def _check_handle(self, job: Job | str) -> None:
        shard = shard_of_handle(job)
        if shard.isdigit() and int(shard) != self.shard:
            raise CrossShardWrite(
                f"job {getattr(job, 'handle', job)!r} lives on shard {shard}, and this "
                f"transaction is on shard {self.shard}; use transaction(shard={shard}) or "
                "the store itself for it"
            )

    def insert(
        self,
        type: str,
        args: Any = None,
        *,
        priority: int = 0,
        run_at: float | datetime | None = None,
        unique_key: str | None = None,
        timeout: float | None = None,
        after: Sequence[str] | None = None,
    ) -> str:
        self._check_key(unique_key)
        for dependency in after or ():
            self._check_handle(dependency)  # a job waits on its dependencies' shard
        if unique_key is not None and (found := self._moved(unique_key)) is not None:
            return found
        return super().insert(
            type,
            args,
            priority=priority,
            run_at=run_at,
            unique_key=unique_key,
            timeout=timeout,
            after=after,
        )

    def insert_many(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> list[str]:
        specs = self._check_specs(jobs)
        found = {
            i: h
            for i, s in enumerate(specs)
            if isinstance(s, JobSpec) and s.unique_key is not None
            if (h := self._moved(s.unique_key)) is not None
        }
        if not found:
            return super().insert_many(specs)
        self._ops.new_jobs(specs)  # bad input is refused before anything is written
        rest = super().insert_many([s for i, s in enumerate(specs) if i not in found])
        it = iter(rest)
        return [found[i] if i in found else next(it) for i in range(len(specs))]

    def replace(
        self,
        job: Job | str,
        jobs: Iterable[JobSpec | tuple[str, Any]],
        *,
        lease_token: str | None = None,
    ) -> list[str]:
        self._check_handle(job)
        return super().replace(job, self._check_specs(jobs), lease_token=lease_token)

    def complete(self, job: Job | str, *, lease_token: str | None = None) -> None:
        self._check_handle(job)
        super().complete(job, lease_token=lease_token)

    def complete_many(self, jobs: Iterable[Job]) -> None:
        jobs = list(jobs)
        for job in jobs:
            self._check_handle(job)
        super().complete_many(jobs)

    def complete_each(self, jobs: Iterable[Job]) -> list[Any]:
        jobs = list(jobs)
        for job in jobs:
            self._check_handle(job)
        return super().complete_each(jobs)

    def temp_fail(
        self, job: Job | str, message: str, *, retry_in: float, lease_token: str | None = None
    ) -> float:
        self._check_handle(job)
        return super().temp_fail(job, message, retry_in=retry_in, lease_token=lease_token)

    def perm_fail(self, job: Job | str, message: str, *, lease_token: str | None = None) -> None:
        self._check_handle(job)
        super().perm_fail(job, message, lease_token=lease_token)

    def extend(
        self,
        job: Job | str,
        lock_for: float,
        *,
        lease_token: str | None = None,
        not_after: float | None = None,
    ) -> float:
        self._check_handle(job)
        return super().extend(job, lock_for, lease_token=lease_token, not_after=not_after)

    def release(
        self, job: Job | str, message: str = "released", *, lease_token: str | None = None
    ) -> None:
        self._check_handle(job)
        super().release(job, message, lease_token=lease_token)

    def redrive(self, handle: str) -> None:
        self._check_handle(handle)
        super().redrive(handle)
