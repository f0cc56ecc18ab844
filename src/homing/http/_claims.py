"""A dispatcher's claims on outbox rows: taken from the store, handed over at enqueue,
released at a stop or after a crash.

Hand-off: without it, a row enqueued in a transaction is committed unclaimed, and the dispatcher
then claims it in a write transaction of its own: on SQLite, one more turn of the one
write lock that every worker process of the store shares (the pipeline's delivery workers
spent a quarter of their write transactions on claims). With it, the enqueue stores the
row already claimed by the local dispatcher (its token, a lease of ``claim_lease``), and
once the transaction commits the row goes to the dispatcher in memory. Nothing else
changes: only the token's holder may record an outcome, a crashed process's claims are
released by the next dispatcher on its host (or expire with their lease), and a graceful
stop releases every claim of its token, handed-off rows included.

The queue is bounded (``bound`` rows waiting): past it, an enqueue stores the row
unclaimed, for any dispatcher's claim, as before.
"""

from __future__ import annotations

import collections
import os
import socket
import threading

from homing import ids
from homing._process import alive
from homing.database import Database
from homing.store import http_queries as q


def claim_due(db: Database, token: str, lease: float, limit: int) -> list[q.OutboxRow]:
    """Due rows claimed from the store. A claim is a lease: it need not wait for the disk
    (``Store.statement``); forgotten in a power loss, the rows are claimed again and the
    receiver drops the repeat."""
    now = db.clock.now()
    with db.store.statement(durable=False) as tx:
        return q.claim_work(tx, now=now, until=now + lease, token=token, limit=min(limit, 64))


def release_claims(db: Database, token: str) -> None:
    with db.store.transaction() as tx:
        q.release_claims(tx, token)


def release_dead_claims(db: Database) -> None:
    """Rows claimed by a dispatcher on this host whose process is gone are due at once
    (no need to wait for the claim lease: a restarted sender resumes immediately)."""
    host = socket.gethostname()
    with db.store.transaction() as tx:
        for token in q.live_claims(tx, now=db.clock.now()):
            t_host, _, rest = token.partition(":")
            pid = rest.split(":", 1)[0]
            if t_host == host and pid.isdigit() and not alive(int(pid)):
                q.release_claims(tx, token)


def new_token() -> str:
    """host:pid:uuid7, so that a dispatcher on the same host can tell a dead holder."""
    return f"{socket.gethostname()}:{os.getpid()}:{ids.uuid7()}"


class Handoff:
    """The local dispatcher's claim token while it runs, and the rows handed to it."""

    def __init__(self, bound: int, lease: float) -> None:
        self.bound = bound
        self.lease = lease
        self._token: str | None = None
        self._rows: collections.deque[q.OutboxRow] = collections.deque()
        self._lock = threading.Lock()

    def open(self, token: str) -> None:
        self._token = token

    def close(self) -> None:
        """No more claims at enqueue; rows still waiting are released with the token."""
        self._token = None

    def claim(self, now: float) -> tuple[str, float] | None:
        """(token, claimed until) for a row being enqueued now, or None when the dispatcher
        is not running or enough rows already wait for it."""
        token = self._token
        if token is None or len(self._rows) >= self.bound:
            return None
        return token, now + self.lease

    def room(self) -> int:
        """How many more rows may wait for the dispatcher now (0 when it is not running)."""
        with self._lock:
            return 0 if self._token is None else max(0, self.bound - len(self._rows))

    def put(self, row: q.OutboxRow) -> None:
        """The row's transaction committed: it is the dispatcher's to send."""
        with self._lock:
            self._rows.append(row)

    def take(self, limit: int) -> list[q.OutboxRow]:
        with self._lock:
            n = min(limit, len(self._rows))
            return [self._rows.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._rows)


def claimed_row(msg: q.NewOutgoing, token: str, until: float) -> q.OutboxRow:
    """The row as stored by ``insert_outgoing`` with a claim (its ``seq`` is not known and
    not needed: the dispatcher orders by nothing but arrival)."""
    return q.OutboxRow(
        seq=0,
        id=msg.id,
        kind=msg.kind,
        method=msg.method,
        url=msg.url,
        content_type=msg.content_type,
        body=msg.body,
        response_url=msg.response_url,
        in_reply_to=msg.in_reply_to,
        reply_status=msg.reply_status,
        state="pending",
        attempts=0,
        next_attempt_at=msg.created_at,
        deadline=msg.deadline,
        claim_token=token,
        claimed_until=until,
        created_at=msg.created_at,
        finished_at=None,
        last_error=None,
        status=None,
        resp_content_type=None,
        resp_body=None,
        confirm_url=None,
        headers=msg.headers,
        status_url=None,
    )
