"""Reliable HTTP on a sharded store: a message id decides its shard, on both sides.

- ``ShardedSender``: one ``Sender`` (outbox, dispatcher) per shard. A message goes to the
  next live shard, or to the shard of the transaction it is sent in, and gets an id that
  this shard owns (rendezvous hashing, as for job unique keys): so ``wait(msg_id)``, the
  dispatcher's rows and the job result that comes back for it all meet on one shard.
- ``ShardedReceiver``: one ``Receiver`` (inbox, handler worker, reply dispatcher) per shard
  behind one ASGI app that routes each request by the message id it names
  (``Homing-Message-Id``, ``Homing-In-Reply-To`` for job results, the id in
  ``/_homing/inbox/{id}``, ``webhook-id``, ``Idempotency-Key``): a repeat of a message
  always reaches the inbox that holds the first copy, so it is dropped as before, and the
  handler runs in that shard's transaction (its tables must exist on every shard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from homing import ids
from homing.database import Transaction
from homing.errors import CrossShardWrite, InvalidArgument, StoreUnreachable
from homing.http import wire
from homing.http.receiver import Handler, Receiver
from homing.http.sender import REPLY_PATH, Pending, Sender
from homing.sharding import ShardedDatabase, owner
from homing.sharding.transaction import ShardTransaction
from homing.store.protocol import Tx

_INBOX = "/_homing/inbox/"
_ROUTE_HEADERS = (wire.MESSAGE_ID.encode(), b"webhook-id", b"idempotency-key")


def id_on(shard: int, shards: int) -> Callable[[], str]:
    """A maker of message ids (UUIDv7) that shard ``shard`` of ``shards`` owns."""

    def make() -> str:
        while True:  # n tries on average: a hash each, no I/O
            candidate = ids.uuid7()
            if owner(candidate, shards) == shard:
                return candidate

    return make


def _check(db: Any, what: str) -> ShardedDatabase:
    if not isinstance(db, ShardedDatabase):
        raise InvalidArgument(
            f"{what} needs a homing.ShardedDatabase (homing.connect([url, url])), "
            f"got {type(db).__name__}; for one store use {what.replace('Sharded', '')}"
        )
    return db


class ShardedSender:
    """``Sender`` over a sharded store (the same calls; options as ``Sender``'s)."""

    def __init__(self, db: ShardedDatabase, **options: Any) -> None:
        self.db = _check(db, "ShardedSender")
        n = len(db.shards)
        self.senders = [Sender(s, **options) for s in db.shards]
        for i, sender in enumerate(self.senders):
            sender.new_id = id_on(i, n)

    def _for(self, tx: Transaction | Tx | None) -> Sender:
        if isinstance(tx, ShardTransaction):
            index = tx.shard
        elif tx is not None:
            raise CrossShardWrite(
                "on a sharded store, send inside a transaction from db.transaction(...) "
                "(it knows its shard), not a raw or single-store transaction"
            )
        else:
            index = self.db._next_live(self.db._rr)
        self.db.health[index].check()
        return self.senders[index]

    def sender_for(self, msg_id: str) -> Sender:
        """The per-shard sender whose outbox holds ``msg_id``."""
        if not ids.is_uuid(msg_id):
            raise InvalidArgument(f"{msg_id!r} is not a message id")
        return self.senders[owner(msg_id, len(self.senders))]

    def put(self, url: str, body: Any, *, tx: Transaction | Tx | None = None, **kw: Any) -> Any:
        return self._retrying(lambda s: s.put(url, body, tx=tx, **kw), tx)

    def send(self, url: str, body: Any, *, tx: Transaction | Tx | None = None, **kw: Any) -> Any:
        return self._retrying(lambda s: s.send(url, body, tx=tx, **kw), tx)

    def perform_job(
        self, url: str, local_url: str, body: Any, *, tx: Transaction | Tx | None = None, **kw: Any
    ) -> Any:
        return self._retrying(lambda s: s.perform_job(url, local_url, body, tx=tx, **kw), tx)

    def enqueue(
        self, kind: str, url: str, body: Any, *, tx: Transaction | Tx | None = None, **kw: Any
    ) -> Pending:
        result: Pending = self._retrying(lambda s: s.enqueue(kind, url, body, tx=tx, **kw), tx)
        return result

    def _retrying(self, call: Callable[[Sender], Any], tx: Transaction | Tx | None) -> Any:
        """Outside a transaction, a shard that cannot be reached (nothing was stored) is
        marked down and the next live shard takes the message."""
        for _ in range(len(self.senders)):
            sender = self._for(tx)
            index = self.senders.index(sender)
            try:
                return call(sender)
            except StoreUnreachable as exc:
                self.db._mark_down(index, exc)
                if tx is not None:
                    raise
        raise StoreUnreachable("no shard could store the message: every shard is down")

    def poll(self, msg_id: str) -> tuple[bool, Any]:
        return self.sender_for(msg_id).poll(msg_id)

    def wait(self, msg_id: str, *, timeout: float | None = None) -> Any:
        return self.sender_for(msg_id).wait(msg_id, timeout=timeout)

    def close(self) -> None:
        for sender in self.senders:
            sender.close()

    def __enter__(self) -> ShardedSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShardedReceiver:
    """``Receiver`` over a sharded store: ``app`` is the ASGI app to serve; register nodes
    with ``node``/``add_node`` as on ``Receiver`` (they are registered on every shard)."""

    def __init__(self, db: ShardedDatabase, **options: Any) -> None:
        self.db = _check(db, "ShardedReceiver")
        # no batches: a batch names no one message id, so it has no shard to go to
        options = {**options, "batches": False}
        self.receivers = [Receiver(s, **options) for s in db.shards]
        self.reply_path = self.receivers[0].reply_path
        self.app = self  # the ASGI app, as ``Receiver.app``

    def node(self, path: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.add_node(path, fn)
            return fn

        return register

    def add_node(self, path: str, handler: Handler) -> None:
        for receiver in self.receivers:
            receiver.add_node(path, handler)

    @property
    def nodes(self) -> list[str]:
        return self.receivers[0].nodes

    @property
    def stats(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for receiver in self.receivers:
            for k, v in receiver.stats.items():
                total[k] = total.get(k, 0) + v
        return total

    def start(self) -> ShardedReceiver:
        for receiver in self.receivers:
            receiver.start()
        return self

    def stop(self) -> None:
        for receiver in self.receivers:
            receiver.stop()

    def shard_of(self, scope: dict[str, Any]) -> int:
        """The shard a request belongs to: that of the message id it names (shard 0 for a
        request that names none; the receiver refuses it there)."""
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        key: bytes | str | None = None
        if path.endswith(self.reply_path):
            key = headers.get(wire.IN_REPLY_TO.lower().encode())
        elif _INBOX in path:
            key = path.rsplit(_INBOX, 1)[1]
        else:
            key = next((headers[h] for h in _ROUTE_HEADERS if h in headers), None)
        if isinstance(key, bytes):
            key = key.decode("latin-1")
        return owner(key.strip(), len(self.receivers)) if key else 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.receivers[self.shard_of(scope)].app(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        from starlette.concurrency import run_in_threadpool

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await run_in_threadpool(self.start)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await run_in_threadpool(self.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return


__all__ = ["REPLY_PATH", "ShardedReceiver", "ShardedSender", "id_on"]
