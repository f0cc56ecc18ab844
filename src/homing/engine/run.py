"""The state of one engine transaction: its clock reading, caches and pending work.

Every engine operation runs in one store transaction; the modules ``routing``,
``credits``, ``limits`` and ``dead_letters`` act on a ``Run`` so that the work one change
makes necessary (routing a message, pumping a queue whose selector got credit) is done
before that transaction commits. Queue and selector rows are cached for the transaction
and credit changes go through here, so the cache stays exact.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from homing.store import engine_queries as q
from homing.store.protocol import Tx

if TYPE_CHECKING:
    from homing.engine.core import Engine

log = logging.getLogger("homing.engine")


class Run:
    """One transaction's routing state. ``work`` holds ("route", seq), ("pump", queue)
    (a selector got credit) and ("pump-all", queue) (the selectors changed)."""

    def __init__(self, engine: Engine, tx: Tx) -> None:
        self.engine = engine
        self.tx = tx
        self.now = engine.db.store.clock.now()
        self.work: deque[tuple[str, Any]] = deque()
        self.fate: dict[int, str] = {}
        self.notify = False
        self._queues: dict[str, dict[str, Any] | None] = {}
        self._selectors: dict[str, list[dict[str, Any]]] = {}
        self._by_id: dict[int, dict[str, Any]] = {}
        self._deltas: dict[int, list[int]] = {}

    def log(self, msg: str, *args: Any) -> None:
        """Log after commit, so that a rolled-back discard is not reported."""
        self.tx.call_after_commit(lambda: log.warning(msg, *args))

    # -- cached rows ----------------------------------------------------------------------
    def queue(self, name: str) -> dict[str, Any] | None:
        """A queue's settings, cached for this transaction (never its counters)."""
        if name not in self._queues:
            self._queues[name] = q.get_queue(self.tx, name)
        return self._queues[name]

    def selectors(self, queue: str) -> list[dict[str, Any]]:
        """The selectors of ``queue``; their ``credits`` are kept current by this run."""
        if queue not in self._selectors:
            rows = q.selectors_of(self.tx, queue)
            self._selectors[queue] = rows
            for row in rows:
                self._by_id[int(row["id"])] = row
        return self._selectors[queue]

    def selector(self, selector_id: int) -> dict[str, Any] | None:
        if selector_id not in self._by_id:
            row = q.selector_by_id(self.tx, selector_id)
            if row is None:
                return None
            self.selectors(str(row["queue"]))
        return self._by_id.get(selector_id)

    def forget(self) -> None:
        """Drop the caches after queues or selectors were created or deleted (pending
        credit changes are written first)."""
        self.flush()
        self._queues.clear()
        self._selectors.clear()
        self._by_id.clear()

    # -- credits ----------------------------------------------------------------------------
    # Credit changes are kept in the cached selector rows and written once per selector
    # when the run ends (``flush``): a batch of publishes through a chain costs one UPDATE
    # per selector, not one per message and hop.
    def spend(self, sel: dict[str, Any], seq: int) -> None:
        cached = self.selector(int(sel["id"]))
        assert cached is not None, "a selector spends credit only while it exists"
        cached["credits"] = int(cached["credits"]) - 1
        cached["last_used"] = seq
        self._pending(int(sel["id"]))[0] -= 1

    def refund(self, selector_id: int, n: int = 1, *, grant: bool = False) -> None:
        cached = self.selector(selector_id)
        if cached is None:
            return  # the selector is gone; nothing to pay back to
        cached["credits"] = int(cached["credits"]) + n
        delta = self._pending(selector_id)
        delta[0] += n
        if grant:
            cached["granted"] = int(cached["granted"]) + n
            delta[1] += n

    def _pending(self, selector_id: int) -> list[int]:
        return self._deltas.setdefault(selector_id, [0, 0])

    def finish(self) -> None:
        """Before commit: write pending credits; wake consumers given messages."""
        self.flush()
        if self.notify:
            self.notify = False
            q.notify_consumers(self.tx)

    def flush(self) -> None:
        """Write the pending credit changes of this run."""
        for sid, (credits, granted) in self._deltas.items():
            row = self._by_id.get(sid)
            last_used = None if row is None else row.get("last_used")
            q.apply_credits(self.tx, sid, credits=credits, granted=granted, last_used=last_used)
        self._deltas.clear()

    def alive(self, sel: Mapping[str, Any]) -> bool:
        """A consumer selector whose consumer has not taken for ``consumer_timeout`` is
        absent: messages wait for others rather than for it (it is back on its next take)."""
        if sel["dest_kind"] != "consumer" or sel.get("seen_at") is None:
            return True
        return float(sel["seen_at"]) + self.engine.consumer_timeout > self.now
