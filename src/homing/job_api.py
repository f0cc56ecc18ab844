"""``JobAPI``: the job API as a protocol, the same on one store (``Database``) and on a
sharded set (``ShardedDatabase``), so that code and tests written against it run on both."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from homing.errors import HomingError
from homing.job_controls import TypeControl
from homing.job_model import Job, JobDetails, JobSpec
from homing.store.protocol import Wakeup
from homing.store.wakeup import IdleWakeup


@runtime_checkable
class JobAPI(Protocol):
    """The job API that a single store (``Database``) and a sharded one
    (``ShardedDatabase``) both offer: code and tests written against it run on either."""

    @property
    def dialect(self) -> str: ...

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
    ) -> str: ...

    def insert_many(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> list[str]: ...

    def grab(
        self,
        types: str | Sequence[str],
        *,
        lock_for: float,
        where: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> Job | None: ...

    def grab_many(
        self,
        types: str | Sequence[str],
        *,
        lock_for: float,
        limit: int,
        where: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
        idle_channel: str | None = None,
    ) -> list[Job]: ...

    def complete(self, job: Job | str, *, lease_token: str | None = None) -> None: ...

    def complete_many(self, jobs: Iterable[Job]) -> None: ...

    def complete_each(self, jobs: Iterable[Job]) -> list[tuple[Job, HomingError]]: ...

    def temp_fail(
        self, job: Job | str, message: str, *, retry_in: float, lease_token: str | None = None
    ) -> float: ...

    def perm_fail(
        self, job: Job | str, message: str, *, lease_token: str | None = None
    ) -> None: ...

    def extend(
        self,
        job: Job | str,
        lock_for: float,
        *,
        lease_token: str | None = None,
        not_after: float | None = None,
    ) -> float: ...

    def release(
        self, job: Job | str, message: str = "released", *, lease_token: str | None = None
    ) -> None: ...

    def replace(
        self,
        job: Job | str,
        jobs: Iterable[JobSpec | tuple[str, Any]],
        *,
        lease_token: str | None = None,
    ) -> list[str]: ...

    def details(self, handle: str) -> JobDetails: ...

    def redrive(self, handle: str) -> None: ...

    def cancel(self, handle: str, message: str | None = None) -> str: ...

    def cancel_children(self, handle: str, message: str | None = None) -> list[str]: ...

    def pause(self, type: str) -> None: ...

    def resume(self, type: str) -> None: ...

    def controls(self) -> list[TypeControl]: ...

    def release_waiting(self) -> tuple[list[str], list[str]]: ...

    def migrate(self) -> list[str]: ...

    def gc(self, *, older_than: float | None = None) -> int: ...

    def stats(self, *, window: float = 60.0) -> list[dict[str, Any]]: ...

    def workers(self, *, within: float = 900.0) -> list[dict[str, Any]]: ...

    def wait_for_jobs(self, timeout: float) -> bool: ...

    def wakeup(self, *, min_poll: float = 0.002, max_poll: float = 0.1) -> Wakeup: ...

    def idle_wakeup(
        self,
        *,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        idle_wait: float = 0.5,
        channel: str | None = None,
    ) -> IdleWakeup: ...

    def forget_idle(self, channel: str) -> None: ...

    def close(self) -> None: ...
