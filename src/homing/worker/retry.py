"""Retry policies: how long a failed job waits before its next attempt, and when to give up.

A policy is per job type (``@app.job("x", retry=...)``). The delay grows exponentially with
the attempt number and is spread by jitter, so that jobs that failed together (a remote
server was down) do not all come back at the same instant. A job gives up (is perm-failed)
after ``max_attempts`` attempts, or once it is older than ``max_age`` seconds: the latter is
how SMTP works ("retry less and less for 4-5 days", RFC 5321 §4.5.4.1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from homing.backoff import Backoff
from homing.errors import InvalidArgument

DAY = 24 * 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, a cap on attempts and optionally on the job's age.

    The delay after the ``n``-th failed attempt is ``min(max_delay, base * factor**(n-1))``,
    multiplied by a random factor in ``[1 - jitter, 1 + jitter]`` (and capped again).
    ``max_attempts`` counts grabs of the job, including ones cut short by a crashed worker,
    so a job that kills its worker every time also ends up failed. ``None`` means no cap.
    """

    max_attempts: int | None = 10
    base: float = 2.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.25
    max_age: float | None = None
    name: str = "default"
    rng: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise InvalidArgument(
                f"max_attempts must be a positive integer or None, got {self.max_attempts!r}"
            )
        for name in ("base", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{name} must be a finite number >= 0 seconds, got {value!r}")
        if not isinstance(self.factor, int | float) or not 1 <= self.factor < 1000:
            raise InvalidArgument(f"factor must be a number in [1, 1000), got {self.factor!r}")
        if not isinstance(self.jitter, int | float) or not 0 <= self.jitter <= 1:
            raise InvalidArgument(f"jitter must be a number in [0, 1], got {self.jitter!r}")
        if self.max_age is not None and (
            not isinstance(self.max_age, int | float) or not self.max_age > 0
        ):
            raise InvalidArgument(
                f"max_age must be a positive number of seconds or None, got {self.max_age!r}"
            )
        if self.max_attempts is None and self.max_age is None:
            raise InvalidArgument(
                "a retry policy needs max_attempts or max_age, or a failing job retries forever"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the failure of attempt number ``attempt`` (1-based)."""
        backoff = Backoff(
            first=self.base, factor=self.factor, maximum=self.max_delay, jitter=self.jitter
        )
        return backoff.wait(min(max(1, attempt) - 1, 200), self.rng)  # exponent stops at 200

    def gives_up(self, attempt: int, age: float, next_delay: float) -> str | None:
        """Why the job must not be retried after attempt ``attempt``, or None to retry.

        ``age`` is the job's age in seconds now; the job is not retried if the next try
        would come after ``max_age``.
        """
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return f"gave up after {attempt} attempts (max_attempts={self.max_attempts})"
        if self.max_age is not None and age + next_delay > self.max_age:
            return (
                f"gave up after {attempt} attempts: the job is {age / 3600:.1f}h old and "
                f"max_age is {self.max_age / 3600:.1f}h"
            )
        return None


#: The default: 10 attempts, 2 s doubling up to an hour (about 17 minutes in all).
DEFAULT = RetryPolicy()

#: SMTP-like (seed 002, RFC 5321 §4.5.4.1): first retry after 5 minutes, then doubling up to
#: every 4 hours, giving up once the job is 4.5 days old (about 30 attempts).
SMTP = RetryPolicy(
    max_attempts=None,
    base=300.0,
    factor=2.0,
    max_delay=4 * 3600.0,
    jitter=0.1,
    max_age=4.5 * DAY,
    name="smtp",
)

#: Fail at the first error: for jobs whose failure a human must look at.
NEVER = RetryPolicy(max_attempts=1, name="never")

NAMED: dict[str, RetryPolicy] = {"default": DEFAULT, "smtp": SMTP, "never": NEVER}


def resolve(retry: RetryPolicy | str | int | None) -> RetryPolicy:
    """Turn the ``retry=`` option of ``@app.job`` into a policy.

    ``None`` is the default policy, an ``int`` is that many attempts with the default
    backoff, a ``str`` names a shipped policy (``"default"``, ``"smtp"``, ``"never"``).
    """
    if retry is None:
        return DEFAULT
    if isinstance(retry, RetryPolicy):
        return retry
    if isinstance(retry, str):
        try:
            return NAMED[retry]
        except KeyError:
            raise InvalidArgument(
                f"unknown retry policy {retry!r}; use one of {', '.join(sorted(NAMED))} "
                "or a homing.RetryPolicy(...)"
            ) from None
    if isinstance(retry, int) and not isinstance(retry, bool):
        return RetryPolicy(max_attempts=retry, name=f"{retry} attempts")
    raise InvalidArgument(
        f"retry must be a RetryPolicy, a policy name or a number of attempts, got {retry!r}"
    )
