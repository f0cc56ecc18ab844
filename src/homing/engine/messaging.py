"""The message side of the engine's API: publish, take, ack, nack, settle, redrive.

``Engine`` (in ``core``) inherits these; they share its transaction helper ``_run``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from homing import ids
from homing.database import Database
from homing.engine import codec, credits, dead_letters, limits, routing
from homing.engine.codec import DEAD_LETTERS
from homing.engine.model import (
    Delivery,
    Message,
    MessageNotFound,
    Published,
    QueueFull,
    QueueNotFound,
)
from homing.engine.run import Run
from homing.errors import InvalidArgument, InvalidState, StaleLease
from homing.store import engine_queries as q

MAX_LEASE_S = 30 * 24 * 3600.0
MAX_WAIT_S = 3600.0
MAX_BATCH = 10_000


class Messaging:
    """Publishing and consuming; mixed into ``Engine``."""

    db: Database
    max_body_bytes: int
    max_headers_bytes: int
    consumer_timeout: float

    def _run(self) -> AbstractContextManager[Run]:
        raise NotImplementedError

    def publish(
        self,
        queue: str,
        body: Any = None,
        *,
        headers: Mapping[str, Any] | None = None,
        return_address: str | None = None,
        id: str | None = None,
    ) -> Published:
        """Send a message to ``queue`` and route it as far as it goes now.

        ``body`` is bytes (kept as is) or a JSON value. A queue that does not exist sends the
        message to the engine's dead-letter queue ``$dead``. Publishing again with the same
        ``id`` returns the first outcome and stores nothing new. A full queue that rejects
        raises ``QueueFull`` and does not take the message; if it has a dead-letter queue,
        a record of the refusal (reason ``rejected``) is left there.
        """
        (result,) = self.publish_many(
            queue,
            [body],
            headers=headers,
            return_address=return_address,
            ids=None if id is None else [id],
        )
        return result

    def publish_many(
        self,
        queue: str,
        bodies: Sequence[Any],
        *,
        headers: Mapping[str, Any] | None = None,
        return_address: str | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[Published]:
        """Publish several messages to ``queue`` in one transaction (faster: one commit, one
        lock). Same rules as ``publish`` for each; a ``QueueFull`` refuses the whole batch
        (nothing of it is stored) and names how many went in before the queue was full."""
        codec.name("queue name", queue, reserved_ok=True)
        if return_address is not None:
            codec.name("return_address", return_address, reserved_ok=True)
        if isinstance(bodies, str | bytes) or not isinstance(bodies, Sequence):
            raise InvalidArgument("bodies must be a list of message bodies")
        if not 1 <= len(bodies) <= MAX_BATCH:
            raise InvalidArgument(f"publish between 1 and {MAX_BATCH} messages at once")
        message_ids = _message_ids(ids, len(bodies))
        head = codec.encode_headers(headers, self.max_headers_bytes)
        encoded = [codec.encode_body(b, self.max_body_bytes) for b in bodies]
        refused: QueueFull | None = None
        with self._run() as run:
            seen = q.published_many(run.tx, message_ids)
            out: dict[int, Published] = {}
            firsts: dict[str, Published] = {}
            for i, (mid, (data, kind)) in enumerate(zip(message_ids, encoded, strict=True)):
                earlier = firsts.get(mid)
                if mid in seen:
                    first = seen[mid]
                    earlier = Published(mid, first["queue"], first["seq"], first["outcome"])
                if earlier is not None:
                    out[i] = Published(mid, earlier.queue, earlier.seq, earlier.outcome, True)
                    continue
                entry = _new_entry(mid, queue, head, data, kind, return_address, run.now)
                try:
                    out[i] = firsts[mid] = _publish_one(run, entry)
                except QueueFull as exc:
                    if len(bodies) > 1:
                        raise QueueFull(
                            f"{exc} ({i} of {len(bodies)} fitted; none taken)"
                        ) from None
                    refused = exc
                    _record_refusal(run, entry)
                    break
            if firsts:
                routing.drain(run)
                q.record_published_many(
                    run.tx, [(p.id, queue, p.seq, p.outcome, run.now) for p in firsts.values()]
                )
        if refused is not None:
            raise refused
        return [out[i] for i in range(len(out))]

    def take(
        self,
        consumer: str,
        *,
        limit: int = 1,
        lease_for: float = 60.0,
        wait: float | None = None,
    ) -> list[Delivery]:
        """Lease up to ``limit`` messages given to ``consumer``, oldest first. A message
        whose lease runs out without ack goes back to its queue, for any consumer
        (at-least-once). ``wait`` (s): block until a message comes or the time passes
        (LISTEN/NOTIFY on PostgreSQL, a backoff poll on SQLite); returns [] on timeout."""
        codec.name("consumer name", consumer)
        n = int(codec.count("limit", limit, allow_none=False, minimum=1) or 1)
        lease = codec.seconds("lease_for", lease_for, allow_none=False, maximum=MAX_LEASE_S)
        assert lease is not None
        wait_s = codec.seconds("wait", wait, maximum=MAX_WAIT_S) if wait != 0 else None
        if wait_s and self.db.store.in_transaction() is not None:
            raise InvalidState(
                "take(wait=...) cannot block inside an open transaction (it would hold the "
                "store's write lock, or never see new messages); take without wait there"
            )
        deadline = time.monotonic() + (wait_s or 0.0)
        wakeup = (
            self.db.store.wakeup("homing_engine", min_poll=0.01, max_poll=0.5) if wait_s else None
        )
        while True:
            got = self._take_now(consumer, n, lease)
            left = deadline - time.monotonic()
            if got or left <= 0 or wakeup is None:
                return got
            # NOTIFY wakes it at once on PostgreSQL; it also looks every 0.5 s at most
            wakeup.wait(min(left, 0.5))

    def _take_now(self, consumer: str, n: int, lease_for: float) -> list[Delivery]:
        with self._run() as run:
            limits.sweep(run)
            absent = run.now - self.consumer_timeout
            for queue in q.touch_consumer(run.tx, consumer, now=run.now, absent_before=absent):
                run.work.append(("pump-all", queue))
            run.forget()
            routing.drain(run)
            rows = q.takeable(run.tx, consumer, now=run.now, limit=n)
            token = ids.uuid7()
            until = run.now + lease_for
            out = []
            for row in rows:
                q.lease(run.tx, int(row["seq"]), token=token, until=until)
                row = {**row, "attempts": int(row["attempts"]) + 1}
                out.append(Delivery(codec.message(row), token, until))
            return out

    def ack(self, delivery: Delivery | int, *, lease_token: str | None = None) -> None:
        """Pay for a message: it is done, and its selector (and every MOVE selector above it)
        gets its credit back. Runs in the caller's transaction if one is open."""
        with self._run() as run:
            row = _leased(run, delivery, lease_token)
            credits.pay(run, int(row["seq"]))

    def nack(
        self, delivery: Delivery | int, *, requeue: bool = True, lease_token: str | None = None
    ) -> None:
        """Refuse a message. ``requeue``: it goes back to its queue for any consumer (a
        COPY stays with this consumer), unless its queue's ``max_deliveries`` is reached.
        Otherwise, or past that limit, it is an exception: dead-lettered (reason
        ``rejected`` or ``delivery_limit``), else discarded (logged); either way it is paid
        for, so the selector's credit comes back."""
        with self._run() as run:
            row = _leased(run, delivery, lease_token)
            if requeue and limits.over_delivery_limit(run, row):
                dead_letters.fail(
                    run, row, "delivery_limit", f"delivered {row['attempts']} times without an ack"
                )
            elif requeue:
                limits.lease_lapsed(run, row)
            else:
                dead_letters.fail(run, row, "rejected", f"rejected by consumer {row['consumer']}")

    def settle_jobs(self, *, limit: int = 1000) -> int:
        """Pay for messages given to job types whose jobs have ended: a done (or
        garbage-collected) job pays; a perm-failed one is an exception (``job_failed``:
        dead-lettered or discarded) and pays too. Call it periodically; returns how many
        were settled."""
        with self._run() as run:
            done = q.finished_job_entries(run.tx, limit)
            for seq, state in done:
                if state == "failed":
                    row = q.get_entry(run.tx, seq)
                    assert row is not None
                    dead_letters.fail(run, row, "job_failed", f"job {row['job_id']} failed")
                else:
                    credits.pay(run, seq)
            return len(done)

    def sweep(self) -> int:
        """Apply the limits that time triggers now (lapsed consumer leases, expired
        messages, unused queues); ``take`` does this too. Returns how many were handled."""
        with self._run() as run:
            return limits.sweep(run)

    def messages(
        self, queue: str, *, state: str | None = None, limit: int = 100, after_seq: int = 0
    ) -> list[Message]:
        """Entries of a queue, oldest first (``state``: ready, outstanding or done)."""
        if state not in (None, "ready", "outstanding", "done"):
            raise InvalidArgument(f"state must be ready, outstanding or done, got {state!r}")
        n = int(codec.count("limit", limit, allow_none=False, minimum=1) or 1)
        with self.db.store.transaction(write=False) as tx:
            if q.get_queue(tx, queue) is None:
                raise QueueNotFound(f"no queue {queue!r}")
            rows = q.entries(tx, queue, state=state, limit=n, after_seq=after_seq)
            return [codec.message(r) for r in rows]

    def dead_letters(self, queue: str = DEAD_LETTERS, *, limit: int = 100) -> list[Message]:
        """Unprocessed messages of a dead-letter queue (by default the engine's ``$dead``)."""
        return self.messages(queue, state="ready", limit=limit)

    def redrive(self, seq: int, *, to: str | None = None) -> Published:
        """Publish a held message (typically a dead letter) again, to ``to`` or to its address;
        the old entry is done. An unknown target is refused and nothing changes; a full
        ``reject`` target raises ``QueueFull`` and nothing changes. Its death history is kept."""
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise InvalidArgument(f"seq must be an integer, got {seq!r}")
        if to is not None:
            codec.name("to", to, reserved_ok=True)
        with self._run() as run:
            row = q.get_entry(run.tx, seq)
            if row is None or row["state"] != "ready":
                raise MessageNotFound(
                    f"no unprocessed message with seq {seq}; `homing queues dead-letters` lists them"
                )
            target = to or row["address"]
            if q.get_queue(run.tx, target) is None:
                raise QueueNotFound(
                    f"cannot redrive seq {seq}: queue {target!r} does not exist; create it or "
                    "pass to=ANOTHER_QUEUE"
                )
            new_seq = routing.arrive(
                run,
                codec.from_row(row, queue=target, address=target, parent=None, hops=0, reason=None),
                external=True,
            )
            credits.finish(run, row, "redriven")
            routing.drain(run)
            outcome = "discarded" if new_seq is None else _outcome(run, new_seq)
            return Published(str(row["id"]), target, new_seq, outcome)

    def check(self) -> list[str]:
        """Check the books: for every MOVE/BOUNCE selector credits held + messages outstanding
        = credits granted, and the graph's entries are consistent. Returns the violations."""
        problems = []
        with self.db.store.transaction(write=False) as tx:
            for sid, queue, name, held, outstanding, granted in q.credit_books(tx):
                sel = q.selector_by_id(tx, sid)
                if sel is not None and not codec.uses_credit(sel):
                    continue
                if held < 0 or held + outstanding != granted:
                    problems.append(
                        f"selector {queue}/{name}: {held} credits held + {outstanding} outstanding "
                        f"!= {granted} granted"
                    )
            problems += [f"entry {seq}: {what}" for what, seq in q.orphans(tx)]
        return problems


