"""Periodic jobs: cron schedules that insert exactly one job per tick.

A schedule is a row in ``homing_schedules`` with its last tick. A scheduler (every worker
whose app has schedules runs one) locks the row, computes the ticks due since the last one
with croniter (time zones through ``zoneinfo``, so DST is croniter's, not ours), inserts
their jobs with a unique key per tick (``schedule:<name>:<tick>``) and advances the last
tick, in one transaction. Two schedulers at the same tick are serialised by the row lock
and deduplicated by the key; a scheduler killed before its commit leaves nothing, and the
next one (or the same one restarted) inserts that tick: exactly one job per tick.

Ticks missed while no scheduler ran are handled by the schedule's ``missed`` policy:

- ``"once"`` (default): all missed ticks together give one job (for the latest of them);
- ``"all"``: one job per missed tick, oldest first (at most 1000 per pass, the rest in
  the next passes);
- ``"skip"``: missed ticks give nothing; a tick runs only if a scheduler sees it within
  ``MISSED_AFTER_S`` seconds of its time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from homing._failpoints import failpoint
from homing.errors import InvalidArgument
from homing.jobs import JobSpec, check_priority, check_type, encode_args
from homing.store import job_controls_queries as cq
from homing.store.protocol import Store

Missed = Literal["once", "all", "skip"]
MISSED_AFTER_S = 10.0  # a tick first seen later than this after its time was missed
MAX_CATCH_UP = 1000  # jobs one pass inserts for missed ticks ("all"); the rest next pass
_NAME_LEN = 200


@dataclass(frozen=True)
class Schedule:
    """A periodic job: ``cron`` (5 fields, or 6 with seconds last) in time zone ``tz``
    inserts a job of ``type`` with ``args`` at each tick."""

    name: str
    cron: str
    type: str
    args: Any = None
    tz: str = "UTC"
    missed: Missed = "once"
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > _NAME_LEN:
            raise InvalidArgument(f"a schedule name is a non-empty string, got {self.name!r}")
        check_type(self.type)
        check_priority(self.priority)
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise InvalidArgument(
                f"schedule {self.name!r}: {self.cron!r} is not a cron expression "
                "(5 fields: minute hour day month weekday; a 6th field is seconds)"
            )
        zone(self.tz)
        if self.missed not in ("once", "all", "skip"):
            raise InvalidArgument(
                f"schedule {self.name!r}: missed must be 'once', 'all' or 'skip', "
                f"got {self.missed!r}"
            )


def zone(tz: Any) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidArgument(
            f"unknown time zone {tz!r} (use an IANA name like 'Europe/Paris')"
        ) from exc


def next_tick(cron: str, tz: str, after: float) -> float:
    """The first tick strictly after ``after`` (a Unix time)."""
    it = croniter(cron, datetime.fromtimestamp(after, zone(tz)))
    return float(it.get_next(datetime).timestamp())


def ticks_between(cron: str, tz: str, after: float, until: float, *, limit: int) -> list[float]:
    """Ticks in (after, until], oldest first, at most ``limit`` (the oldest ones)."""
    it = croniter(cron, datetime.fromtimestamp(after, zone(tz)))
    out: list[float] = []
    while len(out) < limit:
        tick = float(it.get_next(datetime).timestamp())
        if tick > until:
            break
        out.append(tick)
    return out


def latest_tick(cron: str, tz: str, at: float) -> float:
    """The last tick at or before ``at``."""
    it = croniter(cron, datetime.fromtimestamp(at + 0.001, zone(tz)))
    return float(it.get_prev(datetime).timestamp())


def due_ticks(row: dict[str, Any], now: float) -> tuple[list[float], float | None]:
    """The ticks to insert now under the schedule's missed-tick policy, and the tick the
    schedule has reached (its new last tick; None: no tick came due)."""
    last = float(row["last_tick"] if row["last_tick"] is not None else row["created_at"])
    if row["missed"] == "all":
        due = ticks_between(row["cron"], row["tz"], last, now, limit=MAX_CATCH_UP)
        return due, (due[-1] if due else None)
    newest = latest_tick(row["cron"], row["tz"], now)
    if newest <= last:
        return [], None
    if row["missed"] == "skip" and now - newest > MISSED_AFTER_S:
        return [], newest  # missed: nothing runs, and the schedule moves on
    return [newest], newest


def tick_key(name: str, tick: float) -> str:
    return f"schedule:{name}:{int(tick)}"


def register(store: Store, schedules: list[Schedule], *, max_args_bytes: int) -> None:
    """Create or update the schedules' rows (their last ticks are kept)."""
    now = store.clock.now()
    with store.transaction() as tx:
        for s in schedules:
            args = encode_args(s.args, max_args_bytes)
            row = {**s.__dict__, "args": args}
            cq.upsert_schedule(tx, row, now=now)


def run_due(db: Any, name: str) -> list[str]:
    """Insert the jobs of the schedule's due ticks and advance its last tick, in one
    transaction on ``db`` (a ``Database``); the handles inserted."""
    store = db.store
    with db.transaction() as t:
        row = cq.schedule_for_update(t.tx, name)
        if row is None:
            return []
        now = store.clock.now()
        ticks, reached = due_ticks(row, now)
        if reached is None:
            return []
        args = json.loads(row["args"])
        handles = (
            t.insert_many(
                [
                    JobSpec(
                        row["type"],
                        args,
                        priority=int(row["priority"]),
                        run_at=min(tick, now),
                        unique_key=tick_key(name, tick),
                    )
                    for tick in ticks
                ]
            )
            if ticks
            else []
        )
        if ticks:
            failpoint("scheduler.after_insert_before_commit")
        cq.set_last_tick(t.tx, name, reached)
    return handles


def listing(store: Store) -> list[dict[str, Any]]:
    """Every schedule with its last tick and next tick (Unix times)."""
    with store.transaction(write=False) as tx:
        rows = cq.list_schedules(tx)
    now = store.clock.now()
    out = []
    for row in rows:
        base = row["last_tick"] if row["last_tick"] is not None else row["created_at"]
        out.append(
            {
                "name": row["name"],
                "cron": row["cron"],
                "tz": row["tz"],
                "type": row["type"],
                "missed": row["missed"],
                "last_tick": row["last_tick"],
                "next_tick": next_tick(row["cron"], row["tz"], max(float(base), now)),
            }
        )
    return out
