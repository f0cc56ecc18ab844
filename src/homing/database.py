"""``homing.connect``: the object the job API lives on, for one store or a sharded set."""

from __future__ import annotations

import itertools
import secrets
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from homing import job_deps
from homing.clock import Clock
from homing.errors import ConfigurationError, HomingError, InvalidArgument, JobNotFound
from homing.job_controls import TypeControl, plan_grab, read_controls
from homing.job_type_admin import TypeAdmin
from homing.jobs import (
    DEFAULT_MAX_ARGS_BYTES,
    DEFAULT_RETENTION_S,
    Job,
    JobDetails,
    JobOps,
    JobSpec,
    check_seconds,
    check_types,
)
from homing.store import jobs_queries as q
from homing.store import open_store
from homing.store.protocol import Store, Tx, Wakeup
from homing.store.wakeup import AnyWakeup, IdleWakeup


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


class _JobAPI:
    """The job API written once; subclasses say which transaction each call runs in."""

    _ops: JobOps

    def _tx(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def _stmt(self) -> AbstractContextManager[Tx]:
        """For operations that are one statement: no BEGIN/COMMIT round trips where it helps."""
        return self._tx()

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
        """Store a job; return its handle. A repeated ``unique_key`` returns the first job's
        handle. ``timeout``: seconds an attempt may run; ``after``: handles of jobs that
        must be done before this one runs (see docs/jobs.md)."""
        spec = JobSpec(type, args, priority, run_at, unique_key, timeout, after)
        jobs = self._ops.new_jobs([spec])
        simple = timeout is None and after is None  # one statement
        with self._stmt() if simple else self._tx() as tx:
            return self._ops.insert(tx, jobs)[0]

    def insert_many(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> list[str]:
        """Store many jobs atomically (one statement on PostgreSQL); handles in input order."""
        new = self._ops.new_jobs(jobs)
        with self._tx() if self._ops.needs_transaction(new) else self._stmt() as tx:
            return self._ops.insert(tx, new)

    def grab(
        self,
        types: str | Sequence[str],
        *,
        lock_for: float,
        where: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> Job | None:
        """Lease one available job of ``types`` for ``lock_for`` seconds, or None."""
        jobs = self.grab_many(types, lock_for=lock_for, where=where, limit=1, worker_id=worker_id)
        return jobs[0] if jobs else None

    def grab_many(
        self,
        types: str | Sequence[str],
        *,
        lock_for: float,
        limit: int,
        where: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
        idle_channel: str | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` jobs atomically (one lease token for the batch).

        ``idle_channel`` (from ``idle_wakeup()``) is for workers: when nothing was found the
        caller is registered as idle in the same statement, so that the next insert wakes
        it (and only as many idle workers as it inserted jobs), instead of every worker.

        Paused types are left out; limited types are grabbed one type at a time under
        their limits, each in a transaction that holds the type's lock (see ``limit``)."""
        names = check_types(types)
        controls = self._ops.controls.get()
        if not controls:  # no type has a control: the one statement, as ever
            with self._stmt() as tx:
                return self._ops.grab(
                    tx,
                    names,
                    lock_for=lock_for,
                    where=where,
                    limit=limit,
                    worker_id=worker_id,
                    idle_channel=idle_channel,
                    checked=True,
                )
        plan = plan_grab(controls, names)
        jobs: list[Job] = []
        if plan.free:
            with self._stmt() as tx:
                jobs = self._ops.grab(
                    tx,
                    plan.free,
                    lock_for=lock_for,
                    where=where,
                    limit=limit,
                    worker_id=worker_id,
                    idle_channel=idle_channel,
                )
        for control in plan.limited:
            if len(jobs) >= limit:
                break
            with self._tx() as tx:
                jobs += self._ops.grab(
                    tx,
                    [control.type],
                    lock_for=lock_for,
                    where=where,
                    limit=limit - len(jobs),
                    worker_id=worker_id,
                    control=control,
                )
        return jobs

    def complete(self, job: Job | str, *, lease_token: str | None = None) -> None:
        """Mark the job done. Raises ``StaleLease`` if another holder has it now."""
        with self._stmt() as tx:
            self._ops.complete(tx, job, lease_token)

    def complete_many(self, jobs: Iterable[Job]) -> None:
        """Complete several jobs in one transaction: all or none."""
        with self._tx() as tx:
            self._ops.complete_many(tx, list(jobs))

    def complete_each(self, jobs: Iterable[Job]) -> list[tuple[Job, HomingError]]:
        """Complete each job whose lease still holds, in one statement (one round trip and
        one commit on PostgreSQL); return the refused ones with their errors (``StaleLease``
        and the like). Unlike ``complete_many`` it is not all-or-none: what it returns is
        exactly what was not completed."""
        with self._stmt() as tx:
            return self._ops.complete_each(tx, list(jobs))

    def temp_fail(
        self,
        job: Job | str,
        message: str,
        *,
        retry_in: float,
        lease_token: str | None = None,
    ) -> float:
        """Record a failure and make the job ready again in ``retry_in`` seconds; returns when."""
        with self._tx() as tx:
            return self._ops.temp_fail(tx, job, message, retry_in, lease_token)

    def perm_fail(self, job: Job | str, message: str, *, lease_token: str | None = None) -> None:
        """Record a failure and end the job (state ``failed``); ``redrive`` can revive it."""
        with self._tx() as tx:
            self._ops.perm_fail(tx, job, message, lease_token)

    def extend(
        self,
        job: Job | str,
        lock_for: float,
        *,
        lease_token: str | None = None,
        not_after: float | None = None,
    ) -> float:
        """Extend the lease to ``lock_for`` seconds from now, but not past ``not_after``
        (a store-clock time, e.g. the attempt's timeout); returns the new expiry."""
        with self._stmt() as tx:
            return self._ops.extend(tx, job, lock_for, lease_token, not_after)

    def release(
        self, job: Job | str, message: str = "released", *, lease_token: str | None = None
    ) -> None:
        """Hand a leased job back at once, recording the attempt (used on shutdown)."""
        with self._tx() as tx:
            self._ops.release(tx, job, message, lease_token)

    def replace(
        self,
        job: Job | str,
        jobs: Iterable[JobSpec | tuple[str, Any]],
        *,
        lease_token: str | None = None,
    ) -> list[str]:
        """Complete ``job`` and insert ``jobs`` in one transaction; returns the new handles."""
        with self._tx() as tx:
            return self._ops.replace(tx, job, jobs, lease_token)

    def details(self, handle: str) -> JobDetails:
        """Everything known about a job: args, state, attempts, holder, failure history."""
        with self._tx() as tx:
            return self._ops.details(tx, handle)

    def redrive(self, handle: str) -> None:
        """Run a perm-failed job again: ready now, attempts reset, history kept."""
        with self._tx() as tx:
            self._ops.redrive(tx, handle)

    def cancel(self, handle: str, message: str | None = None) -> str:
        """Cancel a job: a ready (or scheduled, or staged) job never runs; a running job's
        completion is refused (``JobCancelled``) and its worker tells the handler
        (``ctx.cancelled``; an async handler is cancelled). Returns the state the job was
        in; cancelling a cancelled job is a no-op; a done or perm-failed job raises
        ``InvalidState``. Recorded in the job's history."""
        with self._tx() as tx:
            return self._ops.cancel(tx, handle, message)

    def cancel_children(self, handle: str, message: str | None = None) -> list[str]:
        """Cancel every ready or running child of a replaced parent in one transaction;
        returns the handles cancelled."""
        with self._tx() as tx:
            return self._ops.cancel_children(tx, handle, message)


class Transaction(_JobAPI):
    """The job API inside the caller's transaction; ``connection`` is its DB-API connection."""

    def __init__(self, tx: Tx, ops: JobOps) -> None:
        self.tx = tx
        self._ops = ops
        self.connection = tx.connection
        self.dialect = tx.dialect

    def _tx(self) -> AbstractContextManager[Tx]:
        return nullcontext(self.tx)


class Database(TypeAdmin, _JobAPI):
    """A homing store: the job API plus transactions, migrations, stats and garbage collection."""

    def __init__(
        self,
        store: Store,
        *,
        shard: int | None = None,
        max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
        retention: float = DEFAULT_RETENTION_S,
    ) -> None:
        self.store = store
        self.shard = shard
        self._ops = JobOps(store, shard=shard, max_args_bytes=max_args_bytes, retention=retention)

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def dialect(self) -> str:
        return self.store.dialect

    @property
    def clock(self) -> Clock:
        return self.store.clock

    def _tx(self) -> AbstractContextManager[Tx]:
        return self.store.transaction()

    def _stmt(self) -> AbstractContextManager[Tx]:
        return self.store.statement()

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Open a transaction; homing calls and your own writes (``tx.connection``) commit together."""
        with self.store.transaction() as tx:
            yield Transaction(tx, self._ops)

    def migrate(self) -> list[str]:
        return self.store.migrate()

    def gc(self, *, older_than: float | None = None) -> int:
        """Delete jobs finished more than ``older_than`` seconds ago (default: the retention)."""
        keep = (
            self._ops.retention
            if older_than is None
            else check_seconds("older_than", older_than, allow_zero=True)
        )
        with self.store.transaction() as tx:
            return q.gc(tx, finished_before=self.store.clock.now() - keep)

    def stats(self, *, window: float = 60.0) -> list[dict[str, Any]]:
        """Per job type: counts by state (``cancelled`` apart from ``failed``), the oldest due
        job's age, completions per second, and whether the type is ``paused``."""
        with self.store.transaction(write=False) as tx:
            rows = q.stats(tx, now=self.store.clock.now(), window=window)
            paused = {c.type for c in read_controls(tx).values() if c.paused}
        for row in rows:
            row["paused"] = row["type"] in paused
        return rows

    def wait_for_jobs(self, timeout: float) -> bool:
        """Block until new jobs are announced (PostgreSQL NOTIFY) or ``timeout`` passes."""
        return self.store.wait_for_notification(q.JOBS_CHANNEL, timeout)

    def wakeup(self, *, min_poll: float = 0.002, max_poll: float = 0.1) -> Wakeup:
        """A waiter for new jobs: NOTIFY on PostgreSQL, a back-off poll on SQLite."""
        return self.store.wakeup(q.JOBS_CHANNEL, min_poll=min_poll, max_poll=max_poll)

    def idle_wakeup(
        self,
        *,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        idle_wait: float = 0.5,
        channel: str | None = None,
    ) -> IdleWakeup:
        """A worker's waiter that is woken alone: pass its ``channel`` to ``grab_many``
        (``idle_channel=``), which registers the worker as idle when it found nothing; an
        insert then wakes as many idle workers as it inserted jobs, not every one. Between
        wake-ups it still looks now and then (from ``idle_wait / 10``, doubling to ``idle_wait``), which
        bounds what a registration racing an insert can cost. On SQLite: a back-off poll."""
        if not self.store.capabilities.notifications:
            return IdleWakeup(None, self.wakeup(min_poll=min_poll, max_poll=max_poll))
        channel = channel or f"homing_jobs_w_{secrets.token_hex(6)}"
        return IdleWakeup(
            channel, self.store.wakeup(channel), first=idle_wait / 10, longest=idle_wait
        )

    def forget_idle(self, channel: str) -> None:
        """Unregister an idle worker's channel (at its shutdown)."""
        with self.store.statement() as tx:
            q.forget_idle(tx, channel)

    def release_waiting(self) -> tuple[list[str], list[str]]:
        """Release the jobs whose dependencies (``after=``) are all done, and cancel those
        with a failed one; the handles (released, cancelled). Workers do this every 0.5 s."""
        return job_deps.sweep(self.store, self._ops)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<homing.Database {self.store.dialect} {self.store.url}>"


class ShardedDatabase:
    """Several PostgreSQL databases as one job store (seed 002: "the database scales
    horizontally"). Handles name their shard (``"2:<uuid>"``); the list order of the URLs is
    the shard identity and must not change. Jobs with a ``unique_key`` go to the shard its
    hash picks, so deduplication holds; others are spread round-robin. Grabs visit the
    shards in rotation, starting one further each call, so no shard starves. A transaction
    spans one shard; ``insert_many`` is atomic per shard, not across shards."""

    def __init__(self, shards: list[Database]) -> None:
        if not shards:
            raise ConfigurationError("a sharded store needs at least one URL")
        self.shards = shards
        self._rr = itertools.count()
        self._grab_rr = itertools.count()
        self._lock = threading.Lock()

    @property
    def dialect(self) -> str:
        return self.shards[0].dialect

    def _next(self, counter: itertools.count[int]) -> int:
        with self._lock:
            return next(counter) % len(self.shards)

    def shard_for_key(self, key: str) -> int:
        return zlib.crc32(key.encode()) % len(self.shards)

    def _shard_of_spec(self, spec: JobSpec | tuple[str, Any]) -> int:
        if isinstance(spec, JobSpec) and spec.after and not isinstance(spec.after, str):
            shards = {self.shards.index(self._by_handle(h)) for h in spec.after}
            if len(shards) > 1:
                raise InvalidArgument(
                    "the dependencies of one job (after=) must be on one shard, where the job "
                    f"goes too; these are on shards {sorted(shards)}: insert them on one shard "
                    "(db.shards[i].insert) or chain them"
                )
            return shards.pop()
        if isinstance(spec, JobSpec) and spec.unique_key is not None:
            return self.shard_for_key(spec.unique_key)
        return self._next(self._rr)

    def _by_handle(self, handle: Any) -> Database:
        if isinstance(handle, Job):
            handle = handle.handle
        if not isinstance(handle, str) or ":" not in handle:
            raise JobNotFound(f"{handle!r} is not a sharded job handle (they look like 0:<id>)")
        prefix = handle.split(":", 1)[0]
        if not prefix.isdigit() or int(prefix) >= len(self.shards):
            raise JobNotFound(f"job handle {handle!r} names shard {prefix}, which this store lacks")
        return self.shards[int(prefix)]

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
        """A job with ``after`` goes to its first dependency's shard; every dependency must
        be on that shard (``JobNotFound`` otherwise)."""
        spec = JobSpec(type, args, priority, run_at, unique_key, timeout, after)
        return self.shards[self._shard_of_spec(spec)].insert(
            type,
            args,
            priority=priority,
            run_at=run_at,
            unique_key=unique_key,
            timeout=timeout,
            after=after,
        )

    def insert_many(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> list[str]:
        """Atomic per shard. Every job is checked before any shard is written, so bad input
        writes nothing anywhere."""
        specs = list(jobs)
        self.shards[0]._ops.new_jobs(specs)  # raises for bad input, before any write
        groups: dict[int, list[tuple[int, JobSpec | tuple[str, Any]]]] = {}
        for i, spec in enumerate(specs):
            groups.setdefault(self._shard_of_spec(spec), []).append((i, spec))
        out: dict[int, str] = {}
        for shard, items in groups.items():
            handles = self.shards[shard].insert_many([s for _, s in items])
            out.update({i: h for (i, _), h in zip(items, handles, strict=True)})
        return [out[i] for i in range(len(out))]

    def grab_many(
        self,
        types: str | Sequence[str],
        *,
        lock_for: float,
        limit: int,
        where: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
        idle_channel: str | None = None,
    ) -> list[Job]:
        start = self._next(self._grab_rr)
        got: list[Job] = []
        for k in range(len(self.shards)):
            shard = self.shards[(start + k) % len(self.shards)]
            got += shard.grab_many(
                types,
                lock_for=lock_for,
                limit=limit - len(got),
                where=where,
                worker_id=worker_id,
                idle_channel=idle_channel,
            )
            if len(got) >= limit:
                break
        return got

    def grab(
        self,
        types: str | Sequence[str],
        *,
        lock_for: float,
        where: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> Job | None:
        jobs = self.grab_many(types, lock_for=lock_for, limit=1, where=where, worker_id=worker_id)
        return jobs[0] if jobs else None

    def complete(self, job: Job | str, *, lease_token: str | None = None) -> None:
        self._by_handle(job).complete(job, lease_token=lease_token)

    def complete_many(self, jobs: Iterable[Job]) -> None:
        """All or none against refusals: each shard's part is completed in a transaction
        of that shard, and the transactions commit only when every part applied (a stale
        lease anywhere rolls back all of them). Only a crash between the shards' commits
        could leave one shard's part done; each job lives on one shard, so no job is ever
        completed twice."""
        groups: dict[int, list[Job]] = {}
        for job in jobs:
            if not isinstance(job, Job):
                raise InvalidArgument(f"complete_many takes Job objects from grab, got {job!r}")
            groups.setdefault(self.shards.index(self._by_handle(job)), []).append(job)
        with ExitStack() as stack:
            for shard, group in sorted(groups.items()):
                stack.enter_context(self.shards[shard].transaction()).complete_many(group)

    def complete_each(self, jobs: Iterable[Job]) -> list[tuple[Job, HomingError]]:
        """Per shard, one statement; see ``Database.complete_each``."""
        groups: dict[int, list[Job]] = {}
        for job in jobs:
            groups.setdefault(self.shards.index(self._by_handle(job)), []).append(job)
        refused: list[tuple[Job, HomingError]] = []
        for shard, group in groups.items():
            refused += self.shards[shard].complete_each(group)
        return refused

    def temp_fail(
        self, job: Job | str, message: str, *, retry_in: float, lease_token: str | None = None
    ) -> float:
        return self._by_handle(job).temp_fail(
            job, message, retry_in=retry_in, lease_token=lease_token
        )

    def perm_fail(self, job: Job | str, message: str, *, lease_token: str | None = None) -> None:
        self._by_handle(job).perm_fail(job, message, lease_token=lease_token)

    def extend(
        self,
        job: Job | str,
        lock_for: float,
        *,
        lease_token: str | None = None,
        not_after: float | None = None,
    ) -> float:
        return self._by_handle(job).extend(
            job, lock_for, lease_token=lease_token, not_after=not_after
        )

    def release(
        self, job: Job | str, message: str = "released", *, lease_token: str | None = None
    ) -> None:
        self._by_handle(job).release(job, message, lease_token=lease_token)

    def replace(
        self,
        job: Job | str,
        jobs: Iterable[JobSpec | tuple[str, Any]],
        *,
        lease_token: str | None = None,
    ) -> list[str]:
        """Children go to the parent's shard, so the replace is one transaction."""
        return self._by_handle(job).replace(job, jobs, lease_token=lease_token)

    def details(self, handle: str) -> JobDetails:
        return self._by_handle(handle).details(handle)

    def redrive(self, handle: str) -> None:
        self._by_handle(handle).redrive(handle)

    def cancel(self, handle: str, message: str | None = None) -> str:
        return self._by_handle(handle).cancel(handle, message)

    def cancel_children(self, handle: str, message: str | None = None) -> list[str]:
        """Children live on their parent's shard: one transaction there."""
        return self._by_handle(handle).cancel_children(handle, message)

    def pause(self, type: str) -> None:
        """Paused on every shard (each shard's grabbers honour it within a second)."""
        for s in self.shards:
            s.pause(type)

    def resume(self, type: str) -> None:
        for s in self.shards:
            s.resume(type)

    def limit(self, type: str, **limits: Any) -> TypeControl:
        """Refused: a limit is enforced inside one store (its count and its lock), and
        shards do not share them, so no global limit can hold across shards."""
        raise ConfigurationError(
            "limits (max_running, rate, per_key) cannot be enforced across the shards of a "
            "sharded store: each shard counts only its own jobs. Put limited job types on "
            "one store (homing.connect(url)), or divide the limit among the shards yourself "
            "with shard.limit() on each of db.shards"
        )

    def controls(self) -> list[TypeControl]:
        """Shard 0's controls (pause and resume write every shard)."""
        return self.shards[0].controls()

    def schedules(self) -> list[dict[str, Any]]:
        """Periodic schedules live on shard 0 (see docs/jobs.md)."""
        return self.shards[0].schedules()

    def release_waiting(self) -> tuple[list[str], list[str]]:
        released: list[str] = []
        cancelled: list[str] = []
        for s in self.shards:
            r, c = s.release_waiting()
            released += r
            cancelled += c
        return released, cancelled

    def transaction(self, shard: int = 0) -> AbstractContextManager[Transaction]:
        if (
            isinstance(shard, bool)
            or not isinstance(shard, int)
            or not 0 <= shard < len(self.shards)
        ):
            raise InvalidArgument(f"shard must be 0..{len(self.shards) - 1}, got {shard!r}")
        return self.shards[shard].transaction()

    def migrate(self) -> list[str]:
        return [f"shard {i}: {m}" for i, s in enumerate(self.shards) for m in s.migrate()]

    def gc(self, *, older_than: float | None = None) -> int:
        return sum(s.gc(older_than=older_than) for s in self.shards)

    def stats(self, *, window: float = 60.0) -> list[dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {}
        for s in self.shards:
            for row in s.stats(window=window):
                m = merged.setdefault(
                    row["type"],
                    {
                        **row,
                        "ready": 0,
                        "scheduled": 0,
                        "staged": 0,
                        "running": 0,
                        "expired": 0,
                        "done": 0,
                        "failed": 0,
                        "cancelled": 0,
                        "waiting": 0,
                        "paused": False,
                        "done_per_s": 0.0,
                        "oldest_ready_age_s": None,
                    },
                )
                for k in (
                    "ready",
                    "scheduled",
                    "staged",
                    "running",
                    "done",
                    "failed",
                    "cancelled",
                    "waiting",
                    "done_per_s",
                ):
                    m[k] += row[k]
                m["paused"] = m["paused"] or row["paused"]
                ages = [
                    a for a in (m["oldest_ready_age_s"], row["oldest_ready_age_s"]) if a is not None
                ]
                m["oldest_ready_age_s"] = max(ages) if ages else None
        return [merged[k] for k in sorted(merged)]

    def wait_for_jobs(self, timeout: float) -> bool:
        """Wake on an announcement from any shard (polled every 10 ms across shards)."""
        deadline = time.monotonic() + timeout
        while True:
            if any(s.wait_for_jobs(0) for s in self.shards):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.shards[0].wait_for_jobs(min(0.01, remaining)):
                return True

    def wakeup(self, *, min_poll: float = 0.002, max_poll: float = 0.1) -> Wakeup:
        """Wakes on new jobs of any shard."""
        return AnyWakeup([s.wakeup(min_poll=min_poll, max_poll=max_poll) for s in self.shards])

    def idle_wakeup(
        self,
        *,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        idle_wait: float = 0.5,
        channel: str | None = None,
    ) -> IdleWakeup:
        """One channel, registered on every shard (see ``Database.idle_wakeup``)."""
        channel = channel or f"homing_jobs_w_{secrets.token_hex(6)}"
        waits = [
            s.idle_wakeup(
                min_poll=min_poll, max_poll=max_poll, idle_wait=idle_wait, channel=channel
            )
            for s in self.shards
        ]
        return IdleWakeup(channel, AnyWakeup(waits))

    def forget_idle(self, channel: str) -> None:
        for s in self.shards:
            s.forget_idle(channel)

    def close(self) -> None:
        for s in self.shards:
            s.close()

    def __enter__(self) -> ShardedDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    url: str | Sequence[str],
    *,
    clock: Clock | None = None,
    durable: bool | None = None,
    max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
    retention: float = DEFAULT_RETENTION_S,
    migrate: bool = True,
    pool_size: int | None = None,
) -> Database | ShardedDatabase:
    """Open a homing store.

    ``url``: ``sqlite:///path.db`` (relative) or ``sqlite:////abs/path.db``;
    ``postgresql://user@host:5432/db`` (``?schema=NAME`` to keep homing in one schema);
    or a list of PostgreSQL URLs for a sharded store. ``durable=False`` trades the last
    commits on power loss for speed (SQLite ``synchronous=OFF``, PostgreSQL
    ``synchronous_commit=off``). Pending migrations are applied unless ``migrate=False``.
    """
    if (
        isinstance(max_args_bytes, bool)
        or not isinstance(max_args_bytes, int)
        or max_args_bytes < 2
    ):
        raise InvalidArgument(f"max_args_bytes must be a positive integer, got {max_args_bytes!r}")
    retention = check_seconds("retention", retention, allow_zero=True)
    if isinstance(url, list | tuple):
        urls = list(url)
        if not urls:
            raise ConfigurationError("connect() got an empty list of URLs")
        if len(urls) == 1:
            url = urls[0]
        else:
            dbs = []
            try:
                for i, u in enumerate(urls):
                    store = open_store(u, clock=clock, durable=durable, pool_size=pool_size)
                    if not store.capabilities.concurrent_writers:  # a single-writer file
                        store.close()
                        raise ConfigurationError(
                            f"shards must be PostgreSQL databases; {u!r} is not"
                        )
                    db = Database(
                        store, shard=i, max_args_bytes=max_args_bytes, retention=retention
                    )
                    dbs.append(db)
                    if migrate:
                        db.migrate()
            except BaseException:
                for db in dbs:
                    db.close()
                raise
            return ShardedDatabase(dbs)
    if not isinstance(url, str):
        raise ConfigurationError(f"connect() takes a URL string or a list of them, got {url!r}")
    store = open_store(url, clock=clock, durable=durable, pool_size=pool_size)
    db = Database(store, max_args_bytes=max_args_bytes, retention=retention)
    if migrate:
        try:
            db.migrate()
        except BaseException:
            db.close()
            raise
    return db
