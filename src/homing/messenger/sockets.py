"""The I/O thread's sockets: a ROUTER per listen endpoint, a DEALER per destination.

A DEALER gets a routing id of its own per process (not the messenger's name), so two
processes with one name both stay connected and the older one hears its refusal; a
ROUTER routes to a peer by the name in its frames, through the latest routing id seen
with that name (``peer_ids``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth

from homing.messenger import wire
from homing.messenger.model import MessengerError, Route

if TYPE_CHECKING:
    from homing.messenger.core import Messenger

log = logging.getLogger("homing.messenger")

BATCH_BYTES = 256 * 1024


class Sockets:
    """Socket state of the I/O thread (and nothing else touches these sockets)."""

    def __init__(self, m: Messenger) -> None:
        self.m = m
        self.poller = zmq.Poller()
        self.routers: dict[str, zmq.Socket[Any]] = {}
        self.dealers: dict[str, zmq.Socket[Any]] = {}
        self.kind_of: dict[zmq.Socket[Any], tuple[str, str]] = {}
        self.monitors: dict[zmq.Socket[Any], str] = {}
        self.backlog: dict[str, deque[list[bytes]]] = {}
        self.routes: dict[tuple[str, str, bytes], Route] = {}
        self.peer_ids: dict[Route, bytes] = {}  # a listener's peer name -> its routing id
        self.fenced_destinations: set[str] = set()
        self.wake = m._wake_r.fileno()
        self.poller.register(self.wake, zmq.POLLIN)

    def kick(self, route: Route, now: float) -> None:
        """The peer on ``route`` (re)connected (implemented by the sending side)."""
        raise NotImplementedError

    def _common(self, s: zmq.Socket[Any]) -> None:
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.RCVHWM, 100_000)
        s.setsockopt(zmq.MAXMSGSIZE, BATCH_BYTES + 2 * self.m.max_message_bytes + 65536)

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
        via = route.via or self.peer_ids.get(route)
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

    def close(self) -> None:
        for dealer in self.dealers.values():
            try:
                dealer.disable_monitor()
            except zmq.ZMQError:
                pass
        for s in {*self.routers.values(), *self.dealers.values(), *self.monitors}:
            s.close(0)
