"""The receiving side: epochs, duplicate suppression, callbacks, poison messages.

Worker threads run this; messages of one sender and channel always go to the same worker,
in arrival order. Per sender and channel the receiver keeps a ``SenderState``: the epoch it
granted (only moves forward), the nonce of the request it answered (a retransmitted request
gets the same grant), and the ``SeenSet``. A batch whose epoch is lower is refused as STALE
(that sender was fenced by a newer session of the same name); one whose epoch this receiver
never granted is refused as UNKNOWN and changes nothing. Neither is ever acknowledged.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from homing._failpoints import failpoint
from homing.errors import HomingError
from homing.messenger import wire
from homing.messenger.durable import to_row
from homing.messenger.model import NOOP, Callback, DeadLetter, Failure, Incoming, Route
from homing.messenger.seen import SeenSet
from homing.store import messenger_queries as q

if TYPE_CHECKING:
    from homing.database import Transaction
    from homing.messenger.core import Messenger

log = logging.getLogger("homing.messenger")

Key = tuple[str, str]
Item = tuple[str, Any, Any]  # ("b" batch | "e" epoch request | "f" failure | "p" parked, ..)


@dataclass(slots=True)
class SenderState:
    epoch: int
    nonce: int
    seen: SeenSet
    last_used: float = 0.0
    stored: dict[int, int] | None = None  # durable: the gaps as loaded, to write only changes


@dataclass
class Worker:
    index: int
    inbox: queue.SimpleQueue[list[Item] | None]
    states: OrderedDict[Key, SenderState] = field(default_factory=OrderedDict)
    failures: OrderedDict[tuple[str, str, int], int] = field(default_factory=OrderedDict)
    swept_at: float = 0.0
    thread: threading.Thread | None = None


@dataclass
class _Round:
    """What one batch of work produced: sent to the I/O thread once its transaction commits."""

    acks: dict[tuple[Route, bytes, int, bytes], list[int]] = field(default_factory=dict)
    posts: list[tuple[Any, ...]] = field(default_factory=list)
    done_callbacks: list[int] = field(default_factory=list)
    dirty: set[Key] = field(default_factory=set)
    parked: list[DeadLetter] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n


class Receiver:
    def __init__(self, m: Messenger) -> None:
        self.m = m

    # -- the worker loop -------------------------------------------------------------
    def loop(self, w: Worker) -> None:
        m = self.m
        tick = min(1.0, m.seen_idle / 4)
        while True:
            try:
                item = w.inbox.get(timeout=tick)
            except queue.Empty:
                if m._db is None:
                    self.sweep(w)
                continue
            if item is None:
                return
            batch = list(item)
            stop = False
            while len(batch) < m._batch:
                try:
                    nxt = w.inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch += nxt
            try:
                self.process(w, batch)
            except Exception:
                log.exception("messenger %s failed to process %d items", m.name, len(batch))
            finally:
                with m._lock:
                    m._inflight -= len(batch)
            if stop:
                return

    def process(self, w: Worker, batch: list[Item]) -> None:
        m = self.m
        r = _Round()
        failures = [it for it in batch if it[0] == "f"]
        work = [it for it in batch if it[0] != "f"]
        for _, cb_id, failure in failures:
            self.run_failure(cb_id, failure)
        if not work:
            return
        if m._db is None:
            self.apply(w, work, w.states, None, r)
            failpoint("messenger.after_seen_update")
            self.sweep(w)
        else:
            states: dict[Key, SenderState] = {}
            try:
                with m._db.transaction() as t:
                    self.apply(w, work, states, t, r)
                    now = m._db.store.clock.now()
                    for key in r.dirty:
                        st = states[key]
                        self.save(t, key, st, now)
                    for d in r.parked:
                        q.insert_dead(t.tx, m.name, to_row(d))
                    failpoint("messenger.after_seen_update")
            except HomingError as exc:
                log.warning(
                    "messenger %s: store failed for %d items, they will be retried: %s",
                    m.name, len(work), exc,
                )  # fmt: skip
                return
            finally:
                m._count(r.stats)
            r.stats = {}
        m._count(r.stats)
        failpoint("messenger.after_apply_before_ack")
        if m._db is None and r.parked:
            m._keep_dead(r.parked)
        if r.done_callbacks:
            with m._lock:
                for cb_id in r.done_callbacks:
                    m._callbacks.pop(cb_id, None)
        for cmd in r.posts:
            m._post(cmd)
        for (route, channel, epoch, _), ids in r.acks.items():
            m._post(("ack", route, channel, epoch, ids))

    # -- state -----------------------------------------------------------------------
    def state(
        self, key: Key, states: dict[Key, SenderState], t: Transaction | None
    ) -> SenderState | None:
        st = states.get(key)
        if st is None and t is not None:
            row = q.load_seen(t.tx, self.m.name, key[0], key[1])
            if row is not None:
                gaps = SeenSet.decode(row[2], row[3]).gaps  # text: rows from before v3
                gaps += q.load_gaps(t.tx, self.m.name, key[0], key[1])
                seen = SeenSet(row[2], sorted(gaps))
                st = SenderState(row[0], row[1], seen, stored={} if row[3] else seen.snapshot())
                states[key] = st
        return st

    def save(self, t: Transaction, key: Key, st: SenderState, now: float) -> None:
        """Durable: the epoch and max_seen, and only the gaps this batch changed."""
        m = self.m
        if st.stored is None:  # a new epoch with fresh ids: the old gaps go
            q.reset_gaps(t.tx, m.name, key[0], key[1])
            st.stored = {}
        gone, changed = st.seen.diff(st.stored)
        q.save_gaps(t.tx, m.name, key[0], key[1], gone, changed)
        st.stored = st.seen.snapshot()
        q.save_seen(t.tx, m.name, key[0], key[1], st.epoch, st.nonce, st.seen.max_seen, "", now)

    def sweep(self, w: Worker) -> None:
        """Memory mode: forget senders idle for ``seen_idle`` seconds, and the least recently
        used ones past ``max_senders`` (per worker: ``max_senders / workers``)."""
        m = self.m
        now = time.monotonic()
        cap = max(1, m.max_senders // len(m._workers))
        states = w.states
        evicted = 0
        while len(states) > cap:
            states.popitem(last=False)
            evicted += 1
        if now - w.swept_at >= min(1.0, m.seen_idle / 4):
            w.swept_at = now
            while states:
                key, st = next(iter(states.items()))
                if now - st.last_used < m.seen_idle:
                    break
                del states[key]
                evicted += 1
        if evicted:
            m._count({"senders_evicted": evicted})

    def grant(
        self, route: Route, req: wire.EpochRequest, states: dict[Key, SenderState],
        t: Transaction | None, r: _Round,
    ) -> None:  # fmt: skip
        m = self.m
        key = (req.sender, req.channel)
        st = self.state(key, states, t)
        if st is None or st.nonce != req.nonce:
            epoch = (st.epoch if st is not None else m._epoch_base) + 1
            seen = st.seen if st is not None and not req.fresh else SeenSet(req.low - 1)
            if st is not None:
                log.info(
                    "messenger %s: %s/%s starts epoch %d (was %d, %s); frames of the older "
                    "epoch are refused", m.name, req.sender, req.channel, epoch, st.epoch,
                    "fresh ids" if req.fresh else "resumed ids",
                )  # fmt: skip
            kept = st.stored if st is not None and not req.fresh else None
            st = SenderState(epoch, req.nonce, seen, stored=kept)
            states[key] = st
            r.dirty.add(key)
            r.count("epochs_granted")
        st.last_used = time.monotonic()
        if t is None:
            states.move_to_end(key)  # type: ignore[attr-defined]
        r.posts.append(("grant", route, req.channel.encode(), req.nonce, st.epoch))

    def apply(
        self, w: Worker, work: list[Item], states: dict[Key, SenderState],
        t: Transaction | None, r: _Round,
    ) -> None:  # fmt: skip
        now = time.monotonic()
        for kind, route, payload in work:
            if kind == "e":
                self.grant(route, payload, states, t, r)
                continue
            if kind == "p":
                self.redrive_parked(payload, t, r)
                continue
            b: wire.Batch = payload
            key = (b.sender, b.channel)
            st = self.state(key, states, t)
            channel = b.channel.encode()
            if st is None or b.epoch != st.epoch:
                reason = wire.STALE if st is not None and b.epoch < st.epoch else wire.UNKNOWN
                r.count("stale" if reason == wire.STALE else "unknown_epoch", len(b.records))
                ids = [rec[0] for rec in b.records]
                r.posts.append(("refuse", route, channel, b.epoch, reason, ids))
                continue
            st.last_used = now
            if t is None:
                states.move_to_end(key)  # type: ignore[attr-defined]
            self.deliver(w, route, b, st, t, r)

    def deliver(
        self, w: Worker, route: Route, b: wire.Batch, st: SenderState,
        t: Transaction | None, r: _Round,
    ) -> None:  # fmt: skip
        m = self.m
        seen = st.seen
        key = (b.sender, b.channel)
        ack_key = (route, b.channel.encode(), b.epoch, route.via)
        ack = r.acks.setdefault(ack_key, [])
        slc = m._listeners.get(route.destination) if route.kind == "router" else None
        for rec in b.records:
            message_id, _, dest_cb, _ = rec
            if not seen.peek(message_id):
                r.count("duplicates")
                ack.append(message_id)
                continue
            if seen.grows(message_id) and seen.interval_count >= m.max_gaps:
                r.count("deferred")  # not acknowledged: the sender retries once gaps fill
                continue
            msc: Callback | None = None
            one_shot = False
            if dest_cb != NOOP:
                entry = m._callbacks.get(dest_cb)
                if entry is None:
                    r.count("unknown_callbacks")
                    log.warning(
                        "messenger %s: dropped message %s/%s#%d for unknown callback id %d",
                        m.name, b.sender, b.channel, message_id, dest_cb,
                    )  # fmt: skip
                    self.mark(seen, key, message_id, r, ack)
                    continue
                msc, one_shot = entry
            if msc is None and slc is None:
                r.count("unhandled")
                log.warning(
                    "messenger %s: dropped message %s/%s#%d: no callback and no listener for it",
                    m.name, b.sender, b.channel, message_id,
                )  # fmt: skip
                self.mark(seen, key, message_id, r, ack)
                continue
            incoming = Incoming(m, route, b.sender, b.channel, rec, t)
            error = self.run_callbacks(incoming, msc, slc, t)
            if error is not None:
                if not self.poisoned(w, route, b, rec, error, t, r):
                    continue
            else:
                w.failures.pop((b.sender, b.channel, message_id), None)
                r.count("delivered")
                if one_shot:
                    r.done_callbacks.append(dest_cb)
            self.mark(seen, key, message_id, r, ack)
        if not ack:
            del r.acks[ack_key]

    @staticmethod
    def run_callbacks(
        incoming: Incoming, msc: Callback | None, slc: Callback | None, t: Transaction | None
    ) -> BaseException | None:
        """Run the MSC then the SLC; in durable mode inside a savepoint, so a raising
        callback undoes only its own writes (and, by ``Tx.savepoint``'s rule, its sends)."""
        try:
            if t is None:
                if msc is not None:
                    msc(incoming)
                if slc is not None:
                    slc(incoming)
            else:
                with t.tx.savepoint():
                    if msc is not None:
                        msc(incoming)
                    if slc is not None:
                        slc(incoming)
        except Exception as exc:
            return exc
        return None

    def poisoned(
        self, w: Worker, route: Route, b: wire.Batch, rec: wire.Record, error: BaseException,
        t: Transaction | None, r: _Round,
    ) -> bool:  # fmt: skip
        """Count a callback failure; True once the message is parked as a dead letter."""
        m = self.m
        r.count("handler_errors")
        fkey = (b.sender, b.channel, rec[0])
        n = w.failures.pop(fkey, 0) + 1
        if n < m.max_handler_attempts:
            w.failures[fkey] = n
            while len(w.failures) > 10_000:
                w.failures.popitem(last=False)
            log.warning(
                "messenger %s: callback failed on %s/%s#%d (attempt %d of %d): %r; it runs "
                "again on the sender's retry",
                m.name, b.sender, b.channel, rec[0], n, m.max_handler_attempts, error,
            )  # fmt: skip
            return False
        r.count("parked")
        log.error(
            "messenger %s: callback failed %d times on %s/%s#%d: %r; parked as a dead letter "
            "(acknowledged, not applied; Messenger.redrive() runs it again)",
            m.name, n, b.sender, b.channel, rec[0], error,
        )  # fmt: skip
        r.parked.append(
            DeadLetter(
                "in", b.sender, b.channel, rec[0], rec[1], rec[2], rec[3],
                f"callback raised {error!r}"[:500], n, time.time(), None,
                (route.kind, route.destination, route.peer.hex()),
            )
        )  # fmt: skip
        return True

    def redrive_parked(self, d: DeadLetter, t: Transaction | None, r: _Round) -> None:
        m = self.m
        kind, destination, peer = d.route
        route = Route(kind, destination, bytes.fromhex(peer))
        entry = m._callbacks.get(d.dest_cb) if d.dest_cb != NOOP else None
        msc = entry[0] if entry is not None else None
        slc = m._listeners.get(destination) if kind == "router" else None
        incoming = Incoming(
            m, route, d.peer, d.channel, (d.message_id, d.source_cb, d.dest_cb, d.body), t
        )
        if t is not None and not q.delete_dead(t.tx, m.name, "in", d.channel, d.message_id):
            return  # redriven already
        error = self.run_callbacks(incoming, msc, slc, t)
        if error is not None:
            r.count("handler_errors")
            log.error(
                "messenger %s: redriven %s#%d failed again: %r",
                m.name,
                d.channel,
                d.message_id,
                error,
            )
            r.parked.append(d)
        else:
            r.count("delivered")

    @staticmethod
    def mark(seen: SeenSet, key: Key, message_id: int, r: _Round, ack: list[int]) -> None:
        seen.mark(message_id)
        r.dirty.add(key)
        ack.append(message_id)

    def run_failure(self, cb_id: int, failure: Failure) -> None:
        m = self.m
        entry = m._callbacks.get(cb_id)
        if entry is None:
            return
        fn, one_shot = entry
        try:
            fn(failure)
        except Exception:
            log.exception("messenger %s: the MSC raised on a failure notice", m.name)
        if one_shot:
            with m._lock:
                m._callbacks.pop(cb_id, None)
