"""How long to wait before trying again: the one back-off formula of homing.

The worker's retry policy, the HTTP sender's, sessions' release of a failed request and
the messenger's retransmission timer all wait by a ``Backoff``: exponential
(``first * factor**n``, capped at ``maximum``) with jitter, or a fixed schedule. Jitter
spreads retries of many failures that happened together: ``spread`` (the default) is
``1 +- jitter`` around the wait, ``equal`` ("equal jitter", AWS's name) is between
``1 - jitter`` and all of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from homing.errors import InvalidArgument


@dataclass(frozen=True)
class Backoff:
    first: float
    factor: float = 2.0
    maximum: float = 3600.0
    jitter: float = 0.0
    jitter_kind: Literal["spread", "equal"] = "spread"
    schedule: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.first >= 0 or not self.maximum >= 0 or not self.factor >= 1:
            raise InvalidArgument(
                f"a backoff needs first >= 0, maximum >= 0 and factor >= 1, got first="
                f"{self.first}, maximum={self.maximum}, factor={self.factor}"
            )
        if not 0 <= self.jitter <= 1 or any(not s > 0 for s in self.schedule):
            raise InvalidArgument("a backoff needs 0 <= jitter <= 1 and schedule waits > 0")

    def wait(self, n: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``n``-th failure (0-based)."""
        n = max(0, n)
        if self.schedule:
            base = self.schedule[min(n, len(self.schedule) - 1)]
            return base * (1 + self.jitter * (2 * rng() - 1))
        try:
            raw = self.first * self.factor ** min(n, 1000)
        except OverflowError:
            raw = float("inf")
        cap = min(self.maximum, raw)
        if self.jitter_kind == "equal":
            return cap * (1 - self.jitter) + cap * self.jitter * rng()
        return max(0.0, min(self.maximum, cap * (1 + self.jitter * (2 * rng() - 1))))

    def after(self, current: float) -> float:
        """The next wait after ``current`` (a timer that grows by ``factor``, capped)."""
        return min(self.maximum, current * self.factor)
