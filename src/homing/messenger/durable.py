"""Durable mode's store work off the hot path: resuming, forgetting acknowledged messages,
recording dead letters, and the scheduled garbage collection.

One thread (``Keeper``) drains a queue of store work in batches: acknowledged ids are
deleted from the pending list many per transaction; given-up messages move to dead
letters; every ``gc_interval`` seconds ``collect_garbage`` runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import time
from typing import TYPE_CHECKING, Any

from homing.errors import HomingError
from homing.messenger.model import DeadLetter, Route
from homing.messenger.outgoing import Channel, Pending
from homing.store import messenger_queries as q
from homing.store import retention_queries as rq

if TYPE_CHECKING:
    from homing.database import Database
    from homing.messenger.core import Messenger
    from homing.messenger.model import Callback
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
    A durable messenger running with a longer ``retention`` has promised it
    (``retention_queries``): rows are kept for the longest promise still binding.
    Returns the number of rows deleted per kind.
    """
    with store.transaction() as tx:
        return q.collect_garbage(tx, now - retention, now=now)


class Keeper:
    """The durable messenger's store thread."""

    def __init__(self, m: Messenger, db: Database) -> None:
        self.m = m
        self.db = db
        self.work: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.collected_at = time.monotonic()
        self.promised_at = -math.inf

    def promise(self) -> None:
        """Record this messenger's retention, so that no gc of the store (``homing gc``, a
        worker's upkeep) deletes its rows sooner (``retention_queries``)."""
        try:
            with self.db.store.transaction() as tx:
                rq.promise(tx, rq.MESSENGER, self.m.retention, now=self.db.store.clock.now())
            self.promised_at = time.monotonic()
        except HomingError as exc:  # the store is down: the loop tries again
            log.warning("messenger %s could not record its retention: %s", self.m.name, exc)

    def resume(self) -> list[q.OutRow]:
        with self.db.store.transaction() as tx:
            rows = q.channels(tx, self.m.name)
            out = q.pending_out(tx, self.m.name)
        self.channel_rows = rows
        return out

    def restore(self) -> None:
        """Load the stored channels and pending messages and hand them to the I/O thread."""
        m = self.m
        self.promise()
        out = self.resume()
        now_wall, now_mono = time.time(), time.monotonic()
        with m._lock:
            for r in self.channel_rows:
                peer = bytes.fromhex(r.peer) if r.peer else b""
                ch = Channel(r.channel, r.channel.encode(), Route(r.route, r.destination, peer))
                ch.stored, ch.fresh = True, False
                m._channels[r.channel] = ch
            m._unacked += len(out)
        for ch in list(m._channels.values()):
            if ch.route.kind == "dealer":
                m._post(("connect", ch.route.destination))
        for row in out:
            deadline = None
            if row.deadline is not None:
                deadline = now_mono + (row.deadline - now_wall)
            m._post(
                ("send", Pending(
                    row.channel, row.message_id, row.source_cb, row.dest_cb, row.body,
                    row.callback_name, deadline, m.max_attempts,
                ))
            )  # fmt: skip
        if out:
            log.info("messenger %s resumed %d unacknowledged messages", m.name, len(out))

    def send_stored(
        self, ch: Channel, route: Route, bodies: list[bytes],
        cbs: list[tuple[int, str | None, Callback | None]], dest_cb: int, ttl: float | None,
        deadline: float | None, attempts: int | None,
    ) -> None:  # fmt: skip
        """Store the messages (in the caller's transaction if one is open: an outbox) and
        hand them to the I/O thread once that commits."""
        m, db = self.m, self.db
        with db.store.transaction() as tx:
            now = db.store.clock.now()
            if not ch.stored:
                ch.fresh = q.ensure_channel(
                    tx, m.name, ch.name, route.kind, route.destination,
                    route.peer.hex() if route.kind == "router" else None, 0, now,
                )  # fmt: skip
            start = q.reserve_ids(tx, m.name, ch.name, len(bodies), now)
            stored_deadline = None if ttl is None else now + ttl
            rows, pending = [], []
            for i, (body, (cb_id, cb_name, _)) in enumerate(zip(bodies, cbs, strict=True)):
                rows.append(
                    q.OutRow(ch.name, start + i, 0, cb_id, dest_cb, cb_name, body, stored_deadline)
                )
                pending.append(
                    Pending(ch.name, start + i, cb_id, dest_cb, body, cb_name, deadline, attempts)
                )
            q.insert_out_many(tx, m.name, rows, now)

            def _after_commit() -> None:
                ch.stored = True
                with m._lock:
                    for cb_id, _, fn in cbs:
                        if fn is not None:
                            m._callbacks[cb_id] = (fn, True)
                    m._unacked += len(pending)
                for p in pending:
                    m._post(("send", p))

            tx.call_after_commit(_after_commit)

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
            if time.monotonic() - self.promised_at >= min(rq.REFRESH_EVERY_S, m.gc_interval):
                self.promise()
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
