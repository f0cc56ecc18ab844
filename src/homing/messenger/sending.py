"""The sending side of the I/O thread: windows, batching, retransmission, giving up.

Messages wait in their channel until the receiver granted an epoch, then enter a window of
``window`` transmitted messages. Per loop iteration the messages to (re)transmit are packed
into one ZeroMQ message per channel. One timer per channel: a scan from the front of its
pending list (ordered by last transmission) finds what is due. A peer silent for
``dead_after`` seconds while we retry is marked dead and only pinged; TTL and
``max_attempts`` end a message through ``Messenger._gave_up``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import secrets
from typing import TYPE_CHECKING

from homing.backoff import Backoff
from homing.messenger import wire
from homing.messenger.model import Route
from homing.messenger.outgoing import Out, Pending
from homing.messenger.sockets import BATCH_BYTES, Sockets

if TYPE_CHECKING:
    from homing.messenger.core import Messenger

log = logging.getLogger("homing.messenger")


class Sending(Sockets):
    """Channels' windows and timers, on top of the sockets."""

    def __init__(self, m: Messenger) -> None:
        super().__init__(m)
        self.outs: dict[str, Out] = {}
        self.by_route: dict[Route, set[str]] = {}
        self.timers: list[tuple[float, int, str]] = []
        self.seq = itertools.count()
        self.to_send: dict[str, list[Pending]] = {}
        self.heard: dict[Route, float] = {}
        self.dead: set[Route] = set()
        self.srtt: float | None = None
        self.rttvar = 0.0

    def out(self, name: str) -> Out:
        o = self.outs.get(name)
        if o is None:
            ch = self.m._channels[name]
            o = self.outs[name] = Out(ch, self.rto())
            self.by_route.setdefault(ch.route, set()).add(name)
        return o

    def rto(self) -> float:
        if self.srtt is None:
            return self.m.retry_initial
        return max(self.m.retry_initial, self.srtt + 4 * self.rttvar)

    def sample_rtt(self, sample: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = sample, sample / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
            self.srtt = 0.875 * self.srtt + 0.125 * sample

    def schedule(self, o: Out, due: float) -> None:
        if o.timer_due is None or due < o.timer_due:
            o.timer_due = due
            heapq.heappush(self.timers, (due, next(self.seq), o.channel.name))

    def enqueue(self, p: Pending, now: float) -> None:
        o = self.out(p.channel)
        if o.fenced:
            self.give_up(o, p, "fenced")
            return
        o.waiting.append(p)
        if p.deadline is not None and (o.next_expiry is None or p.deadline < o.next_expiry):
            o.next_expiry = p.deadline
            self.schedule(o, p.deadline)
        self.pump(o, now)

    def request_epoch(self, o: Out, now: float) -> None:
        if o.nonce == 0 or o.epoch is not None:
            o.nonce = secrets.randbits(63) | 1
        o.epoch = None
        o.requested_at = now
        ch = o.channel
        frames = wire.encode_epoch_request(
            self.m._name_bytes, ch.name_bytes, o.nonce, o.low(), ch.fresh
        )
        self.send_frames(ch.route, frames)
        self.schedule(o, now + o.rto)

    def pump(self, o: Out, now: float) -> None:
        """Move waiting messages into the window and onto the wire (at the next flush)."""
        if o.fenced or not o.waiting:
            return
        if o.epoch is None:
            if o.requested_at == 0.0:
                self.request_epoch(o, now)
            return
        if o.route in self.dead:
            return
        window = self.m.window
        pending, waiting = o.pending, o.waiting
        buf = self.to_send.setdefault(o.channel.name, [])
        first = not pending
        while waiting and len(pending) < window:
            p = waiting.popleft()
            p.last_tx = now
            pending[p.message_id] = p
            buf.append(p)
        self.m._stats["sent"] += len(buf)
        if first and pending:
            self.heard.setdefault(o.route, now)
            self.schedule(o, now + o.rto)

    def flush(self) -> None:
        """Pack what this iteration transmits into one ZeroMQ message per channel."""
        if not self.to_send:
            return
        m = self.m
        for name, items in self.to_send.items():
            o = self.outs[name]
            if not items or o.epoch is None or o.fenced:
                continue
            ch = o.channel
            epoch = wire.u64(o.epoch)
            chunk: list[wire.Record] = []
            size = 0
            for p in items:
                chunk.append((p.message_id, p.source_cb, p.dest_cb, p.body))
                size += 28 + len(p.body)
                if size >= BATCH_BYTES or len(chunk) >= 4096:
                    self.send_frames(
                        ch.route, [wire.MESSAGES, m._name_bytes, ch.name_bytes, epoch,
                                   wire.encode_records(chunk)],
                    )  # fmt: skip
                    chunk, size = [], 0
            if chunk:
                self.send_frames(
                    ch.route,
                    [
                        wire.MESSAGES,
                        m._name_bytes,
                        ch.name_bytes,
                        epoch,
                        wire.encode_records(chunk),
                    ],
                )
        self.to_send.clear()

    def service(self, o: Out, now: float) -> None:
        """A channel's timer fired: expire, probe a dead peer, re-ask for an epoch, or
        retransmit what is due."""
        m = self.m
        o.timer_due = None
        if o.next_expiry is not None and o.next_expiry <= now:
            self.expire(o, now)
        if o.fenced:
            return
        route = o.route
        busy = bool(o.pending or (o.epoch is None and o.waiting))
        if route in self.dead:
            if busy and o.last_ping + m.retry_max <= now:
                o.last_ping = now
                self.send_frames(route, wire.encode_signal(wire.PING, m._name_bytes))
        elif o.epoch is None:
            if o.waiting and o.requested_at + o.rto <= now:
                self.rerequest_epoch(o, now)
        elif o.pending:
            self.retransmit_due(o, now)
        # next due
        due: list[float] = []
        if o.next_expiry is not None:
            due.append(o.next_expiry)
        if route in self.dead:
            if busy:
                due.append(o.last_ping + m.retry_max)
        elif o.epoch is None and o.waiting:
            due.append(o.requested_at + o.rto)
        elif o.pending:
            due.append(next(iter(o.pending.values())).last_tx + o.rto)
        if due:
            self.schedule(o, min(due))

    def rerequest_epoch(self, o: Out, now: float) -> None:
        """No grant came: each unanswered request is an attempt for every waiting message."""
        m = self.m
        for p in list(o.waiting):
            if p.max_attempts is not None and p.attempts + 1 >= p.max_attempts:
                self.give_up(o, p, "attempts")
            else:
                p.attempts += 1
        if o.waiting:
            m._stats["retransmits"] += 1
            self.request_epoch(o, now)
            o.rto = Backoff(first=m.retry_initial, maximum=m.retry_max).after(o.rto)
            self.check_dead(o, now)

    def retransmit_due(self, o: Out, now: float) -> None:
        m = self.m
        pending = o.pending
        again: list[Pending] = []
        for p in list(pending.values()):
            if p.last_tx + o.rto > now:
                break
            if p.max_attempts is not None and p.attempts + 1 >= p.max_attempts:
                self.give_up(o, p, "attempts")
                continue
            p.attempts += 1
            p.last_tx = now
            del pending[p.message_id]
            pending[p.message_id] = p
            again.append(p)
        if not again:
            return
        m._stats["retransmits"] += len(again)
        self.to_send.setdefault(o.channel.name, []).extend(again)
        o.rto = Backoff(first=m.retry_initial, maximum=m.retry_max).after(o.rto)
        self.check_dead(o, now)

    def check_dead(self, o: Out, now: float) -> None:
        """A peer not heard from for ``dead_after`` seconds while we retry is marked dead:
        no more retransmissions to it, only a ping every ``retry_max`` seconds."""
        m = self.m
        heard = self.heard.setdefault(o.route, now)
        if now - heard >= m.dead_after and o.route not in self.dead:
            self.dead.add(o.route)
            m._stats["peers_dead"] += 1
            o.last_ping = now
            log.warning(
                "messenger %s: peer %s silent for %.1f s with messages unacknowledged: marked "
                "dead; retransmission stops (pings every %.1f s) until it answers",
                m.name, o.route, now - heard, m.retry_max,
            )  # fmt: skip

    def expire(self, o: Out, now: float) -> None:
        nxt: float | None = None
        for p in [*o.pending.values(), *o.waiting]:
            if p.deadline is None:
                continue
            if p.deadline <= now:
                self.give_up(o, p, "ttl")
            elif nxt is None or p.deadline < nxt:
                nxt = p.deadline
        o.next_expiry = nxt

    def give_up(self, o: Out, p: Pending, reason: str) -> None:
        if o.pending.pop(p.message_id, None) is None:
            try:
                o.waiting.remove(p)
            except ValueError:
                pass
        self.m._gave_up(o, p, reason)

    def kick(self, route: Route, now: float) -> None:
        """The peer on ``route`` is there again: retransmit its messages now."""
        if route in self.dead:
            self.dead.discard(route)
            log.warning("messenger %s: peer %s answers again", self.m.name, route)
        for name in self.by_route.get(route, ()):
            o = self.outs[name]
            o.rto = self.rto()
            if o.epoch is None:
                if o.waiting:
                    self.request_epoch(o, now)
                continue
            again = [p for p in o.pending.values() if p.attempts or p.last_tx + o.rto <= now]
            for p in again:
                p.attempts += 1
                p.last_tx = now
            if again:
                self.m._stats["retransmits"] += len(again)
                self.to_send.setdefault(name, []).extend(again)
            self.pump(o, now)
            self.schedule(o, now + o.rto)
