"""Shard health: a circuit breaker per shard, and a prober that brings shards back.

A shard is marked down by the first call that cannot reach it; while down, calls that
need it fail at once (``StoreUnreachable``) and calls that can go elsewhere (grabs, inserts
without a unique key, ``transaction()`` without a key) skip it, so one dead database costs
one timeout, not one per call. A background thread re-probes down shards (``migrate()``,
which also applies migrations a shard missed while it was away) and marks them up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from homing.errors import StoreUnreachable

log = logging.getLogger("homing.sharding")


class ShardHealth:
    """Up or down, with the reason and since when."""

    def __init__(self, index: int, name: str) -> None:
        self.index = index
        self.name = name
        self.up = True
        self.down_since = 0.0
        self.error = ""

    def check(self) -> None:
        if not self.up:
            exc = StoreUnreachable(
                f"shard {self.index} ({self.name}) is down since "
                f"{time.monotonic() - self.down_since:.0f}s ({self.error}); homing re-probes it "
                "in the background and uses it again once it answers"
            )
            exc.homing_shard = self.index  # type: ignore[attr-defined]
            raise exc

    def mark_down(self, exc: BaseException) -> bool:
        """Returns True if the shard was up until now."""
        was_up = self.up
        self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if was_up:
            self.up = False
            self.down_since = time.monotonic()
            log.warning("shard %d (%s) marked down: %s", self.index, self.name, self.error)
        return was_up

    def mark_up(self) -> None:
        if not self.up:
            log.warning(
                "shard %d (%s) is back after %.0fs",
                self.index,
                self.name,
                time.monotonic() - self.down_since,
            )
        self.up = True


class Prober:
    """One daemon thread per sharded store, running only while some shard is down."""

    def __init__(
        self, health: list[ShardHealth], probe: Callable[[int], None], every: float
    ) -> None:
        self._health = health
        self._probe = probe
        self._every = every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        with self._lock:
            if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(
                target=self._run, name="homing-shard-probe", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            with self._lock:  # with wake(): a shard marked down now is never left unprobed
                down = [h for h in self._health if not h.up]
                if not down:
                    self._thread = None
                    return
            for h in down:
                try:
                    self._probe(h.index)
                except Exception as exc:  # still down (or broken): try again later
                    h.mark_down(exc)
                else:
                    h.mark_up()

    def stop(self) -> None:
        self._stop.set()
