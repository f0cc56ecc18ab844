"""The Messenger (seed 003): callbacks over ZeroMQ with retries and duplicate suppression.

Threads:
- one I/O thread owns every ZeroMQ socket (a ROUTER per ``listen`` endpoint, a DEALER per
  destination); other threads hand it commands through a deque and a wake-up socketpair;
- a pool of worker threads runs the callbacks; messages of one sender and channel always go
  to the same worker, in arrival order, so a slow callback stalls only its own senders;
- in durable mode, one more thread deletes acknowledged messages from the store in batches.

Reliability: every message has a per-channel id (channel = the destination as the sender
names it, or the reply path of a listener); it stays pending until acknowledged and is
retransmitted with exponential backoff. The receiver keeps, per sender and channel, the
incarnation and a ``SeenSet`` (max_seen + complement) and hands each id to the callbacks
once. A callback that raises is neither marked seen nor acknowledged: the sender retries.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import math
import queue
import random
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from homing._failpoints import failpoint
from homing.database import Database, Transaction
from homing.errors import ConfigurationError, HomingError, InvalidArgument, PayloadTooLarge
from homing.messenger import wire
from homing.messenger.seen import SeenSet
from homing.store import messenger_queries as q

log = logging.getLogger("homing.messenger")

NOOP = 0
"""The built-in callback id for messages that expect no reply (seed: BuiltinCallback::NOOP)."""

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
_NAMED_BIT = 1 << 62
_MAX_CB = (1 << 63) - 1
_READ_BURST = 2000


class MessengerError(HomingError):
    """The messenger cannot do what was asked (see the message for what to change)."""


Callback = Callable[["Incoming"], None]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a message goes: a DEALER to ``destination``, or back through a listener's
    ROUTER to the peer with routing id ``peer``."""

    kind: str
    destination: str
    peer: bytes = b""


@dataclass(frozen=True)
class Curve:
    """CurveZMQ settings: this messenger's certificate and whom it trusts.

    ``secret_key_file``: a ``.key_secret`` file made by ``zmq.auth.create_certificates``
    (it holds the public key too). ``authorized_keys_dir``: listeners accept only clients
    whose public ``.key`` file is in this directory (None: any client that speaks CURVE,
    which encrypts but does not authenticate). ``server_public_keys``: destination ->
    the server's public ``.key`` file, needed to send to that destination.
    """

    secret_key_file: str | Path
    authorized_keys_dir: str | Path | None = None
    server_public_keys: Mapping[str, str | Path] = field(default_factory=dict)


class Incoming:
    """A message handed to a callback. ``tx`` is the open transaction in durable mode
    (``tx.connection`` for your own SQL, or the job API): your writes commit together with
    the message being marked seen. ``reply`` answers it (the sender's MSC receives it)."""

    __slots__ = (
        "_messenger",
        "_route",
        "body",
        "channel",
        "dest_cb",
        "message_id",
        "sender",
        "source_cb",
        "tx",
    )

    def __init__(
        self,
        messenger: Messenger,
        route: Route,
        msg: wire.Message,
        tx: Transaction | None,
    ) -> None:
        self._messenger = messenger
        self._route = route
        self.body: bytes = msg.body
        self.sender: str = msg.sender
        self.channel: str = msg.channel
        self.message_id: int = msg.message_id
        self.source_cb: int = msg.source_cb
        self.dest_cb: int = msg.dest_cb
        self.tx: Transaction | None = tx

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def endpoint(self) -> str:
        """The listen endpoint it arrived on, or the destination a reply came back from."""
        return self._route.destination

    def reply(self, message: bytes | str, callback: Callback | str | int = NOOP) -> None:
        """Send ``message`` back to the sender's callback; ``callback`` gets the answer to it."""
        self._messenger._send(self._route, message, callback, self.source_cb)

    def __repr__(self) -> str:
        return (
            f"<Incoming {self.sender}/{self.channel}#{self.message_id} "
            f"cb {self.source_cb}->{self.dest_cb} {len(self.body)}B>"
        )


@dataclass
class _Channel:
    name: str
    name_bytes: bytes
    route: Route
    incarnation: int
    next_id: int = 0
    stored: bool = False


@dataclass
class _Pending:
    channel: str
    message_id: int
    incarnation: int
    route: Route
    frames: list[bytes]
    attempts: int = 0
    sent_at: float = 0.0


