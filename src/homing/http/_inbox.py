"""Running the handlers of inbox entries: one handler run per attempt, each attempt one
transaction that either commits the handler's writes with the entry marked done, or
records the failure (with its history) against the entry. An entry that no attempt can
handle becomes a dead letter that keeps its body, never a NULL: listable and redrivable.

Handling at receipt: an Option 2 message to a node whose handler has proved short is
handled in the transaction that stores it (the receiver's group commit), in a savepoint,
exactly as the background worker's first attempt would be: one commit holds the entry,
the handler's writes and the done mark, instead of two transactions (store, then lock
and handle). A failed attempt is recorded in that commit and the background worker
retries it later. Measured with ``bench/http.py`` (a round ends when every message was
also handled): more messages/s on both stores.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from homing import ids
from homing._failpoints import failpoint
from homing.averages import rise_fast_fall_slow
from homing.database import Database, Transaction
from homing.errors import PermanentFailure
from homing.http import wire
from homing.http.policy import RetryPolicy
from homing.store import http_inbox_queries as iq
from homing.store import http_queries as q
from homing.store.protocol import Tx

log = logging.getLogger("homing.http")

Handler = Callable[[Any, Transaction], Any]
#: Failed attempts kept in an entry's history (the oldest are dropped past this).
MAX_HISTORY = 20
#: By default a node's handler is run at receipt while its average run time stays below
#: this: the commit that acknowledges a group of messages waits for their handlers.
AT_RECEIPT_BELOW_S = 0.001


PROBLEM_TYPE = "application/problem+json"


def problem_body(status: int, detail: str) -> bytes:
    """An RFC 9457 problem document (``error`` repeats ``detail`` for older homing clients)."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    doc = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return json.dumps({**doc, "error": detail}).encode()


# The body of a message not parsed yet (``attempt`` parses it); None is a JSON value.
UNPARSED: Any = object()


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str | None
    body: bytes
    replayed: bool = False
    confirm: bool = False


