"""The handler registry: ``app = homing.App(url)`` and ``@app.job("type")``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from homing.database import Database, ShardedDatabase
from homing.errors import ConfigurationError, InvalidArgument
from homing.jobs import MAX_LOCK_FOR_S, check_seconds, check_type
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

    def job(self, type: str, *, retry: RetryPolicy | str | int | None = None) -> Callable[[F], F]:
        """Register the decorated ``fn(job, ctx)`` (plain or ``async def``) for jobs of ``type``.

        ``retry`` is a ``RetryPolicy``, a policy name (``"default"``, ``"smtp"``,
        ``"never"``) or a number of attempts. The function is returned unchanged.
        """
        check_type(type)
        policy = resolve(retry)

        def register(fn: F) -> F:
            if not callable(fn):
                raise InvalidArgument(f"@app.job({type!r}) must decorate a function, got {fn!r}")
            if type in self._handlers:
                raise ConfigurationError(
                    f"job type {type!r} already has the handler {self._handlers[type].fn!r}; "
                    "register one handler per type"
                )
            self._handlers[type] = Handler(
                type=type, fn=fn, is_async=inspect.iscoroutinefunction(fn), retry=policy
            )
            return fn

        return register

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
