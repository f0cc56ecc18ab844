"""Retry policy and status classification shared by the dispatcher and the sender."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from homing.errors import InvalidArgument

#: Statuses that say the message will never complete: the seed's 501 and the 4xx that no
#: retry can fix. Any other 4xx is fatal too; 408, 409, 425 and 429 are retried.
DEFAULT_FATAL_STATUSES = frozenset({400, 401, 403, 404, 405, 410, 411, 413, 414, 415, 422, 501})
RETRYABLE_4XX = frozenset({408, 409, 425, 429})
DEFAULT_ABSURD_AFTER_S = 3 * 24 * 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits up to initial * factor**n,
    capped at ``maximum`` seconds; a ``Retry-After`` from the receiver is a lower bound."""

    initial: float = 0.2
    maximum: float = 60.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum or self.factor < 1:
            raise InvalidArgument(
                "RetryPolicy needs 0 < initial <= maximum and factor >= 1, got "
                f"initial={self.initial}, maximum={self.maximum}, factor={self.factor}"
            )

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        cap = min(self.maximum, self.initial * self.factor ** min(attempt, 60))
        wait = cap / 2 + self.rng.uniform(0, cap / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.maximum))
        return wait


def is_fatal(status: int, fatal: frozenset[int]) -> bool:
    if status in fatal:
        return True
    return 400 <= status < 500 and status not in RETRYABLE_4XX
