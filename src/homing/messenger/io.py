"""The I/O thread: owns every ZeroMQ socket, batches transmissions, retransmits, gives up.

Only this thread touches sockets and ``Out`` state. Other threads post commands (see
``Messenger._post``). Per loop iteration, messages to transmit are collected per channel and
packed into one ZeroMQ message per channel (up to ``batch_bytes``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth

from homing._failpoints import failpoint
from homing.messenger import wire
from homing.messenger.model import MAX_CB, MessengerError, Route
from homing.messenger.outgoing import Out, Pending

if TYPE_CHECKING:
    from homing.messenger.core import Messenger

log = logging.getLogger("homing.messenger")

_READ_BURST = 2000
_BATCH_BYTES = 256 * 1024


class IOLoop:
    """State owned by the I/O thread only: sockets, channels' windows and timers."""

    def __init__(self, m: Messenger) -> None:
        self.m = m
        self.poller = zmq.Poller()
        self.routers: dict[str, zmq.Socket[Any]] = {}
        self.dealers: dict[str, zmq.Socket[Any]] = {}
        self.kind_of: dict[zmq.Socket[Any], tuple[str, str]] = {}
        self.monitors: dict[zmq.Socket[Any], str] = {}
        self.outs: dict[str, Out] = {}
        self.by_route: dict[Route, set[str]] = {}
        self.timers: list[tuple[float, int, str]] = []
        self.seq = itertools.count()
        self.backlog: dict[str, deque[list[bytes]]] = {}
        self.to_send: dict[str, list[Pending]] = {}
        self.routes: dict[tuple[str, str, bytes], Route] = {}
        self.heard: dict[Route, float] = {}
        self.peer_ids: dict[Route, bytes] = {}  # a listener's peer name -> its routing id
        self.dead: set[Route] = set()
        self.fenced_destinations: set[str] = set()
        self.wake = m._wake_r.fileno()
        self.poller.register(self.wake, zmq.POLLIN)
        self.running = True
        self.srtt: float | None = None
        self.rttvar = 0.0

    # -- sockets ---------------------------------------------------------------------
    def _common(self, s: zmq.Socket[Any]) -> None:
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.RCVHWM, 100_000)
        s.setsockopt(zmq.MAXMSGSIZE, _BATCH_BYTES + 2 * self.m.max_message_bytes + 65536)

    def listen(self, endpoint: str, slc: Any) -> str:
        m = self.m
        if endpoint in self.routers:
            raise MessengerError(f"already listening on {endpoint}")
        s = m._ctx.socket(zmq.ROUTER)
        try:
            self._common(s)
            s.setsockopt(zmq.ROUTER_MANDATORY, 1)
            s.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if m._curve_keys is not None:
                s.curve_publickey, s.curve_secretkey = m._curve_keys
                s.curve_server = True
            s.bind(endpoint)
            bound = s.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
        except zmq.ZMQError as exc:
            s.close(0)
            raise MessengerError(
                f"cannot listen on {endpoint}: {exc}; is another process using it?"
            ) from exc
        for name in {endpoint, bound}:
            self.routers[name] = s
            m._listeners[name] = slc
        self.kind_of[s] = ("router", bound)
        self.poller.register(s, zmq.POLLIN)
        return bound

    def dealer(self, destination: str) -> zmq.Socket[Any] | None:
        s = self.dealers.get(destination)
        if s is not None or destination in self.fenced_destinations:
            return s
        m = self.m
        s = m._ctx.socket(zmq.DEALER)
        self._common(s)
        # a routing id of its own per process: two processes with one name both stay
        # connected, so the older one hears its refusal (and is fenced) instead of the
        # ROUTER handing its connection over silently; peers route to names (peer_ids)
        s.setsockopt(zmq.ROUTING_ID, m._routing_id)
        if m._curve is not None and m._curve_keys is not None:
            s.curve_publickey, s.curve_secretkey = m._curve_keys
            server_public, _ = zmq.auth.load_certificate(
                str(m._curve.server_public_keys[destination])
            )
            s.curve_serverkey = server_public
        monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.monitors[monitor] = destination
        self.poller.register(monitor, zmq.POLLIN)
        s.connect(destination)
        self.dealers[destination] = s
        self.kind_of[s] = ("dealer", destination)
        self.poller.register(s, zmq.POLLIN)
        return s

    def drop_dealer(self, destination: str) -> None:
        """Close the connection of a fenced sender, so it stops taking the routing id over."""
        s = self.dealers.pop(destination, None)
        self.fenced_destinations.add(destination)
        if s is None:
            return
        for mon, dest in list(self.monitors.items()):
            if dest == destination:
                self.poller.unregister(mon)
                del self.monitors[mon]
                try:
                    s.disable_monitor()
                except zmq.ZMQError:
                    pass
                mon.close(0)
        self.poller.unregister(s)
        del self.kind_of[s]
        self.backlog.pop(destination, None)
        s.close(0)

    def route(self, kind: str, where: str, peer: bytes = b"") -> Route:
        key = (kind, where, peer)
        r = self.routes.get(key)
        if r is None:
            if len(self.routes) > 100_000:
                self.routes.clear()
            r = self.routes[key] = Route(kind, where, peer)
        return r

    def on_connected(self, monitor: zmq.Socket[Any]) -> None:
        from zmq.utils.monitor import recv_monitor_message

        destination = self.monitors[monitor]
        while True:
            try:
                recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
        self.send_frames(self.route("dealer", destination), wire.encode_hello(self.m._name_bytes))
        self.kick(self.route("dealer", destination), time.monotonic())

    def send_frames(self, route: Route, frames: list[bytes]) -> bool:
        """Send now if the socket takes it; a full DEALER queues it (POLLOUT); False if the
        peer is unreachable (the retransmission timer tries again)."""
        if route.kind == "dealer":
            s = self.dealer(route.destination)
            if s is None:
                return False
            waiting = self.backlog.get(route.destination)
            if waiting is not None:
                waiting.append(frames)
                return True
            try:
                s.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                self.backlog[route.destination] = deque([frames])
                self.poller.modify(s, zmq.POLLIN | zmq.POLLOUT)
            except zmq.ZMQError as exc:
                log.warning("messenger %s: send to %s failed: %s", self.m.name, route, exc)
                return False
            return True
        r = self.routers.get(route.destination)
        via = self.peer_ids.get(route)
        if r is None or via is None:
            return False  # that peer has not said anything since this process started
        try:
            r.send_multipart([via, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            return False  # peer not connected (EHOSTUNREACH) or full
        return True

    def flush_backlog(self, destination: str) -> None:
        waiting = self.backlog.get(destination)
        s = self.dealers[destination]
        while waiting:
            try:
                s.send_multipart(waiting[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            waiting.popleft()
        self.backlog.pop(destination, None)
        self.poller.modify(s, zmq.POLLIN)

    # -- sending ---------------------------------------------------------------------
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
                if size >= _BATCH_BYTES or len(chunk) >= 4096:
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
            o.rto = min(m.retry_max, o.rto * 2)
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
        o.rto = min(m.retry_max, o.rto * 2)
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
        m = self.m
        kind, where = self.kind_of[s]
        curve_names = m._curve_names
        for _ in range(_READ_BURST):
            if s not in self.kind_of:
                return  # closed while handling the previous frame (this sender was fenced)
            try:
                if curve_names is None:
                    frames: list[Any] = s.recv_multipart(zmq.NOBLOCK)
                    user = None
                else:
                    zframes = s.recv_multipart(zmq.NOBLOCK, copy=False)
                    user = str(zframes[0].get("User-Id")) if kind == "router" else None
                    frames = [f.bytes for f in zframes]
            except zmq.Again:
                return
            via = frames[0] if kind == "router" else b""
            if kind == "router":
                frames = frames[1:]
            try:
                d = wire.decode(frames, m.max_message_bytes)
            except wire.OldVersion as exc:
                m._stats["old_peers_refused"] += 1
                log.warning("messenger %s: refused a peer on %s: %s", m.name, where, exc)
                refusal = [wire.VERSION_REFUSAL, m._name_bytes, str(exc).encode()]
                try:
                    s.send_multipart([via, *refusal] if via else refusal, zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
                continue
            except wire.FrameError as exc:
                m._stats["dropped_frames"] += 1
                log.warning(
                    "messenger %s: dropped a malformed message on %s: %s", m.name, where, exc
                )
                continue
            if curve_names is not None and user is not None:
                claimed = frames[1].decode()  # every v2 frame names its peer second
                if curve_names.get(user) != claimed:
                    m._stats["impostors_refused"] += 1
                    log.warning(
                        "messenger %s: refused a frame naming sender %r from a connection whose "
                        "CURVE key belongs to %r", m.name, claimed, curve_names.get(user),
                    )  # fmt: skip
                    continue
            if kind == "router":  # routed by the name in the frame, via its latest routing id
                route = self.route("router", where, frames[1])
                if self.peer_ids.get(route) != via:
                    if len(self.peer_ids) > 100_000:
                        self.peer_ids.clear()
                    self.peer_ids[route] = via
            else:
                route = self.route("dealer", where)
            self.heard[route] = now
            if route in self.dead:
                self.kick(route, now)
            if isinstance(d, wire.Batch):
                if any(r[1] > MAX_CB or r[2] > MAX_CB for r in d.records):
                    m._stats["dropped_frames"] += 1
                    log.warning(
                        "messenger %s: dropped a batch with a callback id over 2**63", m.name
                    )
                    continue
                m._stats["received"] += len(d.records)
                received.append((route, d))
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
                if self.send_frames(route, wire.encode_ack(m._name_bytes, channel, epoch, ids)):
                    m._stats["acks_sent"] += 1
                failpoint("messenger.after_ack_sent")
            elif op == "refuse":
                _, route, channel, epoch, reason, ids = cmd
                self.send_frames(
                    route, wire.encode_refusal(m._name_bytes, channel, epoch, reason, ids)
                )
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

    def close(self) -> None:
        for dealer in self.dealers.values():
            try:
                dealer.disable_monitor()
            except zmq.ZMQError:
                pass
        for s in {*self.routers.values(), *self.dealers.values(), *self.monitors}:
            s.close(0)
