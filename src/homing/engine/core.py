"""The queue engine of seed 001, over the store: the public API.

Every operation runs in one store transaction (it joins the caller's if one is open), and
every piece of engine state (queues, selectors with their credits, message entries) is in
the store. A crash anywhere (for example at the failpoint ``engine.mid_route``) rolls the
whole operation back, so the rules hold across process crashes. The rules themselves live
in ``routing``, ``credits``, ``limits``, ``dead_letters`` and ``graph``; this module checks
arguments, opens the transaction and reports.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from homing import ids
from homing.database import Database
from homing.engine import codec, credits, dead_letters, graph, limits, routing, rules
from homing.engine.codec import DEAD_LETTERS
from homing.engine.model import (
    Delivery,
    Message,
    MessageNotFound,
    Published,
    QueueFull,
    QueueInfo,
    QueueNotFound,
    SelectorInfo,
    SelectorNotFound,
)
from homing.engine.run import Run
from homing.errors import ConfigurationError, InvalidArgument, InvalidState, StaleLease
from homing.store import engine_queries as q

__all__ = ["DEAD_LETTERS", "Engine"]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADERS_BYTES = 64 * 1024
DEFAULT_MAX_HISTORY = 1000
DEFAULT_CONSUMER_TIMEOUT = 60.0
MAX_LEASE_S = 30 * 24 * 3600.0
MAX_WAIT_S = 3600.0
MAX_BATCH = 10_000
_MODES = ("move", "copy", "bounce")


class Engine:
    """Queues and selectors as a directed graph, in a homing store (seed 001).

    ``Engine(db)`` works on a ``homing.Database`` (one store). Calls made inside an open
    ``db.transaction()`` join it, so a consumer's ``ack`` commits together with its own
    writes. ``consumer_timeout`` (s): a consumer that has not called ``take`` for that long
    is absent; messages given to it and not taken within that time go back to the queue.
    """

    def __init__(
        self,
        db: Database,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_headers_bytes: int = DEFAULT_MAX_HEADERS_BYTES,
        consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT,
    ) -> None:
        if not isinstance(db, Database):
            raise ConfigurationError(
                "the queue engine works on one store (homing.Database); a sharded store is not "
                "supported: connect to a single URL"
            )
        self.db = db
        self.max_body_bytes = int(
            codec.count("max_body_bytes", max_body_bytes, allow_none=False, minimum=1) or 1
        )
        self.max_headers_bytes = int(
            codec.count("max_headers_bytes", max_headers_bytes, allow_none=False, minimum=2) or 2
        )
        self.consumer_timeout = float(
            codec.seconds("consumer_timeout", consumer_timeout, allow_none=False) or 1.0
        )

    @contextmanager
    def _run(self) -> Iterator[Run]:
        with self.db.store.transaction() as tx:
            q.lock_engine(tx)
            run = Run(self, tx)
            yield run
            routing.drain(run)
            run.finish()

    def job_args(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The args of a job made for a message by a job-type selector."""
        args: dict[str, Any] = {
            "message_id": row["id"],
            "seq": int(row["seq"]),
            "queue": row["queue"],
            "headers": json.loads(row["headers"]),
            "address": row["address"],
            "return_address": row["return_address"],
        }
        if row["body_kind"] == "json":
            args["body"] = json.loads(bytes(row["body"]).decode())
        else:
            args["body_base64"] = base64.b64encode(bytes(row["body"])).decode()
        return args

    # -- queues -----------------------------------------------------------------------------
    def create_queue(
        self,
        name: str,
        *,
        dead_letter: str | None = None,
        max_unprocessed: int | None = None,
        on_overflow: str = "discard",
        max_history: int | None = DEFAULT_MAX_HISTORY,
        self_destruct: bool = False,
        max_deliveries: int | None = None,
        message_ttl: float | None = None,
        expires: float | None = None,
        exist_ok: bool = False,
    ) -> QueueInfo:
        """Create a queue. ``on_overflow`` is what happens to a new message when
        ``max_unprocessed`` are waiting: ``discard`` (the default: the new message is
        dead-lettered, or dropped and logged without a dead-letter queue), ``reject`` (the
        publisher gets ``QueueFull``), ``drop-head`` (the oldest waiting message is
        dead-lettered or dropped) or ``overflow`` (the overflow selector takes it).
        ``max_history`` processed messages are kept (oldest dropped first; None keeps all).
        ``max_deliveries``: takes without ack before a message is dead-lettered.
        ``message_ttl`` (s): how long a message may wait. ``expires`` (s): the queue deletes
        itself after that long without selectors or publishes. A ``self_destruct`` queue
        deletes itself when its last selector is deleted."""
        codec.name("queue name", name)
        if dead_letter is not None:
            codec.name("dead_letter", dead_letter, reserved_ok=True)
            if dead_letter == name:
                raise InvalidArgument(f"queue {name!r} cannot be its own dead-letter queue")
        if on_overflow not in limits.OVERFLOW_ACTIONS:
            raise InvalidArgument(
                f"on_overflow must be one of {', '.join(limits.OVERFLOW_ACTIONS)}, "
                f"got {on_overflow!r}"
            )
        if not isinstance(self_destruct, bool):
            raise InvalidArgument(f"self_destruct must be true or false, got {self_destruct!r}")
        settings = {
            "dead_letter": dead_letter,
            "max_unprocessed": codec.count("max_unprocessed", max_unprocessed),
            "on_overflow": on_overflow,
            "max_history": codec.count("max_history", max_history),
            "self_destruct": self_destruct,
            "max_deliveries": codec.count("max_deliveries", max_deliveries, minimum=1),
            "message_ttl": codec.seconds("message_ttl", message_ttl),
            "expires": codec.seconds("expires", expires),
        }
        with self._run() as run:
            existing = q.get_queue(run.tx, name)
            if existing is not None:
                same = all(
                    (bool(existing[k]) if k == "self_destruct" else existing[k]) == v
                    for k, v in settings.items()
                )
                if exist_ok and same:
                    return codec.queue_info(existing)
                raise InvalidState(
                    f"queue {name!r} exists already"
                    + ("" if same else " with other settings")
                    + "; delete it first or pick another name"
                )
            if dead_letter is not None and q.get_queue(run.tx, dead_letter) is None:
                raise QueueNotFound(
                    f"dead-letter queue {dead_letter!r} does not exist; create it first"
                )
            q.insert_queue(run.tx, name=name, now=run.now, **settings)  # type: ignore[arg-type]
            row = q.get_queue(run.tx, name)
            assert row is not None
            return codec.queue_info(row)

    def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue. Without ``force`` it must be empty and unused (no selectors, no
        unprocessed or outstanding messages, nothing routing to it, no queue using it as
        its dead-letter queue). With ``force`` its selectors return their messages, held
        messages are bounced or dead-lettered, selectors of other queues that feed it are
        deleted, and queues that used it as their dead-letter queue lose that link."""
        codec.name("queue name", name)
        with self._run() as run:
            row = q.get_queue(run.tx, name)
            if row is None:
                raise QueueNotFound(f"no queue {name!r}; `homing queues list` shows the queues")
            if not force:
                busy = _in_use(run, name)
                if busy:
                    raise InvalidState(
                        f"queue {name!r} is in use ({'; '.join(busy)}); unbind and drain it, "
                        "or delete with force=True"
                    )
            graph.destroy_queue(run, name)

    def queue(self, name: str) -> QueueInfo:
        """One queue with its depths."""
        for info in self.queues():
            if info.name == name:
                return info
        raise QueueNotFound(f"no queue {name!r}")

    def queues(self) -> list[QueueInfo]:
        """Every queue (the engine's dead-letter queue ``$dead`` too) with its depths."""
        with self.db.store.transaction(write=False) as tx:
            return [codec.queue_info(r) for r in q.list_queues(tx)]

    # -- selectors --------------------------------------------------------------------------
    def bind(
        self,
        queue: str,
        name: str,
        *,
        to: str | None = None,
        consumer: str | None = None,
        job_type: str | None = None,
        mode: str = "move",
        match: Mapping[str, Any] | None = None,
        credits: int = 1,
        role: str = "normal",
    ) -> SelectorInfo:
        """Attach a selector ``name`` to ``queue``.

        Destination: another queue (``to``), an external consumer that takes messages with
        ``take`` (``consumer``), or a job type (``job_type``: each message becomes a job,
        inserted in the same transaction; ``settle_jobs`` pays when the job ends). A
        ``bounce`` selector has no destination: it moves the message to its return address.
        ``mode`` is move (credit flow control; ``credits`` to start with), copy (no credits)
        or bounce. ``role`` is normal, ``default`` (used when no normal selector matches;
        its match rule is ignored) or ``overflow`` (used when the queue is full).
        """
        codec.name("queue name", queue, reserved_ok=True)
        codec.name("selector name", name)
        dest_kind, dest = _destination(mode, role, to, consumer, job_type)
        rule = rules.validate(match)
        n = 0 if mode == "copy" else int(codec.count("credits", credits, allow_none=False) or 0)
        with self._run() as run:
            if q.get_queue(run.tx, queue) is None:
                raise QueueNotFound(f"no queue {queue!r}; create it first")
            if q.get_selector(run.tx, queue, name) is not None:
                raise InvalidState(
                    f"queue {queue!r} has a selector {name!r} already; unbind it first"
                )
            if role != "normal" and any(s["role"] == role for s in q.selectors_of(run.tx, queue)):
                raise InvalidState(
                    f"queue {queue!r} has a {role} selector already; unbind it first"
                )
            if dest_kind == "queue":
                assert dest is not None
                if q.get_queue(run.tx, dest) is None:
                    raise QueueNotFound(
                        f"destination queue {dest!r} does not exist; create it first"
                    )
                graph.check_acyclic(q.queue_edges(run.tx), queue, dest)
            sid = q.insert_selector(
                run.tx,
                queue=queue,
                name=name,
                mode=mode,
                role=role,
                match_rule=json.dumps(rule, sort_keys=True),
                dest_kind=dest_kind,
                dest=dest,
                credits=n,
                now=run.now,
            )
            run.forget()
            run.work.append(("pump-all", queue))
            row = q.selector_by_id(run.tx, sid)
            assert row is not None
            return codec.selector_info(row)

    def unbind(self, queue: str, name: str) -> list[int]:
        """Delete a selector. Its outstanding messages return to ``queue`` and are routed
        again (to other selectors, the default, the dead-letter queue, or held); returns
        their sequence numbers. A self-destructive queue left without selectors is deleted."""
        codec.name("queue name", queue, reserved_ok=True)
        with self._run() as run:
            sel = q.get_selector(run.tx, queue, name)
            if sel is None:
                raise SelectorNotFound(f"queue {queue!r} has no selector {name!r}")
            returned = credits.remove_selector(run, sel)
            graph.after_selector_removed(run, queue)
            return returned

    def selectors(self, queue: str | None = None) -> list[SelectorInfo]:
        with self.db.store.transaction(write=False) as tx:
            rows = q.all_selectors(tx) if queue is None else q.selectors_of(tx, queue)
            return [codec.selector_info(r) for r in rows]

    def grant(self, queue: str, name: str, credits: int) -> SelectorInfo:
        """Give a MOVE/BOUNCE selector more credits (trust for more unpaid messages)."""
        n = int(codec.count("credits", credits, allow_none=False, minimum=1) or 1)
        with self._run() as run:
            sel = q.get_selector(run.tx, queue, name)
            if sel is None:
                raise SelectorNotFound(f"queue {queue!r} has no selector {name!r}")
            if not codec.uses_credit(sel):
                raise InvalidState(f"selector {queue}/{name} copies; COPY uses no credits")
            run.refund(int(sel["id"]), n, grant=True)
            run.work.append(("pump", queue))
            run.flush()
            row = q.selector_by_id(run.tx, int(sel["id"]))
            assert row is not None
            return codec.selector_info(row)

    # -- messages ---------------------------------------------------------------------------
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
            out: list[Published] = []
            ledger: list[tuple[str, str, int | None, str, float]] = []
            firsts: dict[str, Published] = {}
            for mid, (data, kind) in zip(message_ids, encoded, strict=True):
                if mid in seen:
                    first = seen[mid]
                    out.append(Published(mid, first["queue"], first["seq"], first["outcome"], True))
                    continue
                earlier = firsts.get(mid)
                if earlier is not None:
                    out.append(Published(mid, earlier.queue, earlier.seq, earlier.outcome, True))
                    continue
                entry = q.NewEntry(
                    id=mid,
                    queue=queue,
                    headers=head,
                    body=data,
                    body_kind=kind,
                    address=queue,
                    return_address=return_address,
                    original_address=None,
                    reason=None,
                    parent_seq=None,
                    hops=0,
                    created_at=run.now,
                )
                try:
                    result = _publish_one(run, entry)
                except QueueFull as exc:
                    if len(bodies) > 1:
                        exc = QueueFull(f"{exc} ({len(out)} of {len(bodies)} fitted; none taken)")
                        raise exc from None
                    refused = exc
                    _record_refusal(run, entry)
                    break
                out.append(result)
                firsts[mid] = result
                ledger.append((mid, queue, result.seq, result.outcome, run.now))
            if ledger:
                routing.drain(run)
                q.record_published_many(run.tx, ledger)
        if refused is not None:
            raise refused
        return out

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
        deadline = time.monotonic() + (wait_s or 0.0)
        pause = 0.01
        while True:
            got = self._take_now(consumer, n, lease)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            self.db.store.wait_for_notification("homing_engine", min(left, pause))
            pause = min(pause * 2, 0.5)

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


# -- helpers of the API ------------------------------------------------------------------
def _destination(
    mode: str, role: str, to: str | None, consumer: str | None, job_type: str | None
) -> tuple[str, str | None]:
    if mode not in _MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if role not in ("normal", "default", "overflow"):
        raise InvalidArgument(f"role must be normal, default or overflow, got {role!r}")
    given = [
        (k, v)
        for k, v in (("queue", to), ("consumer", consumer), ("job", job_type))
        if v is not None
    ]
    if mode == "bounce":
        if given:
            raise InvalidArgument(
                "a bounce selector sends messages to their return address; give it no "
                "to=, consumer= or job_type="
            )
        return "bounce", None
    if len(given) != 1:
        raise InvalidArgument(
            "give a selector exactly one destination: to=QUEUE, consumer=NAME or job_type=TYPE"
        )
    dest_kind, dest = given[0]
    if dest_kind == "queue":
        codec.name("destination queue", dest, reserved_ok=True)
    elif dest_kind == "consumer":
        codec.name("consumer name", dest)
    else:
        from homing.jobs import check_type

        check_type(dest)
    return dest_kind, dest


def _in_use(run: Run, name: str) -> list[str]:
    """Why queue ``name`` cannot be deleted without force (empty if it can)."""
    busy = []
    if q.selectors_of(run.tx, name):
        busy.append("it has selectors")
    if q.count(run.tx, name, "ready") or q.count(run.tx, name, "outstanding"):
        busy.append("it holds unprocessed or outstanding messages")
    feeders = q.selectors_targeting(run.tx, name)
    if feeders:
        busy.append(
            "selectors route to it: " + ", ".join(f"{s['queue']}/{s['name']}" for s in feeders)
        )
    users = q.dead_letter_users(run.tx, name)
    if users:
        busy.append("it is the dead-letter queue of " + ", ".join(users))
    return busy


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