class Refused(Exception):
    """A request refused before anything was stored: the HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _history(previous: str | None, at: float, error: str) -> str:
    entries: list[Any] = json.loads(previous) if previous else []
    entries.append({"at": at, "error": error[:2000]})
    return json.dumps(entries[-MAX_HISTORY:])


def stored_answer(row: q.InboxRow, *, replayed: bool) -> Answer:
    if row.confirmed and row.resp_body is None:
        detail = f"message {row.id} was answered and confirmed"
        return Answer(410, PROBLEM_TYPE, problem_body(410, detail), replayed)
    return Answer(row.status or 200, row.resp_content_type, row.resp_body or b"", replayed, True)


class Inbox:
    """Handles inbox entries of one receiver (its nodes, retry policy and limits)."""

    def __init__(
        self,
        db: Database,
        nodes: Mapping[str, Handler],
        *,
        retry: RetryPolicy,
        max_attempts: int,
        absurd_after: float,
        stats: dict[str, int],
        on_reply: Callable[[Tx], None],
        at_receipt_below: float = AT_RECEIPT_BELOW_S,
    ) -> None:
        self.db = db
        self.nodes = nodes
        self.retry = retry
        self.max_attempts = max_attempts
        self.absurd_after = absurd_after
        self.stats = stats
        self.on_reply = on_reply
        self.at_receipt_below = at_receipt_below
        self._run_time: dict[str, float] = {}  # node path -> handlers' average seconds
        self._run_time_lock = threading.Lock()

    def at_receipt_for(self, path: str) -> bool:
        """Whether to handle a new entry for this node at receipt: once its handler has
        proved short (a node starts out handled in the background)."""
        mean = self._run_time.get(path)
        return mean is not None and mean < self.at_receipt_below

    def _ran(self, path: str, seconds: float) -> None:
        with self._run_time_lock:
            self._run_time[path] = rise_fast_fall_slow(self._run_time.get(path), seconds)

    def at_receipt(
        self, t: Transaction, row: q.InboxRow, done: list[str], value: Any = UNPARSED
    ) -> bool:
        """The first attempt at an Option 2 entry just inserted in ``t`` (not visible to
        anyone else yet, so no lock is needed); True when the handler succeeded. Its id is
        then added to ``done``, which the caller marks done before ``t`` commits
        (``iq.finish_handled``: one statement for the batch). ``value``: the body as the
        receiver parsed it already, if it did."""
        self.stats["handled_at_receipt"] = self.stats.get("handled_at_receipt", 0) + 1
        return self.attempt(t, row, True, done, value).status == 200

    def handle(
        self,
        msg_id: str,
        background: bool,
        store: Callable[[Tx], q.InboxRow | None] | None = None,
        digest: str | None = None,
    ) -> Answer | None:
        """One attempt at one inbox entry, in one transaction; None if another holds it.

        With ``store`` the entry is inserted in that same transaction first (Option 1: one
        commit stores the request, the handler's writes and the response); a repeat with
        another body is refused with 422 and changes nothing."""
        with self.db.transaction() as t:
            if store is not None:
                if not iq.try_lock_message(t.tx, msg_id):
                    return None  # another process is serving this id now: 409
                existing = store(t.tx)
                if existing is not None and (
                    existing.body_hash != digest or existing.mode != "put"
                ):
                    raise Refused(
                        422,
                        f"message {msg_id} was already received with a different body, "
                        "path or mode; a message id names one message: make a new id "
                        "for a new message",
                    )
                self.stats["duplicates" if existing else "received"] += 1
            ok, row = iq.lock_incoming(t.tx, msg_id)
            if not ok:
                return None
            if row is None:
                return Answer(404, PROBLEM_TYPE, problem_body(404, "unknown message"))
            if row.state != "received":
                return stored_answer(row, replayed=True)
            return self.attempt(t, row, background)

    def attempt(
        self,
        t: Transaction,
        row: q.InboxRow,
        background: bool,
        done: list[str] | None = None,
        value: Any = UNPARSED,
    ) -> Answer:
        """Run the handler once in a savepoint of ``t``; on failure its writes are undone
        and the failure is recorded in ``t`` instead (never a second run for this attempt).
        ``done``: an Option 2 entry that succeeded is added there instead of being marked
        done here (the caller marks the list done in ``t``)."""
        handler = self.nodes.get(row.path)
        try:
            if handler is None:
                raise PermanentFailure(f"no node at {row.path} handles this message any more")
            with t.tx.savepoint():
                if value is UNPARSED:
                    value = wire.decode_body(row.content_type, row.body or b"")
                started = time.perf_counter()
                try:
                    result = handler(value, t)
                finally:
                    self._ran(row.path, time.perf_counter() - started)
                ctype, data = wire.encode_body(result, None)
                failpoint("http.receiver.in_handler_before_commit")
                if done is not None and row.mode == "send":
                    done.append(row.id)
                else:
                    self.finish(t.tx, row, "done", 200, ctype, data, None)
        except PermanentFailure as exc:
            return self._failed(t.tx, row, f"the handler refused the message: {exc}", True, True)
        except Exception as exc:
            log.warning("handler for message %s failed: %s", row.id, exc, exc_info=True)
            return self._failed(t.tx, row, f"{type(exc).__name__}: {exc}", False, background)
        self.stats["handled"] += 1
        return Answer(200, ctype, data, False, True)

    def _failed(
        self, tx: Tx, row: q.InboxRow, error: str, permanent: bool, background: bool
    ) -> Answer:
        now = self.db.clock.now()
        history = _history(row.history, now, error)
        attempts = row.attempts + 1
        if permanent or attempts >= self.max_attempts:
            reason = error if permanent else f"the handler failed {attempts} times; last: {error}"
            data = problem_body(501, reason)
            self.finish(tx, row, "failed", 501, PROBLEM_TYPE, data, reason, history, dead=True)
            self.stats["dead"] = self.stats.get("dead", 0) + 1
            return Answer(501, PROBLEM_TYPE, data, False, True)
        at = now + self.retry.delay(attempts) if background else None
        iq.retry_incoming(tx, row.id, at=at, error=error, history=history)
        data = problem_body(503, f"the handler failed, retry later: {error}")
        return Answer(503, PROBLEM_TYPE, data)

    def finish(
        self,
        tx: Tx,
        row: q.InboxRow,
        state: str,
        status: int,
        ctype: str,
        data: bytes,
        error: str | None,
        history: str | None = None,
        *,
        dead: bool = False,
    ) -> None:
        now = self.db.clock.now()
        keep = row.mode == "put"
        iq.finish_incoming(
            tx,
            row.id,
            state=state,
            now=now,
            status=status if keep else None,
            content_type=ctype if keep else None,
            body=data if keep else None,
            error=error,
            history=history,
            dead=dead,
        )
        if row.mode == "job" and row.response_url:
            q.insert_outgoing(
                tx,
                [
                    q.NewOutgoing(
                        id=ids.uuid7(),
                        kind="reply",
                        method="POST",
                        url=row.response_url,
                        content_type=ctype,
                        body=data,
                        response_url=None,
                        in_reply_to=row.id,
                        reply_status=status,
                        deadline=now + self.absurd_after,
                        created_at=now,
                    )
                ],
            )
            self.on_reply(tx)

    def background(self, msg_ids: list[str], stop_wait: Callable[[float], Any]) -> None:
        """Handle due entries as one batch (one commit). Only if that transaction itself
        fails (the store, not a handler) is each entry tried alone, as a new attempt."""
        try:
            self.handle_batch(msg_ids)
            return
        except Exception as exc:
            log.warning("handling a batch of %d inbox entries failed: %s", len(msg_ids), exc)
        for msg_id in msg_ids:
            try:
                if self.handle(msg_id, True) is not None:
                    failpoint("http.receiver.after_commit_before_response")
            except Exception as exc:  # the store is down: the entry stays due
                log.warning("handling inbox entry %s failed: %s", msg_id, exc)
                stop_wait(1.0)

    def handle_batch(self, msg_ids: list[str]) -> None:
        """One attempt at each of several due entries in one transaction, each handler in a
        savepoint (a group commit for the inbox: one fsync for the batch on SQLite)."""
        handled = 0
        with self.db.transaction() as t:
            for msg_id in msg_ids:
                ok, row = iq.lock_incoming(t.tx, msg_id)
                if ok and row is not None and row.state == "received":
                    handled += self.attempt(t, row, True).status == 200
        if handled:
            failpoint("http.receiver.after_commit_before_response")