def _message_ids(given: Sequence[str] | None, n: int) -> list[str]:
    if given is None:
        return [ids.uuid7() for _ in range(n)]
    if isinstance(given, str) or len(given) != n:
        raise InvalidArgument("give one message id per body (a list of UUID strings)")
    for mid in given:
        if not (isinstance(mid, str) and ids.is_uuid(mid)):
            raise InvalidArgument(
                f"a message id is a UUID in text form (homing.uuid7()), got {mid!r}"
            )
    return list(given)


def _new_entry(
    mid: str,
    queue: str,
    headers: str,
    body: bytes,
    kind: str,
    return_address: str | None,
    now: float,
) -> q.NewEntry:
    """A message as published: addressed to ``queue``, no history yet."""
    return q.NewEntry(
        id=mid,
        queue=queue,
        headers=headers,
        body=body,
        body_kind=kind,
        address=queue,
        return_address=return_address,
        original_address=None,
        reason=None,
        parent_seq=None,
        hops=0,
        created_at=now,
    )


def _publish_one(run: Run, entry: q.NewEntry) -> Published:
    queue = entry.queue
    if run.queue(queue) is None:
        mid = entry.id
        run.log("publish to unknown queue %r: message %s dead-lettered", queue, mid)
        seq = dead_letters.refuse(run, entry, None, "no_queue", f"no queue {queue!r}")
        return Published(mid, queue, seq, "dead-lettered")
    seq = routing.arrive(run, entry, external=True)
    if seq is None:
        return Published(entry.id, queue, None, "discarded")
    routing.drain(run)
    return Published(entry.id, queue, seq, _outcome(run, seq, queue))


