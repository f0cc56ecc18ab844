"""The I/O thread: owns every ZeroMQ socket (``sockets``), sends (``sending``), and here
reads frames, runs commands posted by other threads (``Messenger._post``) and fires timers.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth

from homing._failpoints import failpoint
from homing.messenger import wire
from homing.messenger.model import MAX_CB, Route
from homing.messenger.outgoing import Out, Pending
from homing.messenger.sending import Sending

if TYPE_CHECKING:
    from homing.messenger.core import Messenger

log = logging.getLogger("homing.messenger")

_READ_BURST = 2000


class IOLoop(Sending):
    """The I/O thread's loop: commands from other threads, received frames, timers."""

    def __init__(self, m: Messenger) -> None:
        super().__init__(m)
        self.running = True

    # -- receiving -------------------------------------------------------------------
    def on_ack(self, route: Route, ack: wire.Ack, now: float) -> None:
        m = self.m
        m._stats["acks_received"] += 1
        o = self.outs.get(ack.channel)
        if o is None or o.epoch != ack.epoch or o.route != route:
            return
        pending = o.pending
        removed: list[Pending] = []
        for lo, hi in ack.ranges:
            if hi - lo < 4 * len(pending):
                ids: Any = range(lo, hi + 1)
            else:
                ids = [i for i in pending if lo <= i <= hi]
            for i in ids:
                p = pending.pop(i, None)
                if p is not None:
                    removed.append(p)
        if not removed:
            return
        for p in removed:
            if p.attempts == 0:
                self.sample_rtt(now - p.last_tx)
                break
        o.rto = self.rto()
        m._acked(o, removed)
        self.pump(o, now)

    def on_refusal(self, route: Route, r: wire.Refusal, now: float) -> None:
        m = self.m
        o = self.outs.get(r.channel)
        if o is None or o.route != route or o.epoch is None or o.epoch != r.epoch:
            m._stats["refusals_ignored"] += 1
            return
        if r.reason == wire.UNKNOWN:
            m._stats["epoch_renewals"] += 1
            log.info(
                "messenger %s: %s does not know epoch %d of %s (it restarted or forgot us); "
                "asking for a new one", m.name, route, r.epoch, r.channel,
            )  # fmt: skip
            o.channel.fresh = False
            o.unsend_all()
            self.request_epoch(o, now)
            return
        self.fence(o)

    def fence(self, o: Out) -> None:
        m = self.m
        o.fenced = True
        m._stats["fenced"] += 1
        log.error(
            "messenger %s: FENCED on channel %s: another live process named %r got a newer "
            "epoch from %s; this process stops sending there (%d unacknowledged messages %s)",
            m.name, o.channel.name, m.name, o.route, len(o.pending) + len(o.waiting),
            "stay in the store for that process" if m._db is not None else "fail to their MSC",
        )  # fmt: skip
        m._fenced.add(o.channel.name)
        for p in [*o.pending.values(), *o.waiting]:
            self.give_up(o, p, "fenced")
        if o.route.kind == "dealer":
            self.drop_dealer(o.route.destination)

    def on_grant(self, route: Route, g: wire.EpochGrant, now: float) -> None:
        o = self.outs.get(g.channel)
        if o is None or o.route != route or o.nonce != g.nonce or o.epoch is not None:
            return
        o.epoch = g.epoch
        o.rto = self.rto()
        self.pump(o, now)

    def read(self, s: zmq.Socket[Any], now: float) -> None:
        received: list[tuple[Route, wire.Batch | wire.EpochRequest]] = []
        try:
            self._read(s, received, now)
        finally:
            if received:
                self.m._dispatch(received)

    def _read(
        self,
        s: zmq.Socket[Any],
        received: list[tuple[Route, wire.Batch | wire.EpochRequest]],
        now: float,
    ) -> None:
        kind, where = self.kind_of[s]
        curve = self.m._curve_names is not None and kind == "router"
        for _ in range(_READ_BURST):
            if s not in self.kind_of:
                return  # closed while handling the previous frame (this sender was fenced)
            try:
                if not curve:
                    frames: list[Any] = s.recv_multipart(zmq.NOBLOCK)
                    user = None
                else:
                    zframes = s.recv_multipart(zmq.NOBLOCK, copy=False)
                    user = str(zframes[0].get("User-Id"))
                    frames = [f.bytes for f in zframes]
            except zmq.Again:
                return
            via = frames[0] if kind == "router" else b""
            body = frames[1:] if kind == "router" else frames
            d = self.decode(s, where, via, body, user)
            if d is None:
                continue
            if kind == "router":
                route = self.peer_route(where, via, body[1], d)
                answer = Route("router", where, route.peer, via)
            else:
                route = answer = self.route("dealer", where)
            if len(self.heard) > 100_000 and route not in self.heard:
                self.heard.clear()  # forged names must not grow it; only timing restarts
            self.heard[route] = now
            if route in self.dead:
                self.kick(route, now)
            self.handle(answer, d, now, received)

    def decode(
        self, s: zmq.Socket[Any], where: str, via: bytes, frames: list[Any], user: str | None
    ) -> wire.Decoded | None:
        """Parse a frame set; None (logged, counted) if it is refused or malformed."""
        m = self.m
        try:
            d = wire.decode(frames, m.max_message_bytes)
        except wire.OldVersion as exc:
            m._stats["old_peers_refused"] += 1
            log.warning("messenger %s: refused a peer on %s: %s", m.name, where, exc)
            refusal = [wire.VERSION_REFUSAL, m._name_bytes, str(exc).encode()]
            try:
                s.send_multipart([via, *refusal] if self.kind_of[s][0] == "router" else refusal,
                             zmq.NOBLOCK)  # fmt: skip
            except zmq.ZMQError:
                pass
            return None
        except wire.FrameError as exc:
            m._stats["dropped_frames"] += 1
            log.warning("messenger %s: dropped a malformed message on %s: %s", m.name, where, exc)
            return None
        if user is not None and m._curve_names is not None:
            claimed = frames[1].decode()  # every v2 frame names its peer second
            if m._curve_names.get(user) != claimed:
                m._stats["impostors_refused"] += 1
                log.warning(
                    "messenger %s: refused a frame naming sender %r from a connection whose "
                    "CURVE key belongs to %r", m.name, claimed, m._curve_names.get(user),
                )  # fmt: skip
                return None
        if isinstance(d, wire.Batch) and any(r[1] > MAX_CB or r[2] > MAX_CB for r in d.records):
            m._stats["dropped_frames"] += 1
            log.warning("messenger %s: dropped a batch with a callback id over 2**63", m.name)
            return None
        return d

    def peer_route(self, where: str, via: bytes, name: bytes, d: wire.Decoded) -> Route:
        """A listener routes to a peer by the name in its frames, via its routing id. Only a
        new session (epoch request) or connection (hello) moves a known name to another
        routing id: a stray or forged frame does not."""
        route = self.route("router", where, name)  # every v2 frame names its peer second
        known = self.peer_ids.get(route)
        if known != via and (
            known is None
            or isinstance(d, wire.EpochRequest)
            or (isinstance(d, wire.Signal) and d.kind == wire.HELLO)
        ):
            if len(self.peer_ids) > 100_000:
                self.peer_ids.clear()
            self.peer_ids[route] = via
        return route

    def handle(
        self,
        route: Route,
        d: wire.Decoded,
        now: float,
        received: list[tuple[Route, wire.Batch | wire.EpochRequest]],
    ) -> None:
        m = self.m
        if isinstance(d, wire.Batch):
            received.append((route, d))  # counted in ``_dispatch``, with ``_inflight``
        elif isinstance(d, wire.EpochRequest):
            received.append((route, d))
        elif isinstance(d, wire.Ack):
            self.on_ack(route, d, now)
        elif isinstance(d, wire.Refusal):
            self.on_refusal(route, d, now)
        elif isinstance(d, wire.EpochGrant):
            self.on_grant(route, d, now)
        elif d.kind == wire.PING:
            self.send_frames(route, wire.encode_signal(wire.PONG, m._name_bytes))
        elif d.kind == wire.HELLO:
            self.kick(route, now)

    def commands(self, now: float) -> None:
        m = self.m
        cmds = m._cmds
        while cmds:
            cmd = cmds.popleft()
            op = cmd[0]
            if op == "send":
                self.enqueue(cmd[1], now)
            elif op == "ack":
                _, route, channel, epoch, ids = cmd
                for frames in wire.encode_acks(m._name_bytes, channel, epoch, ids):
                    if self.send_frames(route, frames):
                        m._stats["acks_sent"] += 1
                failpoint("messenger.after_ack_sent")
            elif op == "refuse":
                _, route, channel, epoch, reason, ids = cmd
                for frames in wire.encode_refusals(m._name_bytes, channel, epoch, reason, ids):
                    self.send_frames(route, frames)
            elif op == "grant":
                _, route, channel, nonce, epoch = cmd
                self.send_frames(
                    route, wire.encode_epoch_grant(m._name_bytes, channel, nonce, epoch)
                )
            elif op == "listen":
                _, endpoint, slc, done, result = cmd
                try:
                    result.append(self.listen(endpoint, slc))
                except BaseException as exc:
                    result.append(exc)
                done.set()
            elif op == "connect":
                try:
                    self.dealer(cmd[1])
                except (zmq.ZMQError, KeyError, OSError, ValueError) as exc:
                    log.warning("messenger %s: cannot connect to %s: %s", m.name, cmd[1], exc)
            elif op == "stop":
                self.running = False

    def fire_timers(self, now: float) -> None:
        timers = self.timers
        while timers and timers[0][0] <= now:
            due, _, name = heapq.heappop(timers)
            o = self.outs.get(name)
            if o is not None and o.timer_due == due:
                self.service(o, now)

    def run(self) -> None:
        m = self.m
        while self.running:
            now = time.monotonic()
            timeout = 1000.0
            if self.timers:
                timeout = max(0.0, min(timeout, (self.timers[0][0] - now) * 1000))
            if m._cmds:
                timeout = 0
            events = self.poller.poll(math.ceil(timeout))
            for sock, _ev in events:
                if sock == self.wake:
                    try:
                        while m._wake_r.recv(4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                    m._woken = False
            now = time.monotonic()
            self.commands(now)
            for sock, ev in events:
                if sock == self.wake:
                    continue
                if sock in self.monitors:
                    self.on_connected(sock)
                    continue
                if sock not in self.kind_of:
                    continue  # closed in this iteration (fenced)
                if ev & zmq.POLLIN:
                    self.read(sock, now)
                if ev & zmq.POLLOUT:
                    kind, where = self.kind_of[sock]
                    if kind == "dealer":
                        self.flush_backlog(where)
            self.fire_timers(now)
            self.flush()
