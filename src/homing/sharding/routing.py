"""Which shard a call goes to, and what happens when it fails: placement by unique key,
round-robin over the live shards, handles that name their shard, a shard marked down by
the first call that fails (``ShardedDatabase`` builds on this)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from homing.database import Database
from homing.errors import (
    CrossShardWrite,
    InvalidArgument,
    JobNotFound,
    StoreUnavailable,
    StoreUnreachable,
)
from homing.jobs import Job, JobSpec
from homing.sharding.health import Prober, ShardHealth
from homing.sharding.placement import Placement
from homing.sharding.transaction import shard_of_handle
from homing.store import shard_queries

Spec = JobSpec | tuple[str, Any]


class ShardRouting:
    """Placement and health of the shards; the attributes are set by ``ShardedDatabase``."""

    shards: list[Database]
    placement: Placement
    health: list[ShardHealth]
    _prober: Prober
    _migrate_on_probe: bool
    _lock: threading.Lock

    @property
    def dialect(self) -> str:
        return self.shards[0].dialect

    def shard_for_key(self, key: str) -> int:
        """The shard that holds jobs with this ``unique_key`` (and ``transaction(shard_key=)``)."""
        return self.placement.owner(key)

    def live_shards(self) -> list[Database]:
        return [s for s, h in zip(self.shards, self.health, strict=True) if h.up]

    def _live(self) -> list[int]:
        return [h.index for h in self.health if h.up]

    def _mark_down(self, index: int, exc: BaseException) -> None:
        self.health[index].mark_down(exc)
        self._prober.wake()

    def _probe(self, index: int) -> None:
        if self._migrate_on_probe:
            self.shards[index].migrate()  # a cheap version check; applies what it missed
        else:
            self.shards[index].stats(window=1.0)

    @contextmanager
    def _on(self, index: int) -> Iterator[Database]:
        """Use shard ``index``: refused at once while it is down; marked down if it fails."""
        self.health[index].check()
        try:
            yield self.shards[index]
        except StoreUnavailable as exc:
            # an error from another shard (looked up inside this one's transaction) is
            # that shard's: it was tagged when it passed through its own _on or check()
            if getattr(exc, "homing_shard", index) == index:
                exc.homing_shard = index  # type: ignore[attr-defined]
                self._mark_down(index, exc)
            raise

    def _call(self, index: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with self._on(index) as db:
            return fn(db, *args, **kwargs)

    def _next_live(self, counter: itertools.count[int]) -> int:
        live = self._live()
        if not live:
            raise StoreUnreachable(
                f"all {len(self.shards)} shards are down: "
                + "; ".join(f"{h.index}: {h.error}" for h in self.health)
            )
        with self._lock:
            return live[next(counter) % len(live)]

    def _index_of(self, handle: Any) -> int:
        if isinstance(handle, Job):
            handle = handle.handle
        if not isinstance(handle, str) or ":" not in handle:
            raise JobNotFound(f"{handle!r} is not a sharded job handle (they look like 0:<id>)")
        prefix = shard_of_handle(handle)
        if not prefix.isdigit() or int(prefix) >= len(self.shards):
            raise JobNotFound(f"job handle {handle!r} names shard {prefix}, which this store lacks")
        return int(prefix)

    def _dependency_shard(self, spec: Spec) -> int | None:
        """The shard of a job's dependencies (``after``): a job waits on one shard, where
        they all are; ``None`` for a job without dependencies."""
        if not isinstance(spec, JobSpec) or not spec.after or isinstance(spec.after, str):
            return None
        shards = {self._index_of(h) for h in spec.after}
        if len(shards) > 1:
            raise InvalidArgument(
                "the dependencies of one job (after=) must be on one shard, where the job "
                f"goes too; these are on shards {sorted(shards)}: insert them on one shard "
                "(db.shards[i].insert, or db.transaction(shard=i)) or chain them"
            )
        shard = shards.pop()
        key = spec.unique_key
        if key is not None and self.placement.owner(key) != shard:
            raise CrossShardWrite(
                f"unique_key {key!r} belongs to shard {self.placement.owner(key)}, but the "
                f"job's dependencies (after=) are on shard {shard}: a job with dependencies "
                "lives on their shard; drop the key or pick one that shard owns"
            )
        return shard

    def _moved(self, key: str) -> str | None:
        """While shards are being added (``previous_shards``): the handle of a retained job
        with ``key`` on the key's old shard, if there is one."""
        old = self.placement.previous_owner(key)
        if old is None:
            return None
        with self._on(old) as db, db.store.transaction(write=False) as tx:
            found = shard_queries.job_ids_by_key(tx, [key])
        return f"{old}:{found[key]}" if key in found else None
