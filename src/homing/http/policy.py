"""Retry policy and status classification shared by the dispatcher and the sender."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from homing.backoff import Backoff
from homing.errors import InvalidArgument

#: Statuses that say the message will never complete: the seed's 501 and the 4xx that no
#: retry can fix. Any other 4xx is fatal too; 408, 409, 425 and 429 are retried.
DEFAULT_FATAL_STATUSES = frozenset({400, 401, 403, 404, 405, 410, 411, 413, 414, 415, 422, 501})
RETRYABLE_4XX = frozenset({408, 409, 425, 429})
DEFAULT_ABSURD_AFTER_S = 3 * 24 * 3600.0


#: The schedule of Standard Webhooks / Svix after a failed attempt: 5 s, 5 min, 30 min,
#: 2 h, 5 h, 10 h, then every 10 h (until the message's absurd deadline).
WEBHOOK_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again after failed attempt n (0-based).

    By default exponential backoff with "equal jitter": a wait between half and all of
    ``initial * factor**n``, capped at ``maximum`` seconds. With ``schedule`` the n-th wait
    is ``schedule[n]`` (the last one repeats) within +-``jitter`` (a fraction) of it, so
    that many senders that failed together do not retry together. A ``Retry-After`` from
    the receiver is a lower bound (capped at ``maximum``)."""

    initial: float = 0.2
    maximum: float = 60.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    schedule: tuple[float, ...] = ()
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum or self.factor < 1:
            raise InvalidArgument(
                "RetryPolicy needs 0 < initial <= maximum and factor >= 1, got "
                f"initial={self.initial}, maximum={self.maximum}, factor={self.factor}"
            )
        if any(not 0 < s for s in self.schedule) or not 0 <= self.jitter < 1:
            raise InvalidArgument("RetryPolicy schedule waits must be > 0 and 0 <= jitter < 1")

    @classmethod
    def webhook(cls, rng: random.Random | None = None) -> RetryPolicy:
        """The schedule webhook users recognise (``WEBHOOK_SCHEDULE``, +-20 % jitter)."""
        return cls(
            initial=WEBHOOK_SCHEDULE[0],
            maximum=max(WEBHOOK_SCHEDULE),
            schedule=WEBHOOK_SCHEDULE,
            rng=rng or random.Random(),
        )

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if self.schedule:
            backoff = Backoff(first=self.initial, jitter=self.jitter, schedule=self.schedule)
        else:  # equal jitter: between half and all of the exponential wait
            backoff = Backoff(
                first=self.initial,
                factor=self.factor,
                maximum=self.maximum,
                jitter=0.5,
                jitter_kind="equal",
            )
        wait = backoff.wait(min(attempt, 60), self.rng.random)  # the exponent stops at 60
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.maximum))
        return wait


@dataclass(frozen=True)
class EndpointLimit:
    """Limits for one endpoint (a URL, an origin or ``"*"``): at most ``rate`` requests per
    second (a token bucket of ``burst``) and ``concurrency`` requests at once."""

    rate: float | None = None
    burst: int = 1
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise InvalidArgument(f"EndpointLimit rate must be > 0 per second, got {self.rate}")
        if self.burst < 1 or (self.concurrency is not None and self.concurrency < 1):
            raise InvalidArgument("EndpointLimit burst and concurrency must be >= 1")


def is_fatal(status: int, fatal: frozenset[int]) -> bool:
    if status in fatal:
        return True
    return 400 <= status < 500 and status not in RETRYABLE_4XX
