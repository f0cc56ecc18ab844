"""The job API of seed 002: insert, grab with a lease, complete, temp/perm fail, details, replace.

The operations are written once, over an open transaction (``JobOps``); ``Database`` runs
each in a transaction of its own and ``Transaction`` inside the caller's.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from homing import ids
from homing.errors import (
    HomingError,
    InvalidArgument,
    InvalidState,
    JobCancelled,
    JobNotFound,
    JobTimedOut,
    StaleLease,
)
from homing.job_checks import (
    check_message,
    check_priority,
    check_seconds,
    check_type,
    check_types,
    check_unique_key,
    encode_args,
    encode_json,
    to_timestamp,
)
from homing.job_controls import control_cache
from homing.job_deps import WAIT_AT, check_after
from homing.job_deps import record as record_after
from homing.job_leases import MAX_LOCK_FOR_S, Leasing, default_worker_id
from homing.job_model import (
    Failure,
    FailureKind,
    Holder,
    Job,
    JobDetails,
    JobSpec,
    JobState,
)
from homing.store import job_controls_queries as cq
from homing.store import jobs_queries as q
from homing.store.protocol import Store, Tx

__all__ = [  # the job API's types and the input checks other parts use too
    "FailureKind",
    "Failure",
    "Holder",
    "Job",
    "JobDetails",
    "JobOps",
    "JobSpec",
    "JobState",
    "MAX_LOCK_FOR_S",
    "default_worker_id",
    "check_message",
    "check_priority",
    "check_seconds",
    "check_type",
    "check_types",
    "check_unique_key",
    "encode_args",
    "encode_json",
    "to_timestamp",
]

DEFAULT_MAX_ARGS_BYTES = 1024 * 1024
DEFAULT_RETENTION_S = 7 * 24 * 3600.0


def _state(row: dict[str, Any]) -> JobState:
    """The state the API reports: cancelled and waiting (for dependencies) apart."""
    if row["cancelled_at"] is not None:
        return "cancelled"
    if row["state"] == "ready" and row["run_at"] >= WAIT_AT:
        return "waiting"
    return row["state"]


def _spec(item: Any) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        return JobSpec(item[0], item[1])
    if isinstance(item, Mapping) and "type" in item:
        return JobSpec(**item)
    raise InvalidArgument(f"expected a JobSpec or a (type, args) tuple, got {item!r}")


_NO_LEASE = "00000000-0000-0000-0000-000000000000"


class JobOps(Leasing):
    """The job operations over an open transaction; handles carry ``shard`` when sharded."""

    def __init__(
        self, store: Store, *, shard: int | None, max_args_bytes: int, retention: float
    ) -> None:
        self.store = store
        self.shard = shard
        self.max_args_bytes = max_args_bytes
        self.retention = retention
        self._host = socket.gethostname()
        self.controls = control_cache(store)  # per-type controls, read at most every 0.5 s
        # (pid, worker id) -> (homing_holders.id, when registered by the store's clock)
        self._holders: dict[tuple[int, str], tuple[int, float]] = {}

    # handles -------------------------------------------------------------------------
    def id_of(self, handle: Any) -> str:
        if isinstance(handle, Job):
            if handle.handle is handle.id and self.shard is None:
                return handle.id  # as grab made it (a handle is the id itself when unsharded)
            handle = handle.handle
        if not isinstance(handle, str) or not handle:
            raise InvalidArgument(f"a job handle is a non-empty string, got {handle!r}")
        job_id = handle
        if ":" in handle:
            shard, _, job_id = handle.partition(":")
            if self.shard is None or shard != str(self.shard):
                raise JobNotFound(f"job handle {handle!r} names shard {shard}, not this store")
        elif self.shard is not None:
            raise JobNotFound(
                f"job handle {handle!r} names no shard; sharded handles look like 0:<id>"
            )
        if not ids.is_uuid(job_id):
            raise JobNotFound(f"{handle!r} is not a job handle (expected a UUID)")
        return job_id.lower()  # as the store gives ids back (PostgreSQL's uuid type)

    def _lease_of(self, job: Any, lease_token: str | None) -> tuple[str, str]:
        if isinstance(job, Job):
            return self.id_of(job), job.lease_token
        if lease_token is None:
            raise InvalidArgument("pass the Job returned by grab(), or a handle with lease_token=")
        if not isinstance(lease_token, str):
            raise InvalidArgument(f"lease_token must be a string, got {lease_token!r}")
        # A token that is no UUID was never given out (grab makes uuid7s): it holds no lease,
        # and is refused as stale like any other; PostgreSQL's uuid column could not even
        # compare it. The nil UUID stands in for it: no lease has it.
        token = lease_token.lower() if ids.is_uuid(lease_token) else _NO_LEASE
        return self.id_of(job), token

    # insert --------------------------------------------------------------------------
    def new_jobs(self, items: Iterable[Any], parent_id: str | None = None) -> list[q.NewJob]:
        now = self.store.clock.now()
        out = []
        limit = self.max_args_bytes
        if not isinstance(items, list | tuple):
            items = list(items)
        fresh = iter(ids.uuid7_many(len(items)))  # ids made in one go: one lock, one clock
        for item in items:
            after: tuple[str, ...] = ()
            if type(item) is tuple and len(item) == 2:  # (type, args): no JobSpec round
                name, args, priority, run_at, key, timeout = item[0], item[1], 0, now, None, None
            else:
                spec = _spec(item)
                if spec.after is not None:
                    after = check_after(self, spec.after)
                run_at = to_timestamp("run_at", spec.run_at, now)
                name, args, priority, key, timeout = (
                    spec.type, spec.args, spec.priority, spec.unique_key, spec.timeout
                )  # fmt: skip
            out.append(  # positional: keywords cost a measurable share of a batch insert
                q.NewJob(
                    next(fresh),
                    check_type(name),
                    encode_args(args, limit),
                    check_priority(priority),
                    WAIT_AT if after else run_at,
                    check_unique_key(key),
                    parent_id,
                    now,
                    None
                    if timeout is None
                    else check_seconds("timeout", timeout, allow_zero=False),
                    after,
                    run_at if after else None,
                )
            )
        return out

    def insert(self, tx: Tx, jobs: Sequence[q.NewJob]) -> list[str]:
        ids_ = q.insert_jobs(tx, jobs)
        if self.needs_transaction(jobs):  # timeouts, dependencies: of new jobs only (not
            new = set(ids_)  # one that existed already under its unique_key)
            timed = [(j.id, j.timeout_s) for j in jobs if j.timeout_s is not None]
            cq.set_timeouts(tx, [(i, t) for i, t in timed if i in new])
            record_after(tx, jobs, new)
        if self.shard is None:
            return ids_
        return [self.handle_of(i) for i in ids_]

    @staticmethod
    def needs_transaction(jobs: Sequence[q.NewJob]) -> bool:
        """True when an insert is more than one statement (a timeout, dependencies)."""
        return any(j.timeout_s is not None or j.after for j in jobs)

    # finishing -----------------------------------------------------------------------
    def _refuse(self, tx: Tx, job_id: str, token: str, action: str) -> None:
        """Explain why a leased operation did not apply, as an exception."""
        row = q.job_row(tx, job_id)
        handle = self.handle_of(job_id)
        if row is None:
            raise JobNotFound(
                f"no job {handle}: it never existed, or it finished and was garbage-collected"
            )
        if row["cancelled_at"] is not None:
            raise JobCancelled(
                f"cannot {action} job {handle}: it was cancelled at {row['cancelled_at']:.3f}; "
                "drop your work on it (nothing written in its transaction is kept)"
            )
        if row["lease_token"] == token and row["state"] == "ready":
            raise JobTimedOut(
                f"cannot {action} job {handle}: this attempt was ended (it ran past its "
                f"timeout, or was released) and the job waits for its next attempt; "
                "drop your work on it"
            )
        if row["lease_token"] == token:
            raise InvalidState(f"cannot {action} job {handle}: it is already {row['state']}")
        if row["state"] == "running":
            raise StaleLease(
                f"cannot {action} job {handle}: your lease is stale; the job is now held by "
                f"{row['holder_host']} pid {row['holder_pid']} ({row['holder_worker']}) until "
                f"{row['lease_expires_at']:.3f}. Drop your work on it: the new holder owns it"
            )
        if row["lease_token"] is None:
            raise InvalidState(
                f"cannot {action} job {handle}: it is {row['state']} and was never grabbed"
            )
        raise StaleLease(
            f"cannot {action} job {handle}: your lease is stale; the job was since taken by "
            f"another holder and is now {row['state']}"
        )

    def complete(self, tx: Tx, job: Any, lease_token: str | None) -> None:
        job_id, token = self._lease_of(job, lease_token)
        if q.finish(tx, job_id, token, state="done", now=self.store.clock.now(), error=None):
            return
        row = q.job_row(tx, job_id)
        if row is not None and row["lease_token"] == token and row["state"] == "done":
            return  # a retried complete by the same holder: already done, nothing to do
        self._refuse(tx, job_id, token, "complete")

    def complete_many(self, tx: Tx, jobs: Sequence[Any]) -> None:
        """Complete jobs in one statement per lease; all or none (the caller's transaction)."""
        by_token: dict[str, list[Any]] = {}
        for job in jobs:
            if not isinstance(job, Job):
                raise InvalidArgument(f"complete_many takes Job objects from grab, got {job!r}")
            by_token.setdefault(job.lease_token, []).append(job)
        now = self.store.clock.now()
        for token, group in by_token.items():
            ids_ = list(dict.fromkeys(self.id_of(j) for j in group))
            changed = sum(  # chunks: SQLite caps the number of bound variables
                q.finish_many(tx, ids_[i : i + 500], token, now=now)
                for i in range(0, len(ids_), 500)
            )
            if changed != len(ids_):
                for job in group:  # find and explain the one that did not apply
                    self.complete(tx, job, None)

    def complete_each(self, tx: Tx, jobs: Sequence[Any]) -> list[tuple[Job, HomingError]]:
        """Complete every job whose lease still holds, in one statement; return the others
        with the reason each was refused. Not all-or-none, unlike ``complete_many``."""
        for job in jobs:
            if not isinstance(job, Job):
                raise InvalidArgument(f"complete_each takes Job objects from grab, got {job!r}")
        pairs = [(self.id_of(j), j.lease_token) for j in jobs]
        done = q.finish_leased(tx, pairs, now=self.store.clock.now())
        refused: list[tuple[Job, HomingError]] = []
        for job, pair in zip(jobs, pairs, strict=True):
            if pair in done:
                continue
            try:  # explain it (or accept a repeat of a completion that already applied)
                self.complete(tx, job, None)
            except (StaleLease, InvalidState, JobNotFound) as exc:
                refused.append((job, exc))
        return refused

    def temp_fail(
        self, tx: Tx, job: Any, message: Any, retry_in: Any, lease_token: str | None
    ) -> float:
        job_id, token = self._lease_of(job, lease_token)
        text = check_message(message)
        delay = check_seconds("retry_in", retry_in, allow_zero=True)
        now = self.store.clock.now()
        if not q.reschedule(tx, job_id, token, run_at=now + delay, error=text):
            self._refuse(tx, job_id, token, "temp_fail")
        self._record(tx, job_id, "temp_fail", now, text)
        return now + delay

    def perm_fail(self, tx: Tx, job: Any, message: Any, lease_token: str | None) -> None:
        job_id, token = self._lease_of(job, lease_token)
        text = check_message(message)
        now = self.store.clock.now()
        if not q.finish(tx, job_id, token, state="failed", now=now, error=text):
            self._refuse(tx, job_id, token, "perm_fail")
        self._record(tx, job_id, "perm_fail", now, text)

    def release(self, tx: Tx, job: Any, message: str, lease_token: str | None = None) -> None:
        """Give a job back at once (a worker shutting down); the attempt is recorded."""
        job_id, token = self._lease_of(job, lease_token)
        now = self.store.clock.now()
        if not q.reschedule(tx, job_id, token, run_at=now, error=None):
            self._refuse(tx, job_id, token, "release")
        self._record(tx, job_id, "released", now, check_message(message))

    def _record(self, tx: Tx, job_id: str, kind: str, now: float, message: str) -> None:
        row = q.job_row(tx, job_id)
        assert row is not None
        q.add_failure(
            tx,
            job_id,
            attempt=row["attempts"],
            at=now,
            kind=kind,
            host=row["holder_host"],
            pid=row["holder_pid"],
            worker=row["holder_worker"],
            message=message,
        )

    def extend(
        self,
        tx: Tx,
        job: Any,
        lock_for: Any,
        lease_token: str | None,
        not_after: float | None = None,
    ) -> float:
        job_id, token = self._lease_of(job, lease_token)
        seconds = check_seconds("lock_for", lock_for, allow_zero=False, maximum=MAX_LOCK_FOR_S)
        until = self.store.clock.now() + seconds
        if not_after is not None:
            until = min(until, check_seconds("not_after", not_after, allow_zero=True))
        if not q.extend_lease(tx, job_id, token, until=until):
            self._refuse(tx, job_id, token, "extend")
        if isinstance(job, Job):
            job.lease_expires_at = until
        return until

    def replace(self, tx: Tx, job: Any, items: Iterable[Any], lease_token: str | None) -> list[str]:
        job_id, token = self._lease_of(job, lease_token)
        children = self.new_jobs(items, parent_id=job_id)
        if not q.finish(tx, job_id, token, state="done", now=self.store.clock.now(), error=None):
            self._refuse(tx, job_id, token, "replace")
        return self.insert(tx, children)

    def cancel(self, tx: Tx, handle: Any, message: Any = None) -> str:
        """Cancel a ready or running job; the state it was in ('cancelled' again: a no-op)."""
        job_id = self.id_of(handle)
        text = check_message("cancelled" if message is None else message)
        now = self.store.clock.now()
        previous = cq.cancel(tx, job_id, now=now, message=text)
        if previous is None:
            raise JobNotFound(
                f"no job {handle}: it never existed, or it finished and was garbage-collected"
            )
        if previous in ("done", "failed"):
            raise InvalidState(
                f"cannot cancel job {self.handle_of(job_id)}: it is already {previous}"
            )
        if previous != "cancelled":
            self._record(tx, job_id, "cancelled", now, text)
        return previous

    def cancel_children(self, tx: Tx, handle: Any, message: Any = None) -> list[str]:
        """Cancel every ready or running child of a (replaced) parent; their handles."""
        parent_id = self.id_of(handle)
        text = check_message("cancelled with its parent" if message is None else message)
        now = self.store.clock.now()
        cancelled = cq.cancel_children(tx, parent_id, now=now, message=text)
        for job_id in cancelled:
            self._record(tx, job_id, "cancelled", now, text)
        return [self.handle_of(i) for i in cancelled]

    def redrive(self, tx: Tx, handle: Any) -> None:
        job_id = self.id_of(handle)
        if not q.redrive(tx, job_id, now=self.store.clock.now()):
            row = q.job_row(tx, job_id)
            if row is None:
                raise JobNotFound(f"no job {handle}")
            state = "cancelled" if row["cancelled_at"] is not None else row["state"]
            raise InvalidState(f"only perm-failed jobs can be redriven; job {handle} is {state}")

    # reading -------------------------------------------------------------------------
    def details(self, tx: Tx, handle: Any) -> JobDetails:
        job_id = self.id_of(handle)
        row = q.job_row(tx, job_id)
        if row is None:
            raise JobNotFound(
                f"no job {handle}: it never existed, or it finished and was garbage-collected"
            )
        holder = None
        if row["state"] == "running":
            holder = Holder(row["holder_host"], row["holder_pid"], row["holder_worker"])
        return JobDetails(
            handle=self.handle_of(job_id),
            type=row["type"],
            args=row["args"],
            state=_state(row),
            priority=row["priority"],
            attempts=row["attempts"],
            run_at=row["run_at"],
            created_at=row["created_at"],
            finished_at=row["finished_at"],
            unique_key=row["unique_key"],
            holder=holder,
            lease_expires_at=row["lease_expires_at"] if row["state"] == "running" else None,
            last_error=row["last_error"],
            parent=self.handle_of(row["parent_id"]) if row["parent_id"] else None,
            failures=[Failure(**f) for f in q.failures(tx, job_id)],
            cancelled_at=row["cancelled_at"],
            timeout=row["timeout_s"],
        )
