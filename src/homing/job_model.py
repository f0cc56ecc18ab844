"""The job API's values: what ``grab`` hands out (``Job``), what ``insert_many`` takes
(``JobSpec``) and what ``details`` reports (``JobDetails`` with its ``Failure`` history)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

JobState = Literal["ready", "running", "done", "failed", "cancelled", "waiting"]
FailureKind = Literal["temp_fail", "perm_fail", "lease_expired", "released", "cancelled"]


@dataclass
class Job:
    """A job leased to the caller by ``grab``. Hand it back to complete / fail / extend."""

    handle: str
    id: str
    type: str
    args: Any
    priority: int
    attempts: int
    lease_token: str
    lease_expires_at: float
    run_at: float
    created_at: float
    unique_key: str | None = None
    timeout: float | None = None  # this job's own timeout (seconds), if it has one


@dataclass(frozen=True)
class JobSpec:
    """A job to insert: used by ``insert_many`` and ``replace`` (a ``(type, args)`` tuple works too)."""

    type: str
    args: Any = None
    priority: int = 0
    run_at: float | datetime | None = None
    unique_key: str | None = None
    timeout: float | None = None
    after: Sequence[str] | None = None  # handles of jobs that must be done first


@dataclass(frozen=True)
class Holder:
    host: str | None
    pid: int | None
    worker: str | None


@dataclass(frozen=True)
class Failure:
    at: float
    attempt: int
    kind: FailureKind
    host: str | None
    pid: int | None
    worker: str | None
    message: str


@dataclass(frozen=True)
class JobDetails:
    handle: str
    type: str
    args: Any
    state: JobState
    priority: int
    attempts: int
    run_at: float
    created_at: float
    finished_at: float | None
    unique_key: str | None
    holder: Holder | None
    lease_expires_at: float | None
    last_error: str | None
    parent: str | None
    failures: list[Failure] = field(default_factory=list)
    cancelled_at: float | None = None
    timeout: float | None = None

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)
