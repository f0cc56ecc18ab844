"""Durable mode's store work off the hot path: resuming, forgetting acknowledged messages,
recording dead letters, and the scheduled garbage collection.

One thread (``Keeper``) drains a queue of store work in batches: acknowledged ids are
deleted from the pending list many per transaction; given-up messages move to dead
letters; every ``gc_interval`` seconds ``collect_garbage`` runs.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from typing import TYPE_CHECKING, Any

from homing.errors import HomingError
from homing.messenger.model import DeadLetter
from homing.store import messenger_queries as q

if TYPE_CHECKING:
    from homing.database import Database
    from homing.messenger.core import Messenger
    from homing.store.protocol import Store

log = logging.getLogger("homing.messenger")

DEFAULT_RETENTION_S = 7 * 24 * 3600.0


def to_row(d: DeadLetter) -> q.DeadRow:
    return q.DeadRow(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)})


def from_row(r: q.DeadRow) -> DeadLetter:
    return DeadLetter(**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)})


def collect_garbage(
    store: Store, now: float, retention: float = DEFAULT_RETENTION_S
) -> dict[str, int]:
    """Delete the messenger's rows idle for ``retention`` seconds (for ``homing gc``).

    - seen state of senders not heard from since: a sender that comes back asks for an
      epoch again and starts with nothing seen below its lowest pending id (documented);
    - dead letters older than that;
    - outgoing channels with no pending message and no use since: the next send on one
      starts a fresh id space (the receiver resets its seen state on the fresh epoch).
    Returns the number of rows deleted per kind.
    """
    with store.transaction() as tx:
        return q.collect_garbage(tx, now - retention)


class Keeper:
    """The durable messenger's store thread."""

    def __init__(self, m: Messenger, db: Database) -> None:
        self.m = m
        self.db = db
        self.work: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.collected_at = time.monotonic()

    def resume(self) -> list[q.OutRow]:
        with self.db.store.transaction() as tx:
            rows = q.channels(tx, self.m.name)
            out = q.pending_out(tx, self.m.name)
        self.channel_rows = rows
        return out

    def loop(self) -> None:
        m = self.m
        while True:
            try:
                item = self.work.get(timeout=min(5.0, m.gc_interval))
            except queue.Empty:
                item = ("tick", None)
            batch: list[tuple[str, Any]] = []
            stop = item is None
            if item is not None:
                batch.append(item)
            while len(batch) < 5000:
                try:
                    nxt = self.work.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self.write(batch, stop)
            if time.monotonic() - self.collected_at >= m.gc_interval:
                self.collected_at = time.monotonic()
                self.gc()
            if stop:
                return

    def write(self, batch: list[tuple[str, Any]], stop: bool) -> None:
        m = self.m
        acked = [key for kind, key in batch if kind == "acked"]
        dead = [d for kind, d in batch if kind == "dead"]
        while acked or dead:
            try:
                with self.db.store.transaction() as tx:
                    q.delete_out(tx, m.name, acked)
                    for d in dead:
                        q.move_out_to_dead(tx, m.name, to_row(d))
                break
            except HomingError as exc:
                if stop:
                    break
                log.warning("messenger %s could not update its pending list: %s", m.name, exc)
                time.sleep(0.5)
        n = sum(1 for kind, _ in batch if kind in ("acked", "dead"))
        with m._lock:
            m._acker_backlog -= n

    def gc(self) -> None:
        m = self.m
        try:
            done = collect_garbage(self.db.store, self.db.store.clock.now(), m.retention)
        except HomingError as exc:
            log.warning("messenger %s: scheduled garbage collection failed: %s", m.name, exc)
            return
        if any(done.values()):
            log.info("messenger %s: garbage collected %s", m.name, done)
        for k, v in done.items():
            m._stats[f"gc_{k}"] += v
