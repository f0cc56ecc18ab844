"""Running the handlers of inbox entries: one handler run per attempt, each attempt one
transaction that either commits the handler's writes with the entry marked done, or
records the failure (with its history) against the entry. An entry that no attempt can
handle becomes a dead letter that keeps its body, never a NULL: listable and redrivable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from homing import ids
from homing._failpoints import failpoint
from homing.database import Database, Transaction
from homing.errors import PermanentFailure
from homing.http import wire
from homing.http.policy import RetryPolicy
from homing.store import http_queries as q
from homing.store.protocol import Tx

log = logging.getLogger("homing.http")

Handler = Callable[[Any, Transaction], Any]
#: Failed attempts kept in an entry's history (the oldest are dropped past this).
MAX_HISTORY = 20


PROBLEM_TYPE = "application/problem+json"


def problem_body(status: int, detail: str) -> bytes:
    """An RFC 9457 problem document (``error`` repeats ``detail`` for older homing clients)."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    doc = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return json.dumps({**doc, "error": detail}).encode()


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
    ) -> None:
        self.db = db
        self.nodes = nodes
        self.retry = retry
        self.max_attempts = max_attempts
        self.absurd_after = absurd_after
        self.stats = stats
        self.on_reply = on_reply

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
                if not q.try_lock_message(t.tx, msg_id):
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
            ok, row = q.lock_incoming(t.tx, msg_id)
            if not ok:
                return None
            if row is None:
                return Answer(404, PROBLEM_TYPE, problem_body(404, "unknown message"))
            if row.state != "received":
                return stored_answer(row, replayed=True)
            return self.attempt(t, row, background)

    def attempt(self, t: Transaction, row: q.InboxRow, background: bool) -> Answer:
        """Run the handler once in a savepoint of ``t``; on failure its writes are undone
        and the failure is recorded in ``t`` instead (never a second run for this attempt)."""
        handler = self.nodes.get(row.path)
        try:
            if handler is None:
                raise PermanentFailure(f"no node at {row.path} handles this message any more")
            with t.tx.savepoint():
                value = wire.decode_body(row.content_type, row.body or b"")
                result = handler(value, t)
                ctype, data = wire.encode_body(result, None)
                failpoint("http.receiver.in_handler_before_commit")
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
        q.retry_incoming(tx, row.id, at=at, error=error, history=history)
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
        q.finish_incoming(
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
                ok, row = q.lock_incoming(t.tx, msg_id)
                if ok and row is not None and row.state == "received":
                    handled += self.attempt(t, row, True).status == 200
        if handled:
            failpoint("http.receiver.after_commit_before_response")
