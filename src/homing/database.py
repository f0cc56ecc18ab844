"""``homing.connect``: the object the job API lives on, for one store or a sharded set."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

from homing import job_deps
from homing.clock import Clock
from homing.errors import ConfigurationError, HomingError, InvalidArgument
from homing.job_controls import plan_grab, read_controls
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
from homing.store import holders_queries as hq
from homing.store import jobs_queries as q
from homing.store import open_store
from homing.store.protocol import Store, Tx, Wakeup
from homing.store.wakeup import IdleWakeup


class _JobAPI:
    """The job API written once; subclasses say which transaction each call runs in."""

    _ops: JobOps

    def _tx(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def _stmt(self, *, durable: bool = True) -> AbstractContextManager[Tx]:
        """For operations that are one statement: no BEGIN/COMMIT round trips where it helps;
        ``durable=False`` for leases (see ``Store.statement``)."""
        return self._tx()

    def _may_find_jobs(self, types: Sequence[str]) -> bool:
        """False only when a grab of ``types`` is sure to find nothing (no write needed)."""
        return True

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

        ``idle_channel`` (from ``idle_wakeup()``) is for workers: when fewer than ``limit``
        jobs were found the caller is registered as idle in the same statement, so that the
        next insert wakes it (and only as many idle workers as it inserted jobs), instead of
        every worker; a grab that fills ``limit`` unregisters it.

        Paused types are left out; limited types are grabbed one type at a time under
        their limits, each in a transaction that holds the type's lock (see ``limit``)."""
        names = check_types(types)
        self._ops.check_grab(lock_for, limit, worker_id)
        if where is None and not self._may_find_jobs(names):
            return []
        controls = self._ops.controls.get()

        # A lease need not reach the disk by itself (Store.statement): losing it in a
        # power failure is its expiry; the completion that follows is durable.
        def grab_free(free: Sequence[str]) -> list[Job]:
            """Types without a control: one statement; the jobs made after its commit (on
            SQLite the write lock is not held while their args are parsed)."""
            with self._stmt(durable=False) as tx:
                grabbed = self._ops.lease_rows(
                    tx,
                    free,
                    lock_for=lock_for,
                    where=where,
                    limit=limit,
                    worker_id=worker_id,
                    idle_channel=idle_channel,
                )
            return self._ops.jobs_of(grabbed)

        if not controls:  # no type has a control: the one statement, as ever
            return grab_free(names)
        plan = plan_grab(controls, names)
        jobs = grab_free(plan.free) if plan.free else []
        for control in plan.limited:
            if len(jobs) >= limit:
                break
            with self._tx() as tx:
                jobs += self._ops.grab_limited(
                    tx,
                    control,
                    lock_for=lock_for,
                    where=where,
                    limit=limit - len(jobs),
                    worker_id=worker_id,
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
        with self._stmt(durable=False) as tx:
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
        self.dialect = tx.dialect

    @property
    def connection(self) -> Any:
        """Read at each use, not kept: taking it sets a savepoint the caller is in (see
        ``Tx.savepoint``), so that writes made through it are undone with the block."""
        return self.tx.connection

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

    def _stmt(self, *, durable: bool = True) -> AbstractContextManager[Tx]:
        return self.store.statement(durable=durable)

    def _may_find_jobs(self, types: Sequence[str]) -> bool:
        # On a single-writer store (SQLite) a grab takes the write lock, which every other
        # process's insert and completion then waits for (in SQLite's busy handler, which
        # sleeps); an idle poller's empty grabs held back the very producer it waited for.
        # A read first, outside any transaction, leaves the lock alone when there is nothing.
        store = self.store
        if store.capabilities.concurrent_writers or store.in_transaction() is not None:
            return True
        with store.transaction(write=False) as tx:
            return q.may_be_available(tx, types, now=store.clock.now())

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Open a transaction; homing calls and your own writes (``tx.connection``) commit together."""
        with self.store.transaction() as tx:
            yield Transaction(tx, self._ops)

    def bind(self, tx: Tx) -> Transaction:
        """The job API over a store transaction the caller already holds (a group commit
        that runs several callers' writes in one transaction hands each of them this)."""
        return Transaction(tx, self._ops)

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

    def workers(self, *, within: float = hq.WORKERS_WITHIN_S) -> list[dict[str, Any]]:
        """The workers (host, pid, worker id) that grabbed in the last ``within`` seconds
        or hold running jobs now: when each last renewed its registration (it does while it
        grabs, every 10 minutes at most) and how many jobs it holds. Most recent first."""
        with self.store.transaction(write=False) as tx:
            return hq.live_holders(tx, seen_after=self.store.clock.now() - within)

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
        (``idle_channel=``), which registers the worker as idle when it found fewer jobs
        than it asked for; an
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


def connect(
    url: str | Sequence[str],
    *,
    clock: Clock | None = None,
    durable: bool | None = None,
    max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
    retention: float = DEFAULT_RETENTION_S,
    migrate: bool = True,
    pool_size: int | None = None,
    previous_shards: int | None = None,
) -> Database | ShardedDatabase:
    """Open a homing store.

    ``url``: ``sqlite:///path.db`` (relative) or ``sqlite:////abs/path.db``;
    ``postgresql://user@host:5432/db`` (``?schema=NAME`` to keep homing in one schema);
    or a list of PostgreSQL URLs for a sharded store. ``durable=False`` trades the last
    commits on power loss for speed (SQLite ``synchronous=OFF``, PostgreSQL
    ``synchronous_commit=off``). Pending migrations are applied unless ``migrate=False``.
    ``previous_shards``: after appending shard URLs, the shard count before, while keys
    placed then may still live on their old shard (docs/jobs.md, "Adding a shard").
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
        if len(urls) == 1 and previous_shards is None:
            url = urls[0]
        else:
            from homing.sharding import open_sharded

            return open_sharded(
                urls,
                migrate=migrate,
                previous_shards=previous_shards,
                clock=clock,
                durable=durable,
                pool_size=pool_size,
                max_args_bytes=max_args_bytes,
                retention=retention,
            )
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


# At the end: the sharded store builds on Database and Transaction defined above.
from homing.sharding.database import ShardedDatabase  # noqa: E402
