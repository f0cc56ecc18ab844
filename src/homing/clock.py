"""Time as an injectable dependency, so tests can expire leases without sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """Wall-clock time. Leases across machines assume their clocks are NTP-synchronised."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; for tests."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
