"""``ShardedDatabase``: several PostgreSQL databases that behave like one job store.

- Placement: a job with a ``unique_key`` lives on the shard that rendezvous hashing picks
  for the key (``placement.py``), for plain inserts, ``insert_many`` and transactions alike
  (``transaction(unique_key=...)``); jobs without a key go round-robin to live shards.
- Health: a shard that cannot be reached is marked down by the first call that fails and
  skipped (grabs, unkeyed inserts) or refused at once (``StoreUnreachable``) until the
  prober sees it answer again (``health.py``).
- Atomicity: one shard's transaction is atomic; ``insert_many`` and ``complete_many`` that
  span shards hold every shard's transaction open and commit them only when every part
  applied, so a refusal anywhere changes nothing (only a crash between the commits could
  leave part of one call applied).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import datetime
from typing import Any, TypeVar

from homing.database import Database
from homing.errors import (
    ConfigurationError,
    CrossShardWrite,
    HomingError,
    InvalidArgument,
    StoreUnavailable,
    StoreUnreachable,
)
from homing.jobs import Job, JobDetails, JobSpec
from homing.sharding.features import ShardedJobFeatures
from homing.sharding.health import Prober, ShardHealth
from homing.sharding.placement import Placement
from homing.sharding.routing import ShardRouting, Spec
from homing.sharding.stats import merge_stats
from homing.sharding.transaction import ShardTransaction
from homing.store import holders_queries as hq
from homing.store import shard_queries
from homing.store.protocol import Wakeup
from homing.store.wakeup import AnyWakeup, IdleWakeup

log = logging.getLogger("homing.sharding")
T = TypeVar("T")


class ShardedDatabase(ShardRouting, ShardedJobFeatures):
    """Several PostgreSQL databases as one job store (seed 002: "the database scales
    horizontally"). Handles name their shard (``"2:<uuid>"``); the URL list's order is the
    shards' identity: add shards by appending URLs (see docs/jobs.md, "Adding a shard")."""

    def __init__(
        self,
        shards: list[Database],
        *,
        previous_shards: int | None = None,
        down: Iterable[tuple[int, BaseException]] = (),
        probe_every: float = 2.0,
        migrate_on_probe: bool = True,
    ) -> None:
        if not shards:
            raise ConfigurationError("a sharded store needs at least one URL")
        self.shards = shards
        self.placement = Placement(len(shards), previous_shards)
        self.health = [ShardHealth(i, _redact(s.url)) for i, s in enumerate(shards)]
        self._prober = Prober(self.health, self._probe, probe_every)
        self._migrate_on_probe = migrate_on_probe
        self._rr = itertools.count()
        self._grab_rr = itertools.count()
        self._lock = threading.Lock()
        for i, exc in down:
            self._mark_down(i, exc)

    # -- inserting ------------------------------------------------------------------------
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
        """A keyed job goes to its key's shard; a job with ``after`` to its dependencies'
        shard (they must share one); others to the next live shard (one that cannot be
        reached is skipped: nothing was sent to it)."""
        spec = JobSpec(type, args, priority, run_at, unique_key, timeout, after)
        kw: dict[str, Any] = {
            "priority": priority,
            "run_at": run_at,
            "unique_key": unique_key,
            "timeout": timeout,
            "after": after,
        }
        if (pinned := self._dependency_shard(spec)) is not None:
            self.shards[0]._ops.new_jobs([spec])
            return self._call(pinned, Database.insert, type, args, **kw)
        if unique_key is not None:
            self.shards[0]._ops.new_jobs([spec])
            if (found := self._moved(unique_key)) is not None:
                return found
            return self._call(self.placement.owner(unique_key), Database.insert, type, args, **kw)
        for _ in range(len(self.shards)):
            index = self._next_live(self._rr)
            try:
                return self._call(index, Database.insert, type, args, **kw)
            except StoreUnreachable:
                continue  # marked down; nothing was sent: the next live shard takes it
        raise StoreUnreachable("no shard could take the job: every shard failed to connect")

    def insert_many(self, jobs: Iterable[Spec]) -> list[str]:
        """All or none: every job is checked first, each shard's part is inserted in a
        transaction of that shard, and they commit together at the end."""
        specs = list(jobs)
        self.shards[0]._ops.new_jobs(specs)  # raises for bad input, before any write
        out: dict[int, str] = {}
        groups: dict[int, list[tuple[int, Spec]]] = {}
        for i, spec in enumerate(specs):
            key = spec.unique_key if isinstance(spec, JobSpec) else None
            pinned = self._dependency_shard(spec)
            if pinned is None and key is not None and (found := self._moved(key)) is not None:
                out[i] = found
                continue
            if pinned is not None:
                shard = pinned
            else:
                shard = self.placement.owner(key) if key is not None else self._next_live(self._rr)
            groups.setdefault(shard, []).append((i, spec))
        with ExitStack() as stack:
            for shard, items in sorted(groups.items()):
                db = stack.enter_context(self._on(shard))
                tx = stack.enter_context(db.transaction())
                handles = tx.insert_many([s for _, s in items])
                out.update({i: h for (i, _), h in zip(items, handles, strict=True)})
        return [out[i] for i in range(len(specs))]

    # -- grabbing -------------------------------------------------------------------------
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
        """Visit the live shards in rotation, starting one further each call, until
        ``limit`` jobs are leased. A shard that fails is marked down and skipped: what the
        other shards leased is returned, never stranded."""
        live = self._live()
        if not live:
            self._next_live(self._grab_rr)  # raises: every shard is down
        with self._lock:
            start = next(self._grab_rr)
        got: list[Job] = []
        failed: list[StoreUnavailable] = []
        for k in range(len(live)):
            index = live[(start + k) % len(live)]
            try:
                got += self._call(
                    index,
                    Database.grab_many,
                    types,
                    lock_for=lock_for,
                    limit=limit - len(got),
                    where=where,
                    worker_id=worker_id,
                    idle_channel=idle_channel,
                )
            except StoreUnavailable as exc:
                failed.append(exc)
                continue
            if len(got) >= limit:
                break
        if not got and len(failed) == len(live):
            raise StoreUnreachable(f"every live shard failed to answer a grab: {failed[-1]}")
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

    # -- finishing ------------------------------------------------------------------------
    def complete(self, job: Job | str, *, lease_token: str | None = None) -> None:
        self._call(self._index_of(job), Database.complete, job, lease_token=lease_token)

    def _by_shard(self, jobs: Iterable[Job]) -> dict[int, list[Job]]:
        groups: dict[int, list[Job]] = {}
        for job in jobs:
            if not isinstance(job, Job):
                raise InvalidArgument(f"takes Job objects from grab, got {job!r}")
            groups.setdefault(self._index_of(job), []).append(job)
        return groups

    def complete_many(self, jobs: Iterable[Job]) -> None:
        """All or none against refusals: each shard's part is completed in a transaction
        of that shard, and the transactions commit only when every part applied (a stale
        lease anywhere rolls back all of them). Only a crash between the shards' commits
        could leave one shard's part done; each job lives on one shard, so no job is ever
        completed twice."""
        with ExitStack() as stack:
            for shard, group in sorted(self._by_shard(jobs).items()):
                db = stack.enter_context(self._on(shard))
                stack.enter_context(db.transaction()).complete_many(group)

    def complete_each(self, jobs: Iterable[Job]) -> list[tuple[Job, HomingError]]:
        """Per shard, one statement (see ``Database.complete_each``); the jobs of a shard
        that cannot be reached come back refused with that error (their leases expire)."""
        refused: list[tuple[Job, HomingError]] = []
        for shard, group in self._by_shard(jobs).items():
            try:
                refused += self._call(shard, Database.complete_each, group)
            except StoreUnavailable as exc:
                refused += [(job, exc) for job in group]
        return refused

    def temp_fail(
        self, job: Job | str, message: str, *, retry_in: float, lease_token: str | None = None
    ) -> float:
        return float(
            self._call(
                self._index_of(job),
                Database.temp_fail,
                job,
                message,
                retry_in=retry_in,
                lease_token=lease_token,
            )
        )

    def perm_fail(self, job: Job | str, message: str, *, lease_token: str | None = None) -> None:
        self._call(self._index_of(job), Database.perm_fail, job, message, lease_token=lease_token)

    def extend(
        self,
        job: Job | str,
        lock_for: float,
        *,
        lease_token: str | None = None,
        not_after: float | None = None,
    ) -> float:
        return float(
            self._call(
                self._index_of(job),
                Database.extend,
                job,
                lock_for,
                lease_token=lease_token,
                not_after=not_after,
            )
        )

    def release(
        self, job: Job | str, message: str = "released", *, lease_token: str | None = None
    ) -> None:
        self._call(self._index_of(job), Database.release, job, message, lease_token=lease_token)

    def replace(
        self, job: Job | str, jobs: Iterable[Spec], *, lease_token: str | None = None
    ) -> list[str]:
        """Children go to the parent's shard, so the replace is one transaction; a child
        whose ``unique_key`` another shard owns is refused (``CrossShardWrite``)."""
        with self.transaction(shard=self._index_of(job)) as tx:
            return tx.replace(job, jobs, lease_token=lease_token)

    def details(self, handle: str) -> JobDetails:
        return self._call(self._index_of(handle), Database.details, handle)

    def redrive(self, handle: str) -> None:
        self._call(self._index_of(handle), Database.redrive, handle)

    # -- transactions ---------------------------------------------------------------------
    def transaction(
        self,
        shard: int | None = None,
        *,
        unique_key: str | None = None,
        shard_key: str | None = None,
    ) -> AbstractContextManager[ShardTransaction]:
        """A transaction on one shard: ``unique_key=`` the shard that owns that key (to
        insert the keyed job together with your own writes), ``shard_key=`` the shard any
        other string of yours hashes to (the same placement), ``shard=`` a shard by number,
        or none of them: the next live shard. Writes that belong to another shard raise
        ``CrossShardWrite``."""
        given = [a for a in (shard, unique_key, shard_key) if a is not None]
        if len(given) > 1:
            raise InvalidArgument("give at most one of shard, unique_key and shard_key")
        if shard is not None and (
            isinstance(shard, bool)
            or not isinstance(shard, int)
            or not 0 <= shard < len(self.shards)
        ):
            raise InvalidArgument(f"shard must be 0..{len(self.shards) - 1}, got {shard!r}")
        key = unique_key if unique_key is not None else shard_key
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(f"unique_key and shard_key must be strings, got {key!r}")
        if shard is None:
            shard = self.placement.owner(key) if key is not None else self._next_live(self._rr)
        return self._open_transaction(shard)

    @contextmanager
    def _open_transaction(self, shard: int) -> Iterator[ShardTransaction]:
        with self._on(shard) as db, db.store.transaction() as tx:
            yield ShardTransaction(
                tx, db._ops, shard=shard, owner=self.placement.owner, moved=self._moved
            )

    # -- the rest -------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Migrate every shard (a shard that cannot be reached is an error here)."""
        done = []
        for i in range(len(self.shards)):
            done += [f"shard {i}: {m}" for m in self._call(i, Database.migrate)]
            self.health[i].mark_up()
        return done

    def _each_live(self, fn: Any, *args: Any, **kwargs: Any) -> list[Any]:
        out = []
        for i in self._live():
            try:
                out.append(self._call(i, fn, *args, **kwargs))
            except StoreUnavailable as exc:
                log.warning("shard %d skipped: %s", i, exc)
        return out

    def workers(self, *, within: float = hq.WORKERS_WITHIN_S) -> list[dict[str, Any]]:
        """The workers of every live shard (each registers with each shard it grabs from):
        the jobs they hold added up, the latest registration kept."""
        merged: dict[tuple[str, int, str], dict[str, Any]] = {}
        for rows in self._each_live(Database.workers, within=within):
            for row in rows:
                key = (row["host"], row["pid"], row["worker"])
                m = merged.setdefault(key, {**row, "running": 0})
                m["running"] += row["running"]
                m["seen_at"] = max(m["seen_at"], row["seen_at"])
        return sorted(merged.values(), key=lambda r: -r["seen_at"])

    def gc(self, *, older_than: float | None = None) -> int:
        """Garbage-collect the live shards (a down shard is collected when it is back)."""
        return sum(self._each_live(Database.gc, older_than=older_than))

    def stats(self, *, window: float = 60.0) -> list[dict[str, Any]]:
        """Per job type, summed over the live shards."""
        return merge_stats(self._each_live(Database.stats, window=window))

    def misplaced_keys(self, *, page: int = 1000) -> dict[int, int]:
        """Per shard, how many retained jobs hold a ``unique_key`` that another shard owns
        now (after shards were added). When every count is 0, ``previous_shards`` may go."""
        counts: dict[int, int] = {}
        for i, db in enumerate(self.shards):
            after, n = "", 0
            while True:
                with self._on(i), db.store.transaction(write=False) as tx:
                    keys = shard_queries.unique_keys_page(tx, after, page)
                n += sum(1 for k in keys if self.placement.owner(k) != i)
                if len(keys) < page:
                    break
                after = keys[-1]
            counts[i] = n
        return counts

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
        self._each_live(Database.forget_idle, channel)

    def close(self) -> None:
        self._prober.stop()
        for s in self.shards:
            s.close()

    def __enter__(self) -> ShardedDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        states = ", ".join(f"{h.index}:{'up' if h.up else 'down'}" for h in self.health)
        return f"<homing.ShardedDatabase {len(self.shards)} shards ({states})>"


def _redact(url: str) -> str:
    import re

    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", url)


__all__ = ["CrossShardWrite", "ShardedDatabase"]
