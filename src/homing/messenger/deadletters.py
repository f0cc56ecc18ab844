"""Dead letters: messages the messenger gave up on (out) or parked (in), listed and redriven.

Memory mode keeps at most ``max_dead_letters`` (the oldest dropped, logged, counted); durable
mode keeps them in ``homing_messenger_dead`` until ``collect_garbage`` removes them after
``retention``. A redrive reuses the message's original id, so a copy that was in fact
delivered is still suppressed by the receiver.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from homing.messenger.durable import from_row
from homing.messenger.model import NOOP, DeadLetter, Failure, MessengerFenced, Route
from homing.messenger.outgoing import Out, Pending
from homing.store import messenger_queries as q

if TYPE_CHECKING:
    from homing.messenger.core import Messenger

log = logging.getLogger("homing.messenger")


class DeadLetterBook:
    def __init__(self, m: Messenger) -> None:
        self.m = m
        self.letters: deque[DeadLetter] = deque()

    def listing(self, limit: int) -> list[DeadLetter]:
        m = self.m
        if m._db is None:
            with m._lock:
                return list(self.letters)[:limit]
        with m._db.store.transaction() as tx:
            return [from_row(r) for r in q.dead_rows(tx, m.name, limit)]

    def redrive(self, letters: list[DeadLetter] | None) -> int:
        m = self.m
        todo = self.listing(10**9) if letters is None else list(letters)
        n = 0
        for d in todo:
            if d.direction == "out":
                n += self.redrive_out(d)
                continue
            if m._db is None:
                with m._lock:
                    if d not in self.letters:
                        continue
                    self.letters.remove(d)
            m._to_worker(d.peer, d.channel, [("p", None, d)])
            n += 1
        return n

    def redrive_out(self, d: DeadLetter) -> bool:
        m = self.m
        kind, destination, peer = d.route
        route = Route(kind, destination, bytes.fromhex(peer))
        ch = m._channel(route)
        if ch.name in m._fenced:
            raise MessengerFenced(f"channel {ch.name} is fenced; cannot redrive into it")
        p = Pending(ch.name, d.message_id, d.source_cb, d.dest_cb, d.body, d.callback_name)
        if m._db is None:
            with m._lock:
                if d not in self.letters:
                    return False
                self.letters.remove(d)
                m._unacked += 1
            m._post(("send", p))
            return True
        with m._db.store.transaction() as tx:
            if not q.delete_dead(tx, m.name, "out", d.channel, d.message_id):
                return False
            if not ch.stored:  # its row may have been garbage collected: ids stay above
                peer_hex = route.peer.hex() if route.kind == "router" else None
                ch.fresh = q.ensure_channel(
                    tx, m.name, ch.name, route.kind, route.destination, peer_hex, 0,
                    m._db.store.clock.now(),
                )  # fmt: skip
                q.raise_next_id(tx, m.name, ch.name, d.message_id)
            q.insert_out(
                tx, m.name,
                q.OutRow(ch.name, d.message_id, 0, d.source_cb, d.dest_cb, d.callback_name, d.body),
                m._db.store.clock.now(),
            )  # fmt: skip

            def _after() -> None:
                ch.stored = True
                with m._lock:
                    m._unacked += 1
                m._post(("send", p))

            tx.call_after_commit(_after)
        return True

    def gave_up(self, o: Out, p: Pending, reason: str) -> None:
        """The I/O thread gave up on ``p``: count it, keep a dead letter, tell its MSC."""
        m = self.m
        route = o.route
        d = DeadLetter(
            "out", route.destination, p.channel, p.message_id, p.source_cb, p.dest_cb, p.body,
            reason, p.attempts + 1, time.time(), p.callback_name,
            (route.kind, route.destination, route.peer.hex()),
        )  # fmt: skip
        with m._lock:
            m._unacked -= 1
            m._stats["gave_up"] += 1
        if m._keeper is not None:
            if reason == "fenced":
                return  # the rows stay in the store for the process that fenced this one
            with m._lock:
                m._acker_backlog += 1
            m._keeper.work.put(("dead", d))
        else:
            self.keep([d])
        log.warning(
            "messenger %s: gave up on %s#%d after %d transmissions (%s); kept as a dead letter",
            m.name, p.channel, p.message_id, d.attempts, reason,
        )  # fmt: skip
        if p.source_cb != NOOP:
            failure = Failure(
                route.destination, p.channel, p.message_id, p.body, reason, d.attempts
            )
            m._to_worker(m.name, p.channel, [("f", p.source_cb, failure)])

    def keep(self, letters: list[DeadLetter]) -> None:
        m = self.m
        with m._lock:
            for d in letters:
                if len(self.letters) >= m.max_dead_letters:
                    self.letters.popleft()
                    m._stats["dead_letters_dropped"] += 1
                    log.error(
                        "messenger %s: more than max_dead_letters=%d dead letters; the oldest "
                        "was dropped", m.name, m.max_dead_letters,
                    )  # fmt: skip
                self.letters.append(d)