@dataclass
class _Worker:
    index: int
    inbox: queue.SimpleQueue[list[tuple[Route, wire.Message]] | None]
    seen: dict[tuple[str, str], tuple[int, SeenSet]] = field(default_factory=dict)
    thread: threading.Thread | None = None


def _check_name(name: str, what: str) -> bytes:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty string, got {name!r}")
    raw = name.encode("utf-8")
    if len(raw) > wire.MAX_NAME_BYTES or raw[0] == 0:
        raise InvalidArgument(
            f"{what} {name!r} must be 1..{wire.MAX_NAME_BYTES} UTF-8 bytes and not start with NUL"
        )
    return raw


def _check_endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise InvalidArgument(
            f"endpoint {endpoint!r} is not supported; use tcp://host:port, ipc:///path or "
            "inproc://name"
        )
    _check_name(endpoint, "endpoint")
    return endpoint


class Messenger:
    """Send messages with callbacks; listen on endpoints with server-loop callbacks.

    ``name`` identifies this messenger to its peers (its ZeroMQ routing id and the sender
    name in every frame); it must be unique among the peers of a listener and, in durable
    mode, stable across restarts. ``db`` (from ``homing.connect``) turns on durable mode.
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
        self._name_bytes = _check_name(self.name, "messenger name")
        for what, value in (("retry_initial", retry_initial), ("retry_max", retry_max)):
            if not isinstance(value, int | float) or not value > 0:
                raise InvalidArgument(f"{what} must be a positive number of seconds, got {value!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidArgument(f"workers must be a positive integer, got {workers!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgument(f"batch must be a positive integer, got {batch!r}")
        if not isinstance(max_message_bytes, int) or max_message_bytes < 1:
            raise InvalidArgument(f"max_message_bytes must be positive, got {max_message_bytes!r}")
        self._db = db
        self.retry_initial = float(retry_initial)
        self.retry_max = float(max(retry_max, retry_initial))
        self.max_message_bytes = max_message_bytes
        self._batch = batch
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise InvalidArgument(f"window must be a positive integer, got {window!r}")
        self.window = window
        self._curve = curve
        self._curve_keys: tuple[bytes, bytes] | None = None
        if curve is not None:
            self._curve_keys = self._load_secret(curve.secret_key_file)
        self._own_context = context is None
        self._ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._incarnation = time.time_ns()
        self._lock = threading.Lock()
        self._cmds: deque[tuple[Any, ...]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._woken = False
        self._callbacks: dict[int, tuple[Callback, bool]] = {}
        self._adhoc_ids = itertools.count(secrets.randbits(62))
        self._listeners: dict[str, Callback] = {}
        self._channels: dict[str, _Channel] = {}
        self._routes: dict[str, Route] = {}  # destinations already validated
        self._workers = [_Worker(i, queue.SimpleQueue()) for i in range(workers)]
        self._acked_out: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self._unacked = 0
        self._inflight = 0
        self._acker_backlog = 0
        self._stats: dict[str, int] = dict.fromkeys(
            (
                "sent",
                "retransmits",
                "received",
                "delivered",
                "duplicates",
                "stale",
                "dropped_frames",
                "unknown_callbacks",
                "unhandled",
                "handler_errors",
                "acks_sent",
                "acks_received",
            ),
            0,
        )
        self._io: threading.Thread | None = None
        self._acker: threading.Thread | None = None
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
        if self._db is not None:
            self._resume()
        for w in self._workers:
            w.thread = threading.Thread(
                target=self._worker_loop,
                args=(w,),
                name=f"homing-messenger-w{w.index}",
                daemon=True,
            )
            w.thread.start()
        if self._db is not None:
            self._acker = threading.Thread(
                target=self._acker_loop, name="homing-messenger-acker", daemon=True
            )
            self._acker.start()
        self._io = threading.Thread(target=self._io_loop, name="homing-messenger-io", daemon=True)
        self._io.start()
        return self

    def register_callback(self, name: str, fn: Callback) -> int:
        """Register a named, persistent MSC; returns its id. Pass ``name`` as ``callback=``.

        Its id is derived from the name, so replies to messages sent by an earlier
        incarnation of a durable messenger find it after a restart.
        """
        _check_name(name, "callback name")
        if not callable(fn):
            raise InvalidArgument(f"callback {name!r} must be callable, got {fn!r}")
        cb_id = self._named_id(name)
        with self._lock:
            self._callbacks[cb_id] = (fn, False)
        return cb_id

    def listen(self, endpoint: str, server_loop_callback: Callback) -> str:
        """Bind ``endpoint`` and attach the SLC; returns the bound endpoint (tcp port 0/*
        resolved). Every message arriving there runs its MSC (if it names one), then the SLC."""
        _check_endpoint(endpoint)
        if not callable(server_loop_callback):
            raise InvalidArgument("server_loop_callback must be callable")
        self.start()
        self._start_authenticator()
        done = threading.Event()
        result: list[Any] = []
        self._post(("listen", endpoint, server_loop_callback, done, result))
        if not done.wait(30):
            raise MessengerError(f"the I/O thread did not bind {endpoint} within 30s")
        if isinstance(result[0], BaseException):
            raise result[0]
        return str(result[0])

    def _start_authenticator(self) -> None:
        """CURVE listeners need a ZAP handler; one per zmq.Context, started before binding."""
        if self._curve is None or self._auth is not None:
            return
        from zmq.auth.thread import ThreadAuthenticator

        location = self._curve.authorized_keys_dir
        if location is not None and not Path(location).is_dir():
            raise ConfigurationError(
                f"authorized_keys_dir {location} is not a directory of public .key files"
            )
        auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("homing.messenger.auth"))
        try:
            auth.start()
        except zmq.ZMQError as exc:
            raise ConfigurationError(
                "cannot start the CURVE authenticator: another one runs on this zmq.Context "
                f"({exc}); give each CURVE listener its own context"
            ) from exc
        auth.configure_curve(
            domain="*",
            location=str(location) if location is not None else zmq.auth.CURVE_ALLOW_ANY,
        )
        self._auth = auth

    def connect(self, destination: str) -> None:
        """Open the connection to ``destination`` now instead of on the first send."""
        _check_endpoint(destination)
        self._check_curve_destination(destination)
        self.start()
        self._post(("connect", destination))

    def send(
        self, destination: str, message: bytes | str, callback: Callback | str | int = NOOP
    ) -> None:
        """Buffer ``message`` for ``destination`` and return at once.

        ``callback`` (the MSC) runs with the reply when the receiver answers: a callable
        (one-shot), the name given to ``register_callback``, or ``NOOP``. There is no "was
        it sent" answer on purpose: have the receiver reply once it has persisted or
        applied the message. In durable mode the message is stored before this returns,
        inside the caller's open transaction if there is one (an outbox).
        """
        route = self._routes.get(destination)
        if route is None:
            _check_endpoint(destination)
            self._check_curve_destination(destination)
            route = self._routes[destination] = Route("dealer", destination)
        self._send(route, message, callback, NOOP)

    def send_many(
        self,
        destination: str,
        messages: list[bytes | str],
        callback: Callback | str | int = NOOP,
    ) -> None:
        """``send`` each message; in durable mode all are stored in one transaction (one
        commit instead of one per message); ``callback`` gets each reply."""
        if self._db is None:
            for message in messages:
                self.send(destination, message, callback)
            return
        with self._db.store.transaction():
            for message in messages:
                self.send(destination, message, callback)

    def unacknowledged(self) -> int:
        """Messages buffered or in flight whose acknowledgement has not arrived yet."""
        return self._unacked

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until every message is acknowledged and every delivery processed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._unacked == 0 and self._inflight == 0 and self._acker_backlog == 0:
                return True
            time.sleep(0.002)
        return False

    def stats(self) -> dict[str, int]:
        """Counters, plus the memory of duplicate tracking (keys and complement intervals)."""
        out = dict(self._stats)
        states = [s for w in self._workers for _, s in list(w.seen.values())]
        out["seen_keys"] = len(states)
        out["seen_intervals"] = sum(s.interval_count for s in states)
        out["unacknowledged"] = self._unacked
        with self._lock:
            out["callbacks"] = len(self._callbacks)
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
            if self._acker is not None:
                self._acked_out.put(None)
                self._acker.join(timeout)
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
        return (int.from_bytes(digest, "big") & (_NAMED_BIT - 1)) | _NAMED_BIT

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
                cb_id = next(self._adhoc_ids) & (_NAMED_BIT - 1) or 1
                if cb_id not in self._callbacks:
                    return cb_id, None, callback
        raise InvalidArgument(
            f"callback must be a callable, a registered name or NOOP, got {callback!r}"
        )

    def _channel(self, route: Route) -> _Channel:
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
                if ch is None:
                    ch = _Channel(name, name.encode(), route, self._incarnation)
                    self._channels[name] = ch
        return ch

    def _send(
        self, route: Route, message: bytes | str, callback: Callback | str | int, dest_cb: int
    ) -> None:
        if self._closed:
            raise MessengerError("this Messenger was closed; messages can no longer be sent")
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
        cb_id, cb_name, fn = self._callback_for(callback)
        ch = self._channel(route)
        if not self._started:
            self.start()
        if self._db is None:
            with self._lock:
                ch.next_id += 1
                message_id = ch.next_id
                if fn is not None:
                    self._callbacks[cb_id] = (fn, True)
                self._unacked += 1
            self._post(
                ("send", self._pending(ch, ch.incarnation, message_id, cb_id, dest_cb, body))
            )
            return
        db = self._db
        with db.store.transaction() as tx:
            now = db.store.clock.now()
            if not ch.stored:
                q.ensure_channel(
                    tx,
                    self.name,
                    ch.name,
                    route.kind,
                    route.destination,
                    route.peer.hex() if route.kind == "router" else None,
                    self._incarnation,
                    now,
                )
            incarnation, message_id = q.next_message_id(tx, self.name, ch.name)
            q.insert_out(
                tx,
                self.name,
                q.OutRow(ch.name, message_id, incarnation, cb_id, dest_cb, cb_name, body),
                now,
            )
            pending = self._pending(ch, incarnation, message_id, cb_id, dest_cb, body)

            def _after_commit() -> None:
                ch.stored = True
                with self._lock:
                    if fn is not None:
                        self._callbacks[cb_id] = (fn, True)
                    self._unacked += 1
                self._post(("send", pending))

            tx.call_after_commit(_after_commit)

    def _pending(
        self, ch: _Channel, incarnation: int, message_id: int, cb_id: int, dest_cb: int, body: bytes
    ) -> _Pending:
        frames = wire.encode_message(
            self._name_bytes, ch.name_bytes, incarnation, message_id, cb_id, dest_cb, body
        )
        return _Pending(ch.name, message_id, incarnation, ch.route, frames)

    def _post(self, cmd: tuple[Any, ...]) -> None:
        self._cmds.append(cmd)
        if not self._woken:
            self._woken = True
            try:
                self._wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # already full of wake-ups, or closing

    def _check_curve_destination(self, destination: str) -> None:
        if self._curve is not None and destination not in self._curve.server_public_keys:
            raise ConfigurationError(
                f"CURVE is on but no server public key is configured for {destination}; add it "
                "to Curve(server_public_keys={destination: 'server.key'})"
            )

    @staticmethod
    def _load_secret(path: str | Path) -> tuple[bytes, bytes]:
        try:
            public, secret = zmq.auth.load_certificate(str(path))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read CURVE key file {path}: {exc}") from exc
        if not secret:
            raise ConfigurationError(
                f"{path} holds no secret key; pass the .key_secret file made by "
                "zmq.auth.create_certificates"
            )
        return public, secret

    # -- durable state -----------------------------------------------------------------
    def _resume(self) -> None:
        assert self._db is not None
        with self._db.store.transaction() as tx:
            rows = q.channels(tx, self.name)
            out = q.pending_out(tx, self.name)
        by_name: dict[str, _Channel] = {}
        for r in rows:
            peer = bytes.fromhex(r.peer) if r.peer else b""
            ch = _Channel(
                r.channel, r.channel.encode(), Route(r.route, r.destination, peer), r.incarnation
            )
            ch.stored = True
            by_name[r.channel] = ch
        with self._lock:
            self._channels.update(by_name)
            self._unacked += len(out)
        for ch in by_name.values():
            if ch.route.kind == "dealer":
                self._post(("connect", ch.route.destination))
        for row in out:
            ch = by_name[row.channel]
            self._post(
                (
                    "send",
                    self._pending(
                        ch, row.incarnation, row.message_id, row.source_cb, row.dest_cb, row.body
                    ),
                )
            )
        if out:
            log.info("messenger %s resumed %d unacknowledged messages", self.name, len(out))

    def _acker_loop(self) -> None:
        assert self._db is not None
        while True:
            item = self._acked_out.get()
            batch: list[tuple[str, int]] = []
            stop = item is None
            if item is not None:
                batch.append(item)
            while len(batch) < 5000:
                try:
                    nxt = self._acked_out.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            while batch:
                try:
                    with self._db.store.transaction() as tx:
                        q.delete_out(tx, self.name, batch)
                    break
                except HomingError as exc:
                    if stop:
                        break
                    log.warning("messenger %s could not forget acked messages: %s", self.name, exc)
                    time.sleep(0.5)
            with self._lock:
                self._acker_backlog -= len(batch)
            if stop:
                return

    # -- I/O thread --------------------------------------------------------------------
    def _io_loop(self) -> None:
        io = _IO(self)
        try:
            io.run()
        except BaseException as exc:  # pragma: no cover - a bug; make it visible
            self._io_error = exc
            log.exception("messenger %s I/O thread died", self.name)
        finally:
            io.close()

    # -- workers -----------------------------------------------------------------------
    def _dispatch(self, items: list[tuple[Route, wire.Message]]) -> None:
        """Hand a burst of received messages to the workers, by sender and channel."""
        workers = self._workers
        if len(workers) == 1:
            parts = {0: items}
        else:
            parts = {}
            for item in items:
                msg = item[1]
                parts.setdefault(hash((msg.sender, msg.channel)) % len(workers), []).append(item)
        with self._lock:
            self._inflight += len(items)
        for index, part in parts.items():
            workers[index].inbox.put(part)

    def _worker_loop(self, w: _Worker) -> None:
        while True:
            item = w.inbox.get()
            if item is None:
                return
            batch = list(item)
            stop = False
            while len(batch) < self._batch:
                try:
                    nxt = w.inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch += nxt
            try:
                self._process(w, batch)
            except Exception:
                log.exception("messenger %s failed to process %d messages", self.name, len(batch))
            finally:
                with self._lock:
                    self._inflight -= len(batch)
            if stop:
                return

    def _process(self, w: _Worker, batch: list[tuple[Route, wire.Message]]) -> None:
        acks: dict[tuple[Route, str, int], list[int]] = {}
        done_callbacks: list[int] = []
        if self._db is None:
            self._apply(batch, w.seen, None, acks, done_callbacks, None)
            failpoint("messenger.after_seen_update")
        else:
            states: dict[tuple[str, str], tuple[int, SeenSet]] = {}
            dirty: set[tuple[str, str]] = set()
            try:
                with self._db.transaction() as t:
                    self._apply(batch, states, t, acks, done_callbacks, dirty)
                    now = self._db.store.clock.now()
                    for key in dirty:
                        incarnation, seen = states[key]
                        q.save_seen(
                            t.tx, self.name, key[0], key[1], incarnation, seen.max_seen,
                            seen.encode(), now,
                        )  # fmt: skip
                    failpoint("messenger.after_seen_update")
            except HomingError as exc:
                log.warning(
                    "messenger %s: store failed for %d messages, they will be retried: %s",
                    self.name, len(batch), exc,
                )  # fmt: skip
                return
        failpoint("messenger.after_apply_before_ack")
        if done_callbacks:
            with self._lock:
                for cb_id in done_callbacks:
                    self._callbacks.pop(cb_id, None)
        for (route, channel, incarnation), ids in acks.items():
            self._post(("ack", route, channel, incarnation, ids))

    def _apply(
        self,
        batch: list[tuple[Route, wire.Message]],
        states: dict[tuple[str, str], tuple[int, SeenSet]],
        t: Transaction | None,
        acks: dict[tuple[Route, str, int], list[int]],
        done_callbacks: list[int],
        dirty: set[tuple[str, str]] | None,
    ) -> None:
        stats: dict[str, int] = dict.fromkeys(
            (
                "stale",
                "duplicates",
                "unknown_callbacks",
                "unhandled",
                "handler_errors",
                "delivered",
            ),
            0,
        )
        try:
            self._apply_items(batch, states, t, acks, done_callbacks, dirty, stats)
        finally:
            with self._lock:
                for k, v in stats.items():
                    self._stats[k] += v

    def _apply_items(
        self,
        batch: list[tuple[Route, wire.Message]],
        states: dict[tuple[str, str], tuple[int, SeenSet]],
        t: Transaction | None,
        acks: dict[tuple[Route, str, int], list[int]],
        done_callbacks: list[int],
        dirty: set[tuple[str, str]] | None,
        stats: dict[str, int],
    ) -> None:
        for route, msg in batch:
            key = (msg.sender, msg.channel)
            state = states.get(key)
            if state is None and t is not None:
                row = q.load_seen(t.tx, self.name, msg.sender, msg.channel)
                if row is not None:
                    state = (row[0], SeenSet.decode(row[1], row[2]))
            if state is None or msg.incarnation > state[0]:
                state = (msg.incarnation, SeenSet())  # a new sender, or it restarted
                if dirty is not None:
                    dirty.add(key)
            states[key] = state
            incarnation, seen = state
            ack_key = (route, msg.channel, msg.incarnation)
            if msg.incarnation < incarnation:
                stats["stale"] += 1
                acks.setdefault(ack_key, []).append(msg.message_id)
                continue
            if not seen.peek(msg.message_id):
                stats["duplicates"] += 1
                acks.setdefault(ack_key, []).append(msg.message_id)
                continue
            msc: Callback | None = None
            one_shot = False
            if msg.dest_cb != NOOP:
                entry = self._callbacks.get(msg.dest_cb)
                if entry is None:
                    stats["unknown_callbacks"] += 1
                    log.warning(
                        "messenger %s: dropped message %s/%s#%d for unknown callback id %d",
                        self.name, msg.sender, msg.channel, msg.message_id, msg.dest_cb,
                    )  # fmt: skip
                    self._mark(seen, key, msg, dirty, acks, ack_key)
                    continue
                msc, one_shot = entry
            slc = self._listeners.get(route.destination) if route.kind == "router" else None
            if msc is None and slc is None:
                stats["unhandled"] += 1
                log.warning(
                    "messenger %s: dropped message %s/%s#%d: no callback and no listener for it",
                    self.name, msg.sender, msg.channel, msg.message_id,
                )  # fmt: skip
                self._mark(seen, key, msg, dirty, acks, ack_key)
                continue
            incoming = Incoming(self, route, msg, t)
            mark = len(t.tx._after_commit) if t is not None else 0
            if t is not None:
                q.savepoint(t.tx)
            try:
                if msc is not None:
                    msc(incoming)
                if slc is not None:
                    slc(incoming)
            except Exception:
                stats["handler_errors"] += 1
                log.exception(
                    "messenger %s: callback failed on %s/%s#%d; it will run again on the "
                    "sender's retry",
                    self.name, msg.sender, msg.channel, msg.message_id,
                )  # fmt: skip
                if t is not None:
                    q.rollback_to_savepoint(t.tx)
                    # the rolled-back part's after-commit actions (sends) must not run
                    del t.tx._after_commit[mark:]
                continue
            if t is not None:
                q.release_savepoint(t.tx)
            stats["delivered"] += 1
            if one_shot:
                done_callbacks.append(msg.dest_cb)
            self._mark(seen, key, msg, dirty, acks, ack_key)

    @staticmethod
    def _mark(
        seen: SeenSet,
        key: tuple[str, str],
        msg: wire.Message,
        dirty: set[tuple[str, str]] | None,
        acks: dict[tuple[Route, str, int], list[int]],
        ack_key: tuple[Route, str, int],
    ) -> None:
        seen.mark(msg.message_id)
        if dirty is not None:
            dirty.add(key)
        acks.setdefault(ack_key, []).append(msg.message_id)


class _IO:
    """State owned by the I/O thread only: sockets, pending messages, retry timers."""

    def __init__(self, m: Messenger) -> None:
        self.m = m
        self.poller = zmq.Poller()
        self.routers: dict[str, zmq.Socket[Any]] = {}
        self.dealers: dict[str, zmq.Socket[Any]] = {}
        self.kind_of: dict[zmq.Socket[Any], tuple[str, str]] = {}
        self.pending: dict[tuple[str, int], _Pending] = {}
        self.timers: list[tuple[float, int, str, int, int]] = []
        self.seq = itertools.count()
        self.backlog: dict[str, deque[tuple[str, int]]] = {}
        # per channel: messages transmitted and not acked, and those waiting for the window
        self.in_flight: dict[str, int] = {}
        self.waiting: dict[str, deque[_Pending]] = {}
        self.wake = m._wake_r.fileno()
        self.poller.register(self.wake, zmq.POLLIN)
        self.running = True
        # retransmission timeout from measured round trips (RFC 6298, Karn's rule)
        self.monitors: dict[zmq.Socket[Any], str] = {}
        self.stalled: set[str] = set()  # channels with messages retransmitted twice or more
        self.srtt: float | None = None
        self.rttvar = 0.0

    # sockets
    def _common(self, s: zmq.Socket[Any]) -> None:
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.RCVHWM, 100_000)
        s.setsockopt(zmq.MAXMSGSIZE, 2 * self.m.max_message_bytes + 65536)

    def listen(self, endpoint: str, slc: Callback) -> str:
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

    def dealer(self, destination: str) -> zmq.Socket[Any]:
        s = self.dealers.get(destination)
        if s is not None:
            return s
        m = self.m
        s = m._ctx.socket(zmq.DEALER)
        self._common(s)
        s.setsockopt(zmq.ROUTING_ID, m._name_bytes)
        if m._curve is not None and m._curve_keys is not None:
            s.curve_publickey, s.curve_secretkey = m._curve_keys
            server_public, _ = zmq.auth.load_certificate(
                str(m._curve.server_public_keys[destination])
            )
            s.curve_serverkey = server_public
        # (re)connections are reported, to greet the listener and retransmit at once
        monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.monitors[monitor] = destination
        self.poller.register(monitor, zmq.POLLIN)
        s.connect(destination)
        self.dealers[destination] = s
        self.kind_of[s] = ("dealer", destination)
        self.poller.register(s, zmq.POLLIN)
        return s

    def on_connected(self, monitor: zmq.Socket[Any]) -> None:
        from zmq.utils.monitor import recv_monitor_message

        destination = self.monitors[monitor]
        while True:
            try:
                recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
        try:
            self.dealers[destination].send_multipart(
                wire.encode_hello(self.m._name_bytes), zmq.NOBLOCK
            )
        except zmq.ZMQError:
            pass
        self.kick(Route("dealer", destination))

    def kick(self, route: Route) -> None:
        """The peer on ``route`` is reachable again: retransmit its stalled messages now."""
        channels = self.m._channels
        hit = {c for c in self.stalled if c in channels and channels[c].route == route}
        if not hit:
            return
        self.stalled -= hit
        now = time.monotonic()
        for p in list(self.pending.values()):
            if p.channel in hit and p.sent_at:
                p.attempts += 1  # makes its old timer stale
                self.m._stats["retransmits"] += 1
                self.transmit(p)
                self.schedule(p, now, self.rto())

    # sending
    def transmit(self, p: _Pending) -> None:
        route = p.route
        if route.kind == "dealer":
            waiting = self.backlog.get(route.destination)
            if waiting:
                waiting.append((p.channel, p.message_id))
                return
            try:
                self.dealer(route.destination).send_multipart(p.frames, zmq.NOBLOCK)
            except zmq.Again:
                self.backlog[route.destination] = deque([(p.channel, p.message_id)])
                self.poller.modify(self.dealers[route.destination], zmq.POLLIN | zmq.POLLOUT)
            except zmq.ZMQError as exc:
                log.warning(
                    "messenger %s: send to %s failed: %s", self.m.name, route.destination, exc
                )
            return
        s = self.routers.get(route.destination)
        if s is None:
            return  # not listening there (yet): the retry timer tries again
        try:
            s.send_multipart([route.peer, *p.frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # peer not connected (EHOSTUNREACH) or full: the retry timer tries again

    def first_transmit(self, p: _Pending, now: float) -> None:
        self.in_flight[p.channel] = self.in_flight.get(p.channel, 0) + 1
        p.sent_at = now
        self.m._stats["sent"] += 1
        self.transmit(p)
        self.schedule(p, now)

    def open_window(self, channel: str, now: float) -> None:
        waiting = self.waiting.get(channel)
        window = self.m.window
        while waiting and self.in_flight.get(channel, 0) < window:
            p = waiting.popleft()
            if (p.channel, p.message_id) in self.pending:
                self.first_transmit(p, now)
        if waiting is not None and not waiting:
            del self.waiting[channel]

    def flush_backlog(self, destination: str) -> None:
        waiting = self.backlog.get(destination)
        s = self.dealers[destination]
        while waiting:
            p = self.pending.get(waiting[0])
            if p is not None:
                try:
                    s.send_multipart(p.frames, zmq.NOBLOCK)
                except zmq.Again:
                    return
            waiting.popleft()
        self.backlog.pop(destination, None)
        self.poller.modify(s, zmq.POLLIN)

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

    def schedule(self, p: _Pending, now: float, delay: float | None = None) -> None:
        if delay is None:
            delay = min(self.m.retry_max, self.rto() * (2 ** min(p.attempts, 30)))
        delay *= 0.8 + 0.4 * random.random()  # jitter
        heapq.heappush(
            self.timers, (now + delay, next(self.seq), p.channel, p.message_id, p.attempts)
        )

    def fire_timers(self, now: float) -> None:
        timers = self.timers
        fired = 0
        while timers and timers[0][0] <= now and fired < 5000:
            _, _, channel, message_id, attempts = heapq.heappop(timers)
            p = self.pending.get((channel, message_id))
            if p is None or p.attempts != attempts:
                continue
            p.attempts += 1
            fired += 1
            if p.attempts >= 2:
                self.stalled.add(p.channel)
            self.m._stats["retransmits"] += 1
            self.transmit(p)
            self.schedule(p, now)

    def send_ack(self, route: Route, channel: str, incarnation: int, ids: list[int]) -> None:
        frames = wire.encode_ack(self.m._name_bytes, channel.encode(), incarnation, ids)
        try:
            if route.kind == "dealer":
                self.dealer(route.destination).send_multipart(frames, zmq.NOBLOCK)
            else:
                s = self.routers.get(route.destination)
                if s is None:
                    return
                s.send_multipart([route.peer, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            return  # lost ack: the sender retransmits and we ack the duplicate
        self.m._stats["acks_sent"] += 1
        failpoint("messenger.after_ack_sent")

    # receiving
    def on_ack(self, route: Route, ack: wire.Ack) -> None:
        m = self.m
        m._stats["acks_received"] += 1
        removed = 0
        now = time.monotonic()
        for message_id in ack.ids:
            key = (ack.channel, message_id)
            p = self.pending.get(key)
            if p is None or p.incarnation != ack.incarnation or p.route != route:
                continue
            del self.pending[key]
            # not transmitted yet (waiting for the window) means an earlier process sent it
            if p.sent_at:
                if p.attempts == 0:
                    self.sample_rtt(now - p.sent_at)
                self.in_flight[ack.channel] -= 1
            removed += 1
            if m._db is not None:
                m._acked_out.put(key)
        if removed:
            self.open_window(ack.channel, now)
            with m._lock:
                m._unacked -= removed
                if m._db is not None:
                    m._acker_backlog += removed

    def read(self, s: zmq.Socket[Any]) -> None:
        received: list[tuple[Route, wire.Message]] = []
        try:
            self._read(s, received)
        finally:
            if received:
                self.m._stats["received"] += len(received)
                self.m._dispatch(received)

    def _read(self, s: zmq.Socket[Any], received: list[tuple[Route, wire.Message]]) -> None:
        m = self.m
        kind, where = self.kind_of[s]
        for _ in range(_READ_BURST):
            try:
                frames = s.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if kind == "router":
                peer, frames = frames[0], frames[1:]
                route = Route("router", where, peer)
            else:
                route = Route("dealer", where)
            try:
                decoded = wire.decode(frames, m.max_message_bytes)
            except wire.FrameError as exc:
                m._stats["dropped_frames"] += 1
                log.warning(
                    "messenger %s: dropped a malformed message on %s: %s", m.name, where, exc
                )
                continue
            if self.stalled:
                self.kick(route)
            if isinstance(decoded, wire.Ack):
                self.on_ack(route, decoded)
            elif isinstance(decoded, wire.Hello):
                pass  # the kick above was its purpose
            else:
                if decoded.source_cb > _MAX_CB or decoded.dest_cb > _MAX_CB:
                    m._stats["dropped_frames"] += 1
                    log.warning(
                        "messenger %s: dropped a message with a callback id over 2**63", m.name
                    )
                    continue
                received.append((route, decoded))

    def commands(self, now: float) -> None:
        m = self.m
        cmds = m._cmds
        while cmds:
            cmd = cmds.popleft()
            op = cmd[0]
            if op == "send":
                p: _Pending = cmd[1]
                key = (p.channel, p.message_id)
                if key in self.pending:
                    with m._lock:
                        m._unacked -= 1
                    continue
                self.pending[key] = p
                if self.in_flight.get(p.channel, 0) < m.window:
                    self.first_transmit(p, now)
                else:
                    self.waiting.setdefault(p.channel, deque()).append(p)
            elif op == "ack":
                self.send_ack(cmd[1], cmd[2], cmd[3], cmd[4])
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
                if ev & zmq.POLLIN:
                    self.read(sock)
                if ev & zmq.POLLOUT:
                    kind, where = self.kind_of[sock]
                    if kind == "dealer":
                        self.flush_backlog(where)
            self.fire_timers(now)

    def close(self) -> None:
        for dealer in self.dealers.values():
            try:
                dealer.disable_monitor()
            except zmq.ZMQError:
                pass
        for s in {*self.routers.values(), *self.dealers.values(), *self.monitors}:
            s.close(0)
