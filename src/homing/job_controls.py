"""Per-type controls of the job queue: pause, a global concurrency limit, a global rate
limit and per-key concurrency, enforced in the store; and cancel.

The controls live in ``homing_job_types``. A grabber reads that (small) table at most
every ``ControlCache.refresh_every`` seconds, so a type with no control costs its grab a
dictionary lookup, and a change is honoured by every process within that time. Grabs of a
limited type take a per-type lock in the store (an advisory lock on PostgreSQL, the write
lock on SQLite), count what runs, and take at most what the limits leave: two processes
never exceed a limit, whatever their number or host.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from homing.errors import InvalidArgument
from homing.store import job_controls_queries as cq
from homing.store import jobs_queries as q
from homing.store.protocol import Store, Tx

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class TypeControl:
    """One job type's controls (None: not set)."""

    type: str
    paused: bool = False
    max_running: int | None = None
    rate_limit: int | None = None
    rate_per: float | None = None
    key_field: str | None = None
    key_limit: int | None = None

    @property
    def limited(self) -> bool:
        return (
            self.max_running is not None
            or self.rate_limit is not None
            or self.key_field is not None
        )

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _control(row: dict[str, Any]) -> TypeControl:
    return TypeControl(
        type=str(row["type"]),
        paused=bool(row["paused"]),
        max_running=row["max_running"],
        rate_limit=row["rate_limit"],
        rate_per=row["rate_per"],
        key_field=row["key_field"],
        key_limit=row["key_limit"],
    )


def read_controls(tx: Tx) -> dict[str, TypeControl]:
    return {str(r["type"]): _control(r) for r in cq.read_controls(tx)}


class ControlCache:
    """The controls of one store as this process last read them (at most
    ``refresh_every`` seconds ago)."""

    refresh_every = 0.5

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._controls: dict[str, TypeControl] = {}
        self._read_at = -1e18

    def get(self) -> dict[str, TypeControl]:
        if time.monotonic() - self._read_at < self.refresh_every:
            return self._controls
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_every:
                with self._store.transaction(write=False) as tx:
                    self._controls = read_controls(tx)
                self._read_at = time.monotonic()
        return self._controls

    def invalidate(self) -> None:
        self._read_at = -1e18


_CACHES: weakref.WeakKeyDictionary[Any, ControlCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def control_cache(store: Store) -> ControlCache:
    cache = _CACHES.get(store)
    if cache is None:
        with _CACHES_LOCK:
            cache = _CACHES.get(store)
            if cache is None:
                cache = _CACHES[store] = ControlCache(store)
    return cache


@dataclass(frozen=True)
class GrabPlan:
    free: list[str]  # types grabbed as usual (no limit), paused ones left out
    limited: list[TypeControl]  # types grabbed one by one under their limits


def plan_grab(controls: dict[str, TypeControl], names: list[str]) -> GrabPlan:
    """Which of ``names`` to grab as usual, which under limits (paused ones: neither)."""
    free, limited = [], []
    for name in names:
        control = controls.get(name)
        if control is None:
            free.append(name)
        elif control.paused:
            continue
        elif control.limited:
            limited.append(control)
        else:
            free.append(name)
    return GrabPlan(free, limited)


def limited_grab(
    tx: Tx,
    control: TypeControl,
    *,
    now: float,
    lease: q.Lease,
    limit: int,
    where: Any,
) -> list[dict[str, Any]]:
    """Grab up to ``limit`` jobs of one limited type in the caller's transaction, holding
    the type's lock: never more running than ``max_running``, never more grabs than
    ``rate_limit`` per ``rate_per`` seconds, never more than ``key_limit`` running per
    value of ``args.<key_field>``."""
    type_ = control.type
    cq.lock_type(tx, type_)
    slots = limit
    if control.max_running is not None:
        slots = min(slots, control.max_running - cq.running_count(tx, type_, now=now))
    if control.rate_limit is not None and control.rate_per is not None:
        used = cq.rate_used(tx, type_, now=now, per=control.rate_per)
        slots = min(slots, control.rate_limit - used)
    if slots <= 0:
        return []
    if control.key_field is None:
        rows = q.grab_jobs(tx, [type_], now=now, lease=lease, limit=slots, where=where)
    else:
        rows = _grab_by_key(tx, control, now=now, lease=lease, slots=slots, where=where)
    if rows and control.rate_limit is not None:
        cq.record_starts(tx, type_, now=now, count=len(rows))
    return rows


def _grab_by_key(
    tx: Tx, control: TypeControl, *, now: float, lease: q.Lease, slots: int, where: Any
) -> list[dict[str, Any]]:
    """One job at a time, leaving out the keys that are at their limit (jobs without the
    field are not limited by key)."""
    field, k = control.key_field, control.key_limit or 1
    assert field is not None
    full = list(cq.saturated_keys(tx, control.type, field, k, now=now))
    rows: list[dict[str, Any]] = []
    while len(rows) < slots:
        got = q.grab_jobs(
            tx,
            [control.type],
            now=now,
            lease=lease,
            limit=1,
            where=where,
            extra=cq.exclude_keys(tx, field, full),
        )
        if not got:
            break
        rows += got
        key = cq.key_of(tx, got[0]["id"], field)
        if key is not None and cq.running_with_key(tx, control.type, field, key, now=now) >= k:
            full.append(key)  # counting the job just leased
    return rows


def check_field(name: Any) -> str:
    if not isinstance(name, str) or not _FIELD.match(name):
        raise InvalidArgument(
            f"per-key limits name a top-level args field of letters, digits and '_' "
            f"(for example 'user_id'), got {name!r}"
        )
    return name


def check_count(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise InvalidArgument(f"{name} must be an integer >= 0, got {value!r}")
    return value


def cancelled_among(store: Store, job_ids: Sequence[str]) -> set[str]:
    if not job_ids:
        return set()
    with store.transaction(write=False) as tx:
        return cq.cancelled_among(tx, list(job_ids))
