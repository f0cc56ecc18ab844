"""The Messenger (seed 003): callbacks over ZeroMQ with retries and duplicate suppression.

The parts, each in its own module:
- ``wire``: the version-2 frames (batches of messages, range acks, refusals, epochs);
- ``io``: the I/O thread that owns every socket, batches, retransmits and gives up;
- ``outgoing``: a channel's pending messages and its one retransmission timer;
- ``receive``: worker threads: epochs, duplicate suppression, callbacks, poison messages;
- ``seen``: seed 003's max_seen + complement set;
- ``durable``: the store thread of durable mode and ``collect_garbage``;
- this module: the public ``Messenger`` that ties them together.

Identity: the receiver grants each sender channel an epoch (only moves forward); frames of an
older epoch are refused (the sender is fenced loudly), frames of an epoch it never granted
are refused and change nothing. Nothing is acknowledged that was not delivered.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import queue
import secrets
import socket
import threading
import time
from collections import deque
from typing import Any

import zmq
import zmq.auth

from homing.database import Database
from homing.errors import ConfigurationError, InvalidArgument, PayloadTooLarge
from homing.messenger import curve as curve_auth
from homing.messenger import wire
from homing.messenger.deadletters import DeadLetterBook
from homing.messenger.durable import DEFAULT_RETENTION_S, Keeper
from homing.messenger.io import IOLoop
from homing.messenger.model import (
    NAMED_BIT,
    NOOP,
    Callback,
    Curve,
    DeadLetter,
    MessengerError,
    MessengerFenced,
    Route,
    check_endpoint,
    check_name,
    check_numbers,
    check_positive,
)
from homing.messenger.outgoing import Channel, Out, Pending
from homing.messenger.receive import Item, Receiver, Worker

log = logging.getLogger("homing.messenger")

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
_STATS = (
    "sent", "retransmits", "received", "delivered", "duplicates", "stale", "unknown_epoch",
    "epochs_granted", "epoch_renewals", "fenced", "refusals_ignored", "dropped_frames",
    "old_peers_refused", "impostors_refused", "unknown_callbacks", "unhandled",
    "handler_errors", "parked", "deferred", "gave_up", "dead_letters_dropped", "peers_dead",
    "senders_evicted", "acks_sent", "acks_received", "gc_seen", "gc_dead", "gc_channels",
)  # fmt: skip


class Messenger:
    """Send messages with callbacks; listen on endpoints with server-loop callbacks.

    ``name`` identifies this messenger to its peers; in durable mode (``db=``) it must be
    stable across restarts. Giving up: ``ttl`` (seconds) and ``max_attempts`` (transmissions)
    end a message with a ``Failure`` to its MSC and a dead letter (``dead_letters``,
    ``redrive``); a callback that raises ``max_handler_attempts`` times on one message parks
    it. Limits of duplicate tracking: ``max_gaps`` complement intervals per sender channel,
    ``max_senders`` sender channels, ``seen_idle`` seconds before an idle sender's state is
    forgotten (memory mode; durable mode: ``retention``). See docs/messenger.md.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        db: Database | None = None,
        workers: int = 4,
        retry_initial: float = 1.0,
        retry_max: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        batch: int = 256,
        window: int = 256,
        curve: Curve | None = None,
        context: zmq.Context[Any] | None = None,
        ttl: float | None = None,
        max_attempts: int | None = None,
        max_handler_attempts: int = 5,
        dead_after: float = 30.0,
        max_gaps: int = 10_000,
        max_senders: int = 100_000,
        seen_idle: float = 3600.0,
        max_dead_letters: int = 10_000,
        gc_interval: float = 300.0,
        retention: float = DEFAULT_RETENTION_S,
    ) -> None:
        if db is not None and name is None:
            raise ConfigurationError(
                "a durable Messenger needs a stable name= (its pending messages and seen "
                "ids are kept in the store under that name)"
            )
        if db is not None and not isinstance(db, Database):
            raise ConfigurationError(
                f"db must be a homing.Database from homing.connect(url) (one store), got {db!r}"
            )
        self.name = name if name is not None else f"m-{secrets.token_hex(8)}"
        self._name_bytes = check_name(self.name, "messenger name")
        self._routing_id = b"\x01" + secrets.token_bytes(15)
        check_numbers(
            {"retry_initial": retry_initial, "retry_max": retry_max, "dead_after": dead_after,
             "seen_idle": seen_idle, "gc_interval": gc_interval, "retention": retention},
            {"workers": workers, "batch": batch, "window": window,
             "max_message_bytes": max_message_bytes, "max_handler_attempts": max_handler_attempts,
             "max_gaps": max_gaps, "max_senders": max_senders, "max_dead_letters": max_dead_letters},
        )  # fmt: skip
        check_positive("ttl", ttl, optional=True)
        check_positive("max_attempts", max_attempts, integer=True, optional=True)
        self._db = db
        self.retry_initial = float(retry_initial)
        self.retry_max = float(max(retry_max, retry_initial))
        self.max_message_bytes = max_message_bytes
        self._batch = batch
        self.window = window
        self.ttl, self.max_attempts = ttl, max_attempts
        self.max_handler_attempts = max_handler_attempts
        self.dead_after = float(dead_after)
        self.max_gaps, self.max_senders, self.seen_idle = max_gaps, max_senders, float(seen_idle)
        self.gc_interval, self.retention = float(gc_interval), float(retention)
        self.max_dead_letters = max_dead_letters
        self._curve = curve
        self._curve_keys: tuple[bytes, bytes] | None = None
        self._curve_names: dict[str, str] | None = None
        if curve is not None:
            self._curve_keys = curve_auth.load_secret(curve.secret_key_file)
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._init_state(db, workers)

    def _init_state(self, db: Database | None, workers: int) -> None:
        """The threads' shared state, queues and helpers (nothing runs until ``start``)."""
        self._epoch_base = secrets.randbits(31) << 32  # epochs this receiver grants start here
        self._lock = threading.Lock()
        self._cmds: deque[tuple[Any, ...]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._woken = False
        self._callbacks: dict[int, tuple[Callback, bool]] = {}
        self._adhoc_ids = itertools.count(secrets.randbits(62))
        self._listeners: dict[str, Callback] = {}
        self._channels: dict[str, Channel] = {}
        self._routes: dict[str, Route] = {}
        self._fenced: set[str] = set()
        self._book = DeadLetterBook(self)
        self._workers = [Worker(i, queue.SimpleQueue()) for i in range(workers)]
        self._receiver = Receiver(self)
        self._keeper = Keeper(self, db) if db is not None else None
        self._unacked = 0
        self._inflight = 0
        self._acker_backlog = 0
        self._stats: dict[str, int] = dict.fromkeys(_STATS, 0)
        self._io: threading.Thread | None = None
        self._keeper_thread: threading.Thread | None = None
        self._auth: Any = None
        self._started = False
        self._closed = False
        self._io_error: BaseException | None = None

    # -- public API --------------------------------------------------------------------
    def start(self) -> Messenger:
        """Start the threads (and, in durable mode, resume the stored pending messages).

        Register named callbacks before this, so replies to messages sent before a restart
        find them. ``listen`` and ``send`` start the messenger if needed.
        """
        with self._lock:
            if self._started:
                return self
            if self._closed:
                raise MessengerError("this Messenger was closed; create a new one")
            self._started = True
        if self._keeper is not None:
            self._keeper.restore()
            self._keeper_thread = threading.Thread(
                target=self._keeper.loop, name="homing-messenger-store", daemon=True
            )
            self._keeper_thread.start()
        for w in self._workers:
            w.thread = threading.Thread(
                target=self._receiver.loop, args=(w,), name=f"homing-messenger-w{w.index}",
                daemon=True,
            )  # fmt: skip
            w.thread.start()
        self._io = threading.Thread(target=self._io_loop, name="homing-messenger-io", daemon=True)
        self._io.start()
        return self

    def register_callback(self, name: str, fn: Callback) -> int:
        """Register a named, persistent MSC; returns its id. Pass ``name`` as ``callback=``.

        Its id is derived from the name, so replies to messages sent by an earlier
        incarnation of a durable messenger find it after a restart.
        """
        check_name(name, "callback name")
        if not callable(fn):
            raise InvalidArgument(f"callback {name!r} must be callable, got {fn!r}")
        cb_id = self._named_id(name)
        with self._lock:
            self._callbacks[cb_id] = (fn, False)
        return cb_id

    def listen(self, endpoint: str, server_loop_callback: Callback) -> str:
        """Bind ``endpoint`` and attach the SLC; returns the bound endpoint (tcp port 0/*
        resolved). Every message arriving there runs its MSC (if it names one), then the SLC."""
        check_endpoint(endpoint)
        if not callable(server_loop_callback):
            raise InvalidArgument("server_loop_callback must be callable")
        self.start()
        if self._curve is not None and self._auth is None:
            self._auth, self._curve_names = curve_auth.start_authenticator(self._ctx, self._curve)
        done = threading.Event()
        result: list[Any] = []
        self._post(("listen", endpoint, server_loop_callback, done, result))
        if not done.wait(30):
            raise MessengerError(f"the I/O thread did not bind {endpoint} within 30s")
        if isinstance(result[0], BaseException):
            raise result[0]
        return str(result[0])

    def connect(self, destination: str) -> None:
        """Open the connection to ``destination`` now instead of on the first send."""
        check_endpoint(destination)
        curve_auth.check_destination(self._curve, destination)
        self.start()
        self._post(("connect", destination))

    def send(
        self,
        destination: str,
        message: bytes | str,
        callback: Callback | str | int = NOOP,
        *,
        ttl: float | None = None,
        max_attempts: int | None = None,
    ) -> None:
        """Buffer ``message`` for ``destination`` and return at once.

        ``callback`` (the MSC) runs with the reply when the receiver answers, or with a
        ``Failure`` if the messenger gives up (``ttl`` seconds passed or ``max_attempts``
        transmissions went unacknowledged; defaults from the constructor): a callable
        (one-shot), the name given to ``register_callback``, or ``NOOP``. There is no "was
        it sent" answer on purpose: have the receiver reply once it has persisted or
        applied the message. In durable mode the message is stored before this returns,
        inside the caller's open transaction if there is one (an outbox).
        """
        route = self._routes.get(destination)
        if route is None:
            check_endpoint(destination)
            curve_auth.check_destination(self._curve, destination)
            route = self._routes[destination] = Route("dealer", destination)
        self._send(route, message, callback, NOOP, ttl, max_attempts)

    def send_many(
        self,
        destination: str,
        messages: list[bytes | str],
        callback: Callback | str | int = NOOP,
        *,
        ttl: float | None = None,
        max_attempts: int | None = None,
    ) -> None:
        """``send`` each message; in durable mode all are stored in one transaction with
        one id reservation and one multi-row insert; ``callback`` gets each reply."""
        route = self._routes.get(destination)
        if route is None:
            check_endpoint(destination)
            curve_auth.check_destination(self._curve, destination)
            route = self._routes[destination] = Route("dealer", destination)
        bodies = [self._body(message) for message in messages]
        if bodies:
            self._send_bodies(route, bodies, callback, NOOP, ttl, max_attempts)

    def dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        """Messages given up on (``direction="out"``) or parked (``"in"``), oldest first."""
        return self._book.listing(limit)

    def redrive(self, letters: list[DeadLetter] | None = None) -> int:
        """Send again (out) or apply again (in) dead letters (all if None), with their
        original ids, so a copy that did arrive earlier is still suppressed. Returns how many."""
        self.start()
        return self._book.redrive(letters)

    @property
    def fenced(self) -> set[str]:
        """Channels on which another process with this name took over (see MessengerFenced)."""
        return set(self._fenced)

    def unacknowledged(self) -> int:
        """Messages buffered or in flight whose acknowledgement has not arrived yet."""
        return self._unacked

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every message is acknowledged or given up, and every delivery
        processed. True does not mean delivered: a given-up message is a dead letter."""
        deadline = time.monotonic() + timeout
        while True:
            if self._unacked == 0 and self._inflight == 0 and self._acker_backlog == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def stats(self) -> dict[str, int]:
        """Counters, plus the memory of duplicate tracking (keys and complement intervals)."""
        with self._lock:
            out = dict(self._stats)
            out["callbacks"] = len(self._callbacks)
            out["dead_letters"] = len(self._book.letters)
        states = [s for w in self._workers for s in list(w.states.values())]
        out["seen_keys"] = len(states)
        out["seen_intervals"] = sum(s.seen.interval_count for s in states)
        out["unacknowledged"] = self._unacked
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads and close the sockets. Unacknowledged messages are dropped in
        memory mode and stay in the store in durable mode."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if started:
            self._post(("stop",))
            if self._io is not None:
                self._io.join(timeout)
            for w in self._workers:
                w.inbox.put(None)
            for w in self._workers:
                if w.thread is not None:
                    w.thread.join(timeout)
            if self._keeper is not None and self._keeper_thread is not None:
                self._keeper.work.put(None)
                self._keeper_thread.join(timeout)
            if self._auth is not None:
                self._auth.stop()
        self._wake_r.close()
        self._wake_w.close()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> Messenger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending -----------------------------------------------------------------------
    def _named_id(self, name: str) -> int:
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        return (int.from_bytes(digest, "big") & (NAMED_BIT - 1)) | NAMED_BIT

    def _callback_for(
        self, callback: Callback | str | int
    ) -> tuple[int, str | None, Callback | None]:
        if callback is None or (isinstance(callback, int) and callback == NOOP):
            return NOOP, None, None
        if isinstance(callback, str):
            cb_id = self._named_id(callback)
            if cb_id not in self._callbacks:
                raise InvalidArgument(
                    f"no callback registered under the name {callback!r}; call "
                    "register_callback(name, fn) first"
                )
            return cb_id, callback, None
        if isinstance(callback, int) and not isinstance(callback, bool):
            if callback not in self._callbacks:
                raise InvalidArgument(f"callback id {callback} is not registered")
            return callback, None, None
        if callable(callback):
            while True:  # ids from a random start, so a restart does not reuse them
                cb_id = next(self._adhoc_ids) & (NAMED_BIT - 1) or 1
                if cb_id not in self._callbacks:
                    return cb_id, None, callback
        raise InvalidArgument(
            f"callback must be a callable, a registered name or NOOP, got {callback!r}"
        )

    def _channel(self, route: Route) -> Channel:
        if route.kind == "dealer":
            name = route.destination
        else:
            peer = route.peer.decode("utf-8", "backslashreplace")
            name = f"{route.destination}#{peer}"
            if len(name.encode()) > wire.MAX_NAME_BYTES:
                name = "reply:" + hashlib.sha1(name.encode()).hexdigest()
        ch = self._channels.get(name)
        if ch is None:
            with self._lock:
                ch = self._channels.get(name)
                if ch is None:  # a channel's sends follow the peer's latest routing id
                    plain = Route(route.kind, route.destination, route.peer)
                    ch = self._channels[name] = Channel(name, name.encode(), plain)
        return ch

    def _body(self, message: bytes | str) -> bytes:
        if isinstance(message, str):
            body = message.encode("utf-8")
        elif isinstance(message, bytes | bytearray | memoryview):
            body = bytes(message)
        else:
            raise InvalidArgument(f"message must be bytes or str, got {type(message).__name__}")
        if len(body) > self.max_message_bytes:
            raise PayloadTooLarge(
                f"message of {len(body)} bytes is over max_message_bytes={self.max_message_bytes}; "
                "send it in parts or raise the limit on both messengers"
            )
        return body

    def _send(
        self,
        route: Route,
        message: bytes | str,
        callback: Callback | str | int,
        dest_cb: int,
        ttl: float | None = None,
        max_attempts: int | None = None,
    ) -> None:
        self._send_bodies(route, [self._body(message)], callback, dest_cb, ttl, max_attempts)

    def _send_bodies(
        self,
        route: Route,
        bodies: list[bytes],
        callback: Callback | str | int,
        dest_cb: int,
        ttl: float | None,
        max_attempts: int | None,
    ) -> None:
        if self._closed:
            raise MessengerError("this Messenger was closed; messages can no longer be sent")
        check_positive("ttl", ttl, optional=True)
        check_positive("max_attempts", max_attempts, integer=True, optional=True)
        ttl = self.ttl if ttl is None else ttl
        attempts = self.max_attempts if max_attempts is None else max_attempts
        first = self._callback_for(callback)
        one_shot = first[2] is not None  # a callable: one id (one-shot MSC) per message
        cbs = [first] + [self._callback_for(callback) if one_shot else first for _ in bodies[1:]]
        ch = self._channel(route)
        if ch.name in self._fenced:
            raise MessengerFenced(
                f"messenger {self.name} is fenced on {ch.name}: another live process with this "
                "name took it over; stop one of them"
            )
        if not self._started:
            self.start()
        deadline = None if ttl is None else time.monotonic() + ttl
        if self._db is None:
            with self._lock:
                start = ch.next_id + 1
                ch.next_id += len(bodies)
                for cb_id, _, fn in cbs:
                    if fn is not None:
                        self._callbacks[cb_id] = (fn, True)
                self._unacked += len(bodies)
            for i, (body, (cb_id, cb_name, _)) in enumerate(zip(bodies, cbs, strict=True)):
                self._post(
                    ("send", Pending(
                        ch.name, start + i, cb_id, dest_cb, body, cb_name, deadline, attempts,
                    ))
                )  # fmt: skip
            return
        assert self._keeper is not None
        self._keeper.send_stored(ch, route, bodies, cbs, dest_cb, ttl, deadline, attempts)

    def _post(self, cmd: tuple[Any, ...]) -> None:
        self._cmds.append(cmd)
        if not self._woken:
            self._woken = True
            try:
                self._wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # already full of wake-ups, or closing

    # -- called by the I/O thread ------------------------------------------------------
    def _acked(self, o: Out, removed: list[Pending]) -> None:
        with self._lock:
            self._unacked -= len(removed)
            if self._keeper is not None:
                self._acker_backlog += len(removed)
        if self._keeper is not None:
            put = self._keeper.work.put
            for p in removed:
                put(("acked", (p.channel, p.message_id)))

    def _gave_up(self, o: Out, p: Pending, reason: str) -> None:
        self._book.gave_up(o, p, reason)

    def _keep_dead(self, letters: list[DeadLetter]) -> None:
        self._book.keep(letters)

    def _count(self, stats: dict[str, int]) -> None:
        if stats:
            with self._lock:
                for k, v in stats.items():
                    self._stats[k] += v

    # -- threads -----------------------------------------------------------------------
    def _io_loop(self) -> None:
        io = IOLoop(self)
        try:
            io.run()
        except BaseException as exc:  # pragma: no cover - a bug; make it visible
            self._io_error = exc
            log.exception("messenger %s I/O thread died", self.name)
        finally:
            io.close()

    def _to_worker(self, sender: str, channel: str, items: list[Item]) -> None:
        with self._lock:
            self._inflight += len(items)
        self._workers[hash((sender, channel)) % len(self._workers)].inbox.put(items)

    def _dispatch(self, received: list[tuple[Route, wire.Batch | wire.EpochRequest]]) -> None:
        """Hand a burst of received batches and epoch requests to the workers, by sender
        and channel (one sender channel is always handled by the same worker, in order)."""
        workers = self._workers
        parts: dict[int, list[Item]] = {}
        for route, d in received:
            index = hash((d.sender, d.channel)) % len(workers) if len(workers) > 1 else 0
            parts.setdefault(index, []).append(
                ("b" if isinstance(d, wire.Batch) else "e", route, d)
            )
        records = sum(len(d.records) for _, d in received if isinstance(d, wire.Batch))
        with self._lock:
            # one step under the lock: whoever sees them received also sees them in flight,
            # so ``wait_idle`` cannot answer True between the two
            self._inflight += len(received)
            self._stats["received"] += records
        for index, part in parts.items():
            workers[index].inbox.put(part)
