"""The client side of queued request/reply (seed 004): one client's session and recovery.

A client runs three kinds of transaction against the queue manager (the store):

- Transaction 0 (``prepare``): remember the request it is about to submit as the session's
  LastRequest, so that after a crash it can tell "never submitted" (state A) apart.
- Transaction 1 (``enqueue``): put the request in the request queue and set the session's
  LastEnqueuedID, atomically.
- Transaction 3 (``take_reply``): take the reply from the client's private reply queue, set
  LastDequeuedID and run the client's reply handler, atomically.

Transaction 2 is the server's (``homing.sessions.Server``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from homing._failpoints import failpoint
from homing.database import Transaction
from homing.errors import InvalidArgument, InvalidState
from homing.ids import uuid7
from homing.jobs import check_seconds
from homing.sessions._model import (
    MAX_PREPARED,
    DuplicateRequest,
    NotDequeued,
    Recovery,
    Reply,
    Request,
    RequestStatus,
    SessionFenced,
    SessionInfo,
    TooManyPrepared,
    check_ids,
    check_name,
    decode,
    encode_body,
    no_session,
)
from homing.sessions._recovery import last_status, make_status, reply_of, row_status
from homing.store import sessions_queries as q
from homing.store.protocol import Store, Tx

if TYPE_CHECKING:
    from homing.sessions.manager import Sessions

ReplyHandler = Callable[[Reply, Transaction], None]

_DONE = {"resubmit": "resubmitted", "drop": "dropped"}


class Session:
    """One client's persistent session; cheap to create, all state lives in the store.

    ``created`` is False when ``open`` re-established an existing session; ``epoch`` is the
    session's epoch when this handle was made (a later ``open`` fences this handle).
    """

    def __init__(
        self, sessions: Sessions, client_id: str, *, created: bool, epoch: int | None = None
    ) -> None:
        self.sessions = sessions
        self.client_id = client_id
        self.created = created
        self.epoch = epoch

    @property
    def reestablished(self) -> bool:
        return not self.created

    def __repr__(self) -> str:
        return f"<homing.sessions.Session {self.client_id!r}>"

    @property
    def _store(self) -> Store:
        return self.sessions.store

    def _lock(self, tx: Tx) -> dict[str, Any]:
        s = q.lock_session(tx, self.client_id, now=self.sessions.clock.now())
        return self._check(s)

    def _check(self, s: dict[str, Any] | None) -> dict[str, Any]:
        """The session row, if this handle may still act for the client."""
        if s is None:
            raise no_session(self.client_id)
        if self.epoch is not None and int(s["epoch"]) != self.epoch:
            raise SessionFenced(
                f"the session of client {self.client_id!r} was opened again by another "
                f"process (epoch {s['epoch']}, this handle has epoch {self.epoch}): this "
                "handle is fenced and did nothing. Stop, or open the session again to take "
                "it over"
            )
        return s

    def info(self) -> SessionInfo:
        return self.sessions.info(self.client_id)

    # -- Transactions 0 and 1 ------------------------------------------------------------
    def _new_request(self, queue: str, body: Any, request_id: str | None) -> tuple[Request, str]:
        queue = check_name("queue", queue)
        rid = uuid7() if request_id is None else check_name("request id", request_id)
        text = encode_body("request body", body, self.sessions.max_body_bytes)
        return Request(rid, queue, body), text

    def prepare(self, queue: str, body: Any, *, request_id: str | None = None) -> Request:
        """Transaction 0: record the request (and make it the session's LastRequest), not
        yet submitted.

        After a crash before ``enqueue``, ``recover()`` reports it in state A with its body;
        so does every other prepared request not yet enqueued (at most ``MAX_PREPARED``).
        """
        request, text = self._new_request(queue, body, request_id)
        # Pipelined (Store.transaction): every statement is sent before the first check
        # reads its result, BEGIN to LastRequest in one round trip on PostgreSQL; a failed
        # check raises and the rollback undoes the writes sent after the checked statement.
        with self._store.transaction(pipelined=True) as tx:
            now = self.sessions.clock.now()
            session = q.defer_lock_session(tx, self.client_id, now=now)
            existing = q.defer_get_request(tx, request.id)
            prepared = q.defer_count_prepared(tx, self.client_id)
            inserted = q.defer_insert_prepared(
                tx,
                request_id=request.id,
                client_id=self.client_id,
                queue=request.queue,
                body=text,
                now=now,
            )
            q.set_last_request(tx, self.client_id, request.id, request.queue, text, now)
            self._check(session.get())
            found = existing.get()
            if found is not None:
                raise self._duplicate(found)
            if prepared.get() >= MAX_PREPARED:
                raise TooManyPrepared(
                    f"client {self.client_id!r} has {MAX_PREPARED} prepared requests not yet "
                    "submitted; enqueue, resubmit or drop some (recover() lists them, state A)"
                )
            if not inserted.get():
                raise DuplicateRequest(
                    f"request {request.id!r} is prepared already (state A); use a new id, "
                    "or resubmit it"
                )
        failpoint("sessions.after_request_prepared")
        return request

    def enqueue(self, request: Request) -> Request:
        """Transaction 1: enqueue the request and set LastEnqueuedID, atomically.

        Joins the caller's open transaction if there is one (transactional enqueue with the
        client's own writes). Raises ``DuplicateRequest`` if this id was enqueued before.
        """
        if not isinstance(request, Request):
            raise InvalidArgument(f"enqueue takes a Request (from prepare), got {request!r}")
        checked, text = self._new_request(request.queue, request.body, request.id)
        with self._store.transaction(pipelined=True) as tx:  # pipelined: see prepare
            now = self.sessions.clock.now()
            session = q.defer_lock_session(tx, self.client_id, now=now)
            inserted = q.defer_insert_request(
                tx,
                request_id=checked.id,
                client_id=self.client_id,
                queue=checked.queue,
                body=text,
                now=now,
            )
            q.delete_prepared(tx, self.client_id, checked.id)
            q.set_last_enqueued(tx, self.client_id, checked.id)
            self._check(session.get())
            if not inserted.get():
                existing = q.get_request(tx, checked.id)
                assert existing is not None
                raise self._duplicate(existing)
        failpoint("sessions.after_request_enqueued")
        return checked

    def submit(
        self, queue: str, body: Any, *, request_id: str | None = None, remember: bool = True
    ) -> Request:
        """Submit a request: Transaction 0 then Transaction 1. Returns it (with its id).

        ``remember=False`` skips Transaction 0, for a client that keeps its LastRequest in
        its own store and passes it to ``recover(last_request_id=...)``.
        """
        if remember:
            request = self.prepare(queue, body, request_id=request_id)
        else:
            request, _ = self._new_request(queue, body, request_id)
        return self.enqueue(request)

    def _duplicate(self, row: dict[str, Any]) -> DuplicateRequest:
        owner = "this client" if row["client_id"] == self.client_id else "another client"
        return DuplicateRequest(
            f"request {row['id']!r} was already submitted by {owner} (it is {row['state']}); "
            "it was not enqueued again. Use a new id for a new request, or recover() to see "
            "what to do with this one"
        )

    def _prepared(self, tx: Tx, request_id: str | None, verb: str) -> dict[str, Any]:
        """The prepared request ``request_id`` (default: the LastRequest) of this client;
        ``verb`` ("resubmit" or "drop") words the error when there is none."""
        s = self._lock(tx)
        rid = request_id if request_id is not None else s["last_request_id"]
        row = None if rid is None else q.get_prepared(tx, str(rid))
        if row is None or row["client_id"] != self.client_id:
            existing = None if rid is None else q.get_request(tx, str(rid))
            if existing is not None and verb == "resubmit":
                raise self._duplicate(existing)
            if existing is not None:
                raise InvalidState(
                    f"request {rid!r} was submitted already and cannot be {_DONE[verb]}; "
                    "wait for its reply (recover() tells its state)"
                )
            which = "no unsubmitted request" if rid is None else f"no prepared request {rid!r}"
            raise InvalidState(
                f"client {self.client_id!r} has {which} to {verb}; "
                "recover() lists the prepared ones (state A)"
            )
        return row

    def resubmit(self, request_id: str | None = None) -> Request:
        """State A: enqueue a prepared request (default: the LastRequest) that never
        reached the queue."""
        if request_id is not None:
            request_id = check_name("request id", request_id)
        with self._store.transaction() as tx:
            row = self._prepared(tx, request_id, "resubmit")
        request = Request(str(row["id"]), str(row["queue"]), decode(row["body"]))
        return self.enqueue(request)

    def drop(self, request_id: str | None = None) -> Request:
        """State A: forget a prepared request (default: the LastRequest) instead of
        resubmitting it."""
        if request_id is not None:
            request_id = check_name("request id", request_id)
        with self._store.transaction() as tx:
            row = self._prepared(tx, request_id, "drop")
            q.delete_prepared(tx, self.client_id, str(row["id"]))
            s = q.get_session(tx, self.client_id)
            if s is not None and s["last_request_id"] == row["id"]:
                q.set_last_request(tx, self.client_id, None, None, None, self.sessions.clock.now())
        return Request(str(row["id"]), str(row["queue"]), decode(row["body"]))

    # -- Transaction 3 -------------------------------------------------------------------
    def peek_reply(self, *, request_id: str | None = None) -> Reply | None:
        """The next reply (or the reply to ``request_id``) without taking it."""
        if request_id is not None:
            request_id = check_name("request id", request_id)
        with self._store.transaction(write=False) as tx:
            self._check(q.get_session(tx, self.client_id))
            row = q.next_reply(tx, self.client_id, request_id)
        return None if row is None else reply_of(row)

    def take_reply(
        self,
        handler: ReplyHandler | None = None,
        *,
        request_id: str | None = None,
        timeout: float = 0.0,
    ) -> Reply | None:
        """Transaction 3: take the oldest reply (or the one to ``request_id``) and run
        ``handler(reply, txn)`` in the same transaction, then commit both.

        The handler's writes through ``txn`` (``txn.connection``, ``txn.tx.execute``, the
        job API on ``txn``) commit with the dequeue, so the reply is processed exactly once.
        If the handler raises, nothing is taken. Waits up to ``timeout`` seconds for a reply;
        returns None if there is none.
        """
        if request_id is not None:
            request_id = check_name("request id", request_id)
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        deadline = time.monotonic() + timeout
        # woken by this client's replies only (a reply to another client is not a reason
        # to look); registered before the first look, so none is missed
        wakeup = self._store.wakeup(
            q.REPLY_CHANNEL, min_poll=0.01, max_poll=0.05, key=self.client_id
        )
        try:
            woken = False
            while True:
                # a read first: idle polling takes no write lock (SQLite) and no row lock
                # (PostgreSQL), in one statement (one round trip there); but woken by an
                # announcement of a reply to this client, take at once (the read would
                # find it: one round trip fewer between the server's commit and the take)
                if woken or self._reply_waiting(request_id):
                    reply = self._take_once(handler, request_id)
                    if reply is not None:
                        return reply
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                woken = wakeup.wait(min(remaining, 0.05))
        finally:
            wakeup.close()

    def _reply_waiting(self, request_id: str | None) -> bool:
        """Whether a reply waits, checking that this handle may still act (one read)."""
        with self._store.read() as tx:
            session, waiting = q.reply_waiting(tx, self.client_id, request_id)
        self._check(session)
        return waiting

    def _take_once(self, handler: ReplyHandler | None, request_id: str | None) -> Reply | None:
        # pipelined (see prepare): the lock and the take in one round trip, LastDequeued
        # and the trim sent with the COMMIT (or before the handler runs, unpipelined)
        with self._store.transaction(pipelined=True), self.sessions.db.transaction() as txn:
            tx = txn.tx
            now = self.sessions.clock.now()
            session = q.defer_lock_session(tx, self.client_id, now=now)
            taken = q.defer_take_next_reply(tx, self.client_id, request_id, now=now)
            s = self._check(session.get())
            row = taken.get()
            if row is None:
                return None
            q.set_last_dequeued(tx, self.client_id, str(row["id"]))
            q.trim_remembered(tx, self.client_id, int(s["keep_replies"]))
            reply = reply_of(row)
            if handler is not None:
                tx.end_pipeline()  # the handler's statements wait for their results
                handler(reply, txn)
            failpoint("sessions.client_before_reply_commit")
        failpoint("sessions.after_reply_dequeued")
        return reply

    def confirm(self, request_ids: Iterable[str]) -> int:
        """Tell the queue manager these replies are durably recorded by the client, so the
        session may forget them. All or nothing: an id whose reply this client never
        dequeued raises ``NotDequeued`` and nothing changes. Returns how many were forgotten.
        """
        given: Any = request_ids
        if isinstance(given, Iterable) and not isinstance(given, str | bytes | dict):
            given = list(given)  # a generator, a dict view... (None, 3, a dict: refused below)
        ids = check_ids(given)
        with self._store.transaction() as tx:
            self._lock(tx)
            rows = {str(r["id"]): r for r in q.get_requests(tx, ids)}
            bad = [
                i
                for i in ids
                if i not in rows
                or rows[i]["client_id"] != self.client_id
                or rows[i]["state"] != "taken"
            ]
            if bad:
                raise NotDequeued(
                    f"client {self.client_id!r} never dequeued a reply to {bad[:5]!r}"
                    + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
                    + "; confirm only ids of replies taken with take_reply; nothing was confirmed"
                )
            return q.confirm_replies(tx, self.client_id, ids, now=self.sessions.clock.now())

    # -- recovery ------------------------------------------------------------------------
    def recover(self, *, last_request_id: str | None = None) -> Recovery:
        """Which of the seed's states A-D each request is in, and what to do.

        The last request is the session's LastRequest (kept by ``prepare``), or
        ``last_request_id`` when the client keeps LastRequest in its own store. Its state
        follows the seed's rules: LastRequest.ID != LastEnqueuedID -> A (resubmit or drop);
        LastRequest.ID = LastDequeuedID -> D (continue); its reply waiting in the reply
        queue -> C (process it now); otherwise B (wait).
        """
        if last_request_id is not None:
            last_request_id = check_name("last_request_id", last_request_id)
        with self._store.transaction(write=False) as tx:
            s = self._check(q.get_session(tx, self.client_id))
            rows = q.session_requests(tx, self.client_id)
            prepared = q.list_prepared(tx, self.client_id)
            last_id = last_request_id or s["last_request_id"] or s["last_enqueued_id"]
            by_id = {str(r["id"]): r for r in rows}
            last_row = None
            if last_id is not None:
                last_row = by_id.get(str(last_id)) or q.get_request(tx, str(last_id))
        statuses = [row_status(r) for r in rows]
        unsubmitted = {
            str(p["id"]): make_status(str(p["id"]), "A", str(p["queue"]), decode(p["body"]))
            for p in prepared
        }
        last: RequestStatus | None = None
        if last_id is not None:
            last = unsubmitted.get(str(last_id)) or last_status(
                self.client_id, s, str(last_id), last_row, last_request_id is not None
            )
            if last.state == "A" and last.request_id not in unsubmitted:
                statuses.append(last)
        statuses.extend(unsubmitted.values())
        return Recovery(
            client_id=self.client_id,
            last_request_id=None if last_id is None else str(last_id),
            last_enqueued_id=s["last_enqueued_id"],
            last_dequeued_id=s["last_dequeued_id"],
            last=last,
            requests=statuses,
        )

    def close(self) -> None:
        """End the session: the queue manager forgets the client. Refused while the client
        has requests not yet answered and taken."""
        with self._store.transaction() as tx:
            self._lock(tx)
            open_count = q.count_open_requests(tx, self.client_id)
            if open_count:
                raise InvalidState(
                    f"client {self.client_id!r} has {open_count} request(s) not yet answered "
                    "and taken; take their replies before closing the session"
                )
            for p in q.list_prepared(tx, self.client_id):
                q.delete_prepared(tx, self.client_id, str(p["id"]))
            q.forget_client(tx, self.client_id)
            q.delete_session(tx, self.client_id)
