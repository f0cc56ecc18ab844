"""What an operator does to a job type as a whole: pause, resume, limit; and the list of
periodic schedules. A mixin of ``Database`` (see ``homing.job_controls`` for how grabs
honour the controls)."""

from __future__ import annotations

from typing import Any

from homing import schedules as sched
from homing.errors import InvalidArgument
from homing.job_controls import TypeControl, check_count, check_field, control_cache, read_controls
from homing.jobs import check_seconds, check_type
from homing.store import job_controls_queries as cq
from homing.store import jobs_queries as q
from homing.store.protocol import Store

_UNSET: Any = object()


class TypeAdmin:
    """Pause, resume and limit job types; list schedules."""

    store: Store

    def _set(self, type: str, fields: dict[str, Any]) -> None:
        check_type(type)
        with self.store.transaction() as tx:
            cq.write_control(tx, type, fields, now=self.store.clock.now())
            if fields.get("paused") == 0:  # resumed: wake idle workers to look again
                tx.sql.announce_jobs(tx, q.JOBS_CHANNEL, 1000)
        control_cache(self.store).invalidate()

    def pause(self, type: str) -> None:
        """Stop handing out jobs of ``type`` (every grabber honours it within a second;
        jobs already running finish). Durable: it holds until ``resume``."""
        self._set(type, {"paused": 1})

    def resume(self, type: str) -> None:
        """Hand out jobs of ``type`` again."""
        self._set(type, {"paused": 0})

    def limit(
        self,
        type: str,
        *,
        max_running: int | None = _UNSET,
        rate: tuple[int, float] | None = _UNSET,
        per_key: tuple[str, int] | str | None = _UNSET,
    ) -> TypeControl:
        """Set the limits of ``type``, enforced in the store across every process:
        ``max_running`` jobs held at once; ``rate=(n, seconds)`` at most n grabs per
        sliding window; ``per_key=("user_id", k)`` (or just ``"user_id"`` for k = 1) at
        most k running jobs per value of ``args["user_id"]``. ``None`` removes a limit;
        an argument not given is left as it is. Returns the type's controls."""
        fields: dict[str, Any] = {}
        if max_running is not _UNSET:
            fields["max_running"] = check_count("max_running", max_running)
        if rate is not _UNSET:
            if rate is None:
                fields["rate_limit"] = fields["rate_per"] = None
            else:
                if not isinstance(rate, tuple | list) or len(rate) != 2:
                    raise InvalidArgument(f"rate is (count, seconds), got {rate!r}")
                fields["rate_limit"] = check_count("rate count", rate[0], allow_none=False)
                fields["rate_per"] = check_seconds("rate seconds", rate[1], allow_zero=False)
        if per_key is not _UNSET:
            if per_key is None:
                fields["key_field"] = fields["key_limit"] = None
            else:
                field, k = (per_key, 1) if isinstance(per_key, str) else tuple(per_key)
                fields["key_field"] = check_field(field)
                fields["key_limit"] = check_count("per-key limit", k, allow_none=False)
        if not fields:
            raise InvalidArgument("limit() needs max_running=, rate= or per_key=")
        self._set(type, fields)
        return next((c for c in self.controls() if c.type == type), TypeControl(type))

    def controls(self) -> list[TypeControl]:
        """Every job type with a control set (paused or limited)."""
        with self.store.transaction(write=False) as tx:
            return list(read_controls(tx).values())

    def schedules(self) -> list[dict[str, Any]]:
        """The periodic schedules: name, cron, tz, type, missed policy, last and next tick."""
        return sched.listing(self.store)
