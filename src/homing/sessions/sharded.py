"""Sessions on a sharded store: a session, its requests and its replies live on one shard.

The shard of a session is the one that rendezvous hashing picks for its ``client_id``
(the same placement as job unique keys), so every transaction of the protocol (submit,
process, take the reply, recover) is a transaction of that one shard, exactly as on a
single store: the exactly-once argument of docs/sessions.md holds per shard unchanged.
``ShardedServer`` serves a queue on every shard (one ``Server`` per shard, in rotation).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from homing.database import Database
from homing.errors import ConfigurationError, StoreUnavailable
from homing.sessions._model import RequestNotFound, RequestRecord, SessionInfo
from homing.sessions.client import Session
from homing.sessions.manager import Sessions
from homing.sessions.server import RequestHandler, Server
from homing.sharding import ShardedDatabase


def _check(db: Any, what: str) -> ShardedDatabase:
    if not isinstance(db, ShardedDatabase):
        raise ConfigurationError(
            f"{what} needs a homing.ShardedDatabase (homing.connect([url, url])), "
            f"got {type(db).__name__}"
        )
    return db


class ShardedSessions:
    """``Sessions`` over a sharded store (options as ``Sessions``'s)."""

    def __init__(self, db: ShardedDatabase, **options: Any) -> None:
        self.db = _check(db, "ShardedSessions")
        self.managers = [Sessions(s, **options) for s in db.shards]

    def shard_of(self, client_id: str) -> int:
        return self.db.shard_for_key(client_id)

    def database_for(self, client_id: str) -> Database:
        """The shard holding ``client_id``'s session (write your own rows there to commit
        them with the session's transactions)."""
        return self.db.shards[self.shard_of(client_id)]

    def _for(self, client_id: str) -> Sessions:
        index = self.shard_of(client_id)
        self.db.health[index].check()
        return self.managers[index]

    def open(self, client_id: str, *, keep_replies: int | None = None) -> Session:
        return self._for(client_id).open(client_id, keep_replies=keep_replies)

    def attach(self, client_id: str) -> Session:
        return self._for(client_id).attach(client_id)

    def info(self, client_id: str) -> SessionInfo:
        return self._for(client_id).info(client_id)

    def lookup(self, request_id: str) -> RequestRecord:
        """A request by id, on whichever live shard has it."""
        for index in self.db._live():
            try:
                return self.managers[index].lookup(request_id)
            except RequestNotFound:
                continue
        raise RequestNotFound(f"no request {request_id!r} on any live shard")

    def gc(self, *, older_than: float | None = None) -> int:
        return sum(self._each(lambda m: m.gc(older_than=older_than)))

    def expire(self, *, idle_for: float | None = None, batch: int = 1000) -> int:
        return sum(self._each(lambda m: m.expire(idle_for=idle_for, batch=batch)))

    def _each(self, fn: Any) -> list[Any]:
        out = []
        for index in self.db._live():
            try:
                out.append(fn(self.managers[index]))
            except StoreUnavailable as exc:
                self.db._mark_down(index, exc)
        return out


class ShardedServer:
    """Serves ``queues`` on every shard: one ``Server`` per shard (options as ``Server``'s)."""

    def __init__(
        self,
        db: ShardedDatabase,
        queues: str | Sequence[str],
        handler: RequestHandler,
        **options: Any,
    ) -> None:
        self.db = _check(db, "ShardedServer")
        self.servers = [Server(s, queues, handler, **options) for s in db.shards]

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        until_idle: bool = False,
        idle_wait: float = 0.2,
    ) -> int:
        """Serve every shard (a thread per shard) until ``stop`` is set (or idle); returns
        how many requests were handled. A shard that is down is retried, not fatal."""
        stop = stop or threading.Event()
        counts = [0] * len(self.servers)

        def serve(i: int) -> None:
            while not stop.is_set():
                try:
                    counts[i] += self.servers[i].run(
                        stop, until_idle=until_idle, idle_wait=idle_wait
                    )
                    if until_idle:
                        return
                except StoreUnavailable as exc:
                    self.db._mark_down(i, exc)
                    stop.wait(1.0)

        threads = [
            threading.Thread(target=serve, args=(i,), name=f"homing-sessions-shard-{i}")
            for i in range(len(self.servers))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    def process_one(self) -> bool:
        """Process one due request from the first live shard that has one."""
        return any(self.servers[i].process_one() for i in self.db._live())


__all__ = ["ShardedServer", "ShardedSessions"]