def _record_refusal(run: Run, entry: q.NewEntry) -> None:
    """A publisher refused by a full ``reject`` queue: a record in its dead-letter queue."""
    queue = run.queue(entry.queue)
    if queue is not None and queue["dead_letter"]:
        dead_letters.refuse(
            run,
            entry,
            queue,
            "rejected",
            f"the queue is full ({queue['max_unprocessed']} unprocessed); the publisher was refused",
        )


def _leased(run: Run, delivery: Delivery | int, lease_token: str | None) -> dict[str, Any]:
    token: str | None
    if isinstance(delivery, Delivery):
        seq, token = delivery.seq, delivery.lease_token
    else:
        seq, token = delivery, lease_token
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise InvalidArgument(
            f"pass the Delivery from take(), or a seq with lease_token=, got {seq!r}"
        )
    if not isinstance(token, str):
        raise InvalidArgument("pass the Delivery from take(), or a seq with lease_token=")
    row = q.get_entry(run.tx, seq)
    if row is None or (row["state"] == "ready" and row["lease_token"] is None):
        raise MessageNotFound(
            f"message entry {seq} is no longer given to a consumer: its selector was "
            "deleted or its lease ran out, and the message returned to its queue (or it was "
            "trimmed from history)"
        )
    if row["state"] == "done":
        raise InvalidState(f"message entry {seq} was acked already")
    if row["lease_token"] != token:
        raise StaleLease(
            f"your lease on message entry {seq} is stale: it expired and the message was "
            "taken again (or taken back); drop your work on it"
        )
    return row


def _outcome(run: Run, seq: int, queue: str | None = None) -> str:
    """What became of entry ``seq`` in this run; ``queue``: where it was sent (an entry
    stored elsewhere is the dead letter of a message refused there)."""
    row = q.get_entry(run.tx, seq)
    if row is None:
        return run.fate.get(seq, "discarded")
    if queue is not None and row["queue"] != queue:
        return "dead-lettered"
    if row["state"] == "outstanding":
        return "routed"
    if row["state"] == "ready":
        return "held"
    return run.fate.get(seq, "processed")
