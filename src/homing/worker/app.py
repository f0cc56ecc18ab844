"""The handler registry: ``app = homing.App(url)`` and ``@app.job("type")``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from homing.database import Database, ShardedDatabase
from homing.errors import ConfigurationError, InvalidArgument
from homing.jobs import MAX_LOCK_FOR_S, check_seconds, check_type
from homing.schedules import Missed, Schedule
from homing.worker.handler import Handler, RetryLater
from homing.worker.retry import RetryPolicy, resolve
from homing.worker.runtime import Worker

__all__ = ["App", "Handler", "RetryLater"]

F = TypeVar("F", bound=Callable[..., Any])


class App:
    """A set of job handlers by type, and the store they work on.

    ``db`` is a store URL, an open ``homing.Database`` (or sharded one), or None to take
    the URL from ``homing --db`` / ``HOMING_DB`` when run by ``homing worker``.
    ``lock_for`` is the lease length: how long a crashed worker's job waits before another
    worker may take it. A running handler's lease is extended (heartbeat), so it need not
    cover the handler's run time.
    """

    def __init__(
        self,
        db: str | Database | ShardedDatabase | None = None,
        *,
        lock_for: float = 30.0,
        name: str = "homing",
    ) -> None:
        if db is not None and not isinstance(db, str | Database | ShardedDatabase):
            raise ConfigurationError(
                f"App(db) takes a store URL or a homing.Database, got {type(db).__name__}"
            )
        self.db = db
        self.lock_for = check_seconds(
            "lock_for", lock_for, allow_zero=False, maximum=MAX_LOCK_FOR_S
        )
        self.name = name
        self._handlers: dict[str, Handler] = {}
        self._schedules: dict[str, Schedule] = {}

    def job(
        self,
        type: str,
        *,
        retry: RetryPolicy | str | int | None = None,
        timeout: float | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated ``fn(job, ctx)`` (plain or ``async def``) for jobs of ``type``.

        ``retry`` is a ``RetryPolicy``, a policy name (``"default"``, ``"smtp"``,
        ``"never"``) or a number of attempts. ``timeout``: seconds an attempt may run
        (a job's own ``timeout`` may shorten it); past it the attempt is failed
        (retryable) and its completion refused. The function is returned unchanged.
        """
        check_type(type)
        policy = resolve(retry)
        seconds = None if timeout is None else check_seconds("timeout", timeout, allow_zero=False)

        def register(fn: F) -> F:
            if not callable(fn):
                raise InvalidArgument(f"@app.job({type!r}) must decorate a function, got {fn!r}")
            if type in self._handlers:
                raise ConfigurationError(
                    f"job type {type!r} already has the handler {self._handlers[type].fn!r}; "
                    "register one handler per type"
                )
            self._handlers[type] = Handler(
                type=type,
                fn=fn,
                is_async=inspect.iscoroutinefunction(fn),
                retry=policy,
                timeout=seconds,
            )
            return fn

        return register

    def schedule(
        self,
        name: str,
        cron: str,
        *,
        type: str,
        args: Any = None,
        tz: str = "UTC",
        missed: Missed = "once",
        priority: int = 0,
    ) -> Schedule:
        """Insert a job of ``type`` at each tick of ``cron`` (5 fields, or 6 with seconds
        last) in time zone ``tz``; exactly one job per tick however many workers run.
        ``missed`` says what ticks missed while no worker ran give: ``"once"`` one job,
        ``"all"`` one job each, ``"skip"`` none. For schedules from configuration."""
        if name in self._schedules:
            raise ConfigurationError(f"a schedule named {name!r} is registered already")
        s = Schedule(
            name=name, cron=cron, type=type, args=args, tz=tz, missed=missed, priority=priority
        )
        self._schedules[name] = s
        return s

    def periodic(
        self,
        cron: str,
        *,
        type: str | None = None,
        name: str | None = None,
        args: Any = None,
        tz: str = "UTC",
        missed: Missed = "once",
        retry: RetryPolicy | str | int | None = None,
        timeout: float | None = None,
    ) -> Callable[[F], F]:
        """``@app.periodic("*/5 * * * *", type="report")``: register the decorated
        handler for ``type`` (default: the function's name) and a schedule (named after
        the type unless ``name``) that inserts one job of it per tick; see ``schedule``."""

        def register(fn: F) -> F:
            job_type: str = type or str(getattr(fn, "__name__", ""))
            self.job(job_type, retry=retry, timeout=timeout)(fn)
            self.schedule(name or job_type, cron, type=job_type, args=args, tz=tz, missed=missed)
            return fn

        return register

    @property
    def schedules(self) -> list[Schedule]:
        """The registered periodic schedules."""
        return list(self._schedules.values())

    @property
    def types(self) -> list[str]:
        """The registered job types, sorted."""
        return sorted(self._handlers)

    def handler(self, type: str) -> Handler:
        try:
            return self._handlers[type]
        except KeyError:
            raise ConfigurationError(
                f"no handler for job type {type!r}; registered: {', '.join(self.types) or 'none'}"
            ) from None

    def worker(
        self,
        *,
        db: str | Database | ShardedDatabase | None = None,
        concurrency: int = 4,
        types: Sequence[str] | None = None,
        **options: Any,
    ) -> Worker:
        """A worker for this app's handlers (see ``homing.worker.Worker`` for the options)."""
        return Worker(self, db=db, concurrency=concurrency, types=types, **options)

    def run(
        self, *, concurrency: int = 4, types: Sequence[str] | None = None, **options: Any
    ) -> None:
        """Run a worker in this process until SIGTERM/SIGINT (or idle, with ``until_idle=True``)."""
        self.worker(concurrency=concurrency, types=types, **options).run()
