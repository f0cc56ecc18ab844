"""What a registered handler is: the function, whether it is a coroutine, its retry policy.

Kept apart from ``app`` (the registry users decorate with) and ``runtime`` (which runs
handlers), so that neither imports the other's module to know what a handler is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from homing.database import Database, ShardedDatabase
from homing.errors import HomingError
from homing.jobs import check_seconds
from homing.worker.retry import RetryPolicy


class RetryLater(HomingError):
    """Raise from a handler to retry the job after ``delay`` seconds (like an SMTP 4xx reply
    with a known wait). It counts as a failed attempt: the policy's ``max_attempts`` and
    ``max_age`` still apply."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = check_seconds("RetryLater delay", delay, allow_zero=True)


@dataclass(frozen=True)
class Handler:
    """One registered handler: the function, whether it is a coroutine, its retry policy."""

    type: str
    fn: Callable[..., Any]
    is_async: bool
    retry: RetryPolicy
    timeout: float | None = None  # seconds an attempt may run (see worker/timeouts.py)


class Handlers(Protocol):
    """What a worker needs of an app: its handlers by type, lease length and store."""

    db: str | Database | ShardedDatabase | None
    lock_for: float

    @property
    def types(self) -> list[str]: ...

    def handler(self, type: str) -> Handler: ...
