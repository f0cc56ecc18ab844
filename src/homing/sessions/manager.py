"""The queue manager's side of client sessions (seed 004): open, attach, look up, clean."""

from __future__ import annotations

from homing.clock import Clock
from homing.database import Database
from homing.errors import ConfigurationError, InvalidArgument
from homing.jobs import check_seconds
from homing.sessions._model import (
    DEFAULT_KEEP_REPLIES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_RETENTION_S,
    DEFAULT_SESSION_TTL_S,
    RequestNotFound,
    RequestRecord,
    SessionInfo,
    check_keep,
    check_name,
    decode,
    no_session,
)
from homing.sessions.client import Session
from homing.store import sessions_queries as q
from homing.store.protocol import Store


class Sessions:
    """The queue manager's side of client sessions, on one homing store.

    ``keep_replies`` is the default n of "the last n replies dequeued" a session remembers
    until the client confirms them; ``retention`` is how long finished requests stay
    available to ``lookup`` (then ``gc`` deletes them); ``session_ttl`` is how long a
    session may stay idle (no client action) before ``gc`` expires it, with its prepared
    requests, its unanswered requests and its untaken replies.
    """

    def __init__(
        self,
        db: Database,
        *,
        keep_replies: int = DEFAULT_KEEP_REPLIES,
        retention: float = DEFAULT_RETENTION_S,
        session_ttl: float = DEFAULT_SESSION_TTL_S,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if not isinstance(db, Database):
            raise ConfigurationError(
                f"Sessions needs one homing.Database (homing.connect(url) with one URL), "
                f"got {type(db).__name__}; sessions do not span shards"
            )
        self.db = db
        self.store: Store = db.store
        keep = check_keep(keep_replies)
        assert keep is not None
        self.keep_replies = keep
        self.retention = check_seconds("retention", retention, allow_zero=True)
        self.session_ttl = check_seconds("session_ttl", session_ttl, allow_zero=False)
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
            raise InvalidArgument(f"max_body_bytes must be an integer, got {max_body_bytes!r}")
        if max_body_bytes < 2:
            raise InvalidArgument(f"max_body_bytes must be at least 2, got {max_body_bytes!r}")
        self.max_body_bytes = max_body_bytes

    @property
    def clock(self) -> Clock:
        return self.store.clock

    def open(self, client_id: str, *, keep_replies: int | None = None) -> Session:
        """Open the session of ``client_id``; if it exists, re-establish it (state kept).

        Each open starts a new epoch: a handle from an earlier open (another process, or a
        crashed incarnation that is in fact still running) is fenced and gets
        ``SessionFenced`` on its next step, so only the newest opener acts.
        """
        client_id = check_name("client_id", client_id)
        keep = check_keep(keep_replies)
        with self.store.transaction() as tx:
            row, created = q.open_session(
                tx,
                client_id,
                now=self.clock.now(),
                keep_replies=keep,
                default_keep=self.keep_replies,
                ttl=self.session_ttl,
            )
        return Session(self, client_id, created=created, epoch=int(row["epoch"]))

    def attach(self, client_id: str) -> Session:
        """The existing session of ``client_id`` at its current epoch, without starting a
        new one (a second handle of the live opener; fenced like it by a later ``open``).

        Raises ``SessionNotFound`` if the client never opened one (or closed it).
        """
        client_id = check_name("client_id", client_id)
        with self.store.transaction(write=False) as tx:
            row = q.get_session(tx, client_id)
        if row is None:
            raise no_session(client_id)
        return Session(self, client_id, created=False, epoch=int(row["epoch"]))

    def info(self, client_id: str) -> SessionInfo:
        """The stored session: LastRequest/LastEnqueuedID/LastDequeuedID and what it tracks."""
        client_id = check_name("client_id", client_id)
        with self.store.transaction(write=False) as tx:
            s = q.get_session(tx, client_id)
            if s is None:
                raise no_session(client_id)
            rows = q.session_requests(tx, client_id)
            prepared = q.list_prepared(tx, client_id)
        return SessionInfo(
            client_id=client_id,
            created_at=float(s["created_at"]),
            reconnected_at=float(s["reconnected_at"]),
            connects=int(s["connects"]),
            keep_replies=int(s["keep_replies"]),
            last_request_id=s["last_request_id"],
            last_enqueued_id=s["last_enqueued_id"],
            last_dequeued_id=s["last_dequeued_id"],
            unfinished=[str(r["id"]) for r in rows if r["state"] != "taken"],
            dequeued=[str(r["id"]) for r in rows if r["state"] == "taken"],
            epoch=int(s["epoch"]),
            active_at=None if s["active_at"] is None else float(s["active_at"]),
            prepared=[str(p["id"]) for p in prepared],
        )

    def lookup(self, request_id: str) -> RequestRecord:
        """Status and reply of any request within the retention period, by id."""
        request_id = check_name("request id", request_id)
        with self.store.transaction(write=False) as tx:
            row = q.get_request(tx, request_id)
        if row is None:
            raise RequestNotFound(
                f"no request {request_id!r}: it was never submitted, or it finished more than "
                f"the retention period ({self.retention:g}s) ago and was deleted"
            )
        return RequestRecord(
            id=str(row["id"]),
            client_id=str(row["client_id"]),
            queue=str(row["queue"]),
            state=str(row["state"]),
            body=decode(row["body"]),
            reply=decode(row["reply"]),
            error=row["reply_error"],
            attempts=int(row["attempts"]),
            last_error=row["last_error"],
            server=row["server"],
            created_at=float(row["created_at"]),
            replied_at=row["replied_at"],
            taken_at=row["taken_at"],
            confirmed_at=row["confirmed_at"],
        )

    def gc(self, *, older_than: float | None = None) -> int:
        """Delete requests whose reply was taken more than ``older_than`` (default: the
        retention) seconds ago and that no session still remembers; returns how many."""
        keep = (
            self.retention
            if older_than is None
            else check_seconds("older_than", older_than, allow_zero=True)
        )
        with self.store.transaction() as tx:
            return q.gc(tx, taken_before=self.clock.now() - keep)

    def expire(self, *, idle_for: float | None = None, batch: int = 1000) -> int:
        """Delete sessions idle for more than ``idle_for`` seconds (default: the
        ``session_ttl``) and for longer than the TTL their opener promised, each with its
        prepared requests, unanswered requests and untaken replies; returns how many
        sessions. Runs in batches of ``batch`` sessions."""
        ttl = (
            self.session_ttl
            if idle_for is None
            else check_seconds("idle_for", idle_for, allow_zero=False)
        )
        total = 0
        while True:
            with self.store.transaction() as tx:
                now = self.clock.now()
                n = q.expire_sessions(tx, idle_before=now - ttl, now=now, limit=batch)
            total += n
            if n < batch:
                return total

    def table_sizes(self) -> dict[str, int]:
        """Rows in each sessions table (what ``gc`` and ``expire`` keep bounded)."""
        with self.store.transaction(write=False) as tx:
            return q.table_sizes(tx)

    def queue_depths(self) -> list[tuple[str, str, int]]:
        """(queue, state, count) of requests not yet taken: queued and replied."""
        with self.store.transaction(write=False) as tx:
            return q.queue_depths(tx)
