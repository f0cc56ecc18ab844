"""The queue engine of seed 001, over the store.

Every operation runs in one store transaction (it joins the caller's if one is open), and
every piece of engine state (queues, selectors with their credits, message entries) is in
the store. A crash anywhere (for example at the failpoint ``engine.mid_route``) rolls the
whole operation back, so the rules hold across process crashes.

Routing is done eagerly inside the transaction that made a message routable (publish, ack,
bind, grant, unbind): a work list of entries to route and queues to pump is drained before
the transaction commits. The graph of queues is kept acyclic, and each message carries a
hop count, so the drain always ends.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from homing import ids
from homing._failpoints import failpoint
from homing.database import Database
from homing.engine import rules
from homing.engine.model import (
    Delivery,
    GraphCycle,
    Message,
    MessageNotFound,
    Published,
    QueueFull,
    QueueInfo,
    QueueNotFound,
    SelectorInfo,
    SelectorNotFound,
)
from homing.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidState,
    PayloadTooLarge,
    StaleLease,
)
from homing.store import engine_queries as q
from homing.store.protocol import Tx

log = logging.getLogger("homing.engine")

DEAD_LETTERS = q.DEAD_LETTERS
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADERS_BYTES = 64 * 1024
DEFAULT_MAX_HISTORY = 1000
MAX_HOPS = 64
MAX_LEASE_S = 30 * 24 * 3600.0
_MAX_NAME = 200
_MODES = ("move", "copy", "bounce")
_OVERFLOW_ACTIONS = ("reject", "discard", "overflow")
_PUMP_BATCH = 200


# -- validation ------------------------------------------------------------------------
def _name(what: str, value: Any, *, reserved_ok: bool = False) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME:
        raise InvalidArgument(
            f"{what} must be a non-empty string of at most {_MAX_NAME} characters, got {value!r}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"{what} {value[:50]!r} must not contain control characters")
    if value.startswith("$") and not (reserved_ok and value == DEAD_LETTERS):
        raise InvalidArgument(
            f"{what} {value!r}: names starting with '$' are reserved for the engine "
            f"(its dead-letter queue is {DEAD_LETTERS!r})"
        )
    return value


def _count(what: str, value: Any, *, allow_none: bool = True, minimum: int = 0) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value >= 2**62:
        raise InvalidArgument(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def _encode_body(body: Any, limit: int) -> tuple[bytes, str]:
    if isinstance(body, bytes | bytearray | memoryview):
        data, kind = bytes(body), "bytes"
    else:
        try:
            text = json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"a message body is bytes or a JSON value (dict, list, str, number, bool, "
                f"None; no NaN): {exc}"
            ) from exc
        data, kind = text.encode(), "json"
    if len(data) > limit:
        raise PayloadTooLarge(
            f"the message body is {len(data)} bytes, over the limit of {limit}; store large "
            "data elsewhere and send a reference, or raise max_body_bytes in Engine()"
        )
    return data, kind


def _encode_headers(headers: Any, limit: int) -> str:
    if headers is None:
        return "{}"
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) for k in headers):
        raise InvalidArgument(f"headers must be a dict with string keys, got {headers!r}"[:300])
    try:
        text = json.dumps(dict(headers), allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"headers must be JSON values (no NaN): {exc}") from exc
    if len(text.encode()) > limit:
        raise PayloadTooLarge(f"the headers are over the limit of {limit} bytes")
    return text


def _message(row: Mapping[str, Any]) -> Message:
    body: Any = row["body"]
    if row["body_kind"] == "json":
        body = json.loads(bytes(body).decode()) if body is not None else None
    elif body is not None:
        body = bytes(body)
    return Message(
        seq=int(row["seq"]),
        id=str(row["id"]),
        queue=str(row["queue"]),
        state=str(row["state"]),
        headers=json.loads(row["headers"]),
        body=body,
        address=str(row["address"]),
        return_address=row["return_address"],
        original_address=row["original_address"],
        reason=row["reason"],
        consumer=row["consumer"],
        job=row["job_id"],
        attempts=int(row["attempts"]),
        created_at=float(row["created_at"]),
    )


def _queue_info(row: Mapping[str, Any]) -> QueueInfo:
    return QueueInfo(
        name=row["name"],
        dead_letter=row["dead_letter"],
        max_unprocessed=row["max_unprocessed"],
        on_overflow=row["on_overflow"],
        max_history=row["max_history"],
        self_destruct=bool(row["self_destruct"]),
        discarded=int(row["discarded"]),
        created_at=float(row["created_at"]),
        ready=int(row.get("ready", 0)),
        outstanding=int(row.get("outstanding", 0)),
        done=int(row.get("done", 0)),
    )


def _selector_info(row: Mapping[str, Any]) -> SelectorInfo:
    return SelectorInfo(
        queue=row["queue"],
        name=row["name"],
        mode=row["mode"],
        role=row["role"],
        match=json.loads(row["match_rule"]),
        dest_kind=row["dest_kind"],
        dest=row["dest"],
        credits=int(row["credits"]),
        granted=int(row["granted"]),
    )


def _uses_credit(sel: Mapping[str, Any]) -> bool:
    return bool(sel["mode"] != "copy")


# -- one transaction's routing work --------------------------------------------------------
class _Run:
    """The routing work of one transaction: entries to route and queues to pump."""

    def __init__(self, engine: Engine, tx: Tx) -> None:
        self.engine = engine
        self.tx = tx
        self.now = engine.db.store.clock.now()
        self.work: deque[tuple[str, Any]] = deque()
        self.fate: dict[int, str] = {}
        self._queues: dict[str, dict[str, Any] | None] = {}

    # logging after commit, so a rolled-back discard is not reported
    def _log(self, msg: str, *args: Any) -> None:
        self.tx.call_after_commit(lambda: log.warning(msg, *args))

    def queue(self, name: str) -> dict[str, Any] | None:
        """A queue's row, cached for this transaction (routing reads the settings, never
        the counters; ``destroy_queue`` clears the cache)."""
        if name not in self._queues:
            self._queues[name] = q.get_queue(self.tx, name)
        return self._queues[name]

    def selectors(self, queue: str) -> list[dict[str, Any]]:
        return q.selectors_of(self.tx, queue)

    # -- arrival --------------------------------------------------------------------------
    def arrive(self, entry: q.NewEntry, *, external: bool) -> int | None:
        """Put a message into ``entry.queue`` honouring its limits; returns its seq if stored.

        Internal arrivals (moved, copied, bounced, dead-lettered) to a missing queue go to the
        engine's dead-letter queue; over the unprocessed limit with ``reject`` they go to the
        queue's dead-letter queue (there is no publisher to reject to), else are discarded.
        """
        queue = self.queue(entry.queue)
        if queue is None:
            return self._exception(entry, DEAD_LETTERS, f"no queue {entry.queue!r}", external)
        if entry.hops > MAX_HOPS:
            self._drop(entry, queue["name"], f"it passed through more than {MAX_HOPS} queues")
            return None
        limit = queue["max_unprocessed"]
        if limit is not None and q.count(self.tx, queue["name"], "ready") >= limit:
            action = queue["on_overflow"]
            if action == "reject" and external:
                raise QueueFull(
                    f"queue {queue['name']!r} is full ({limit} unprocessed messages) and rejects "
                    "new ones; retry later, or raise its max_unprocessed"
                )
            if action == "overflow":
                over = [s for s in self.selectors(queue["name"]) if s["role"] == "overflow"]
                if over and (not _uses_credit(over[0]) or over[0]["credits"] > 0):
                    seq = q.insert_entry(self.tx, entry)
                    row = q.get_entry(self.tx, seq)
                    assert row is not None
                    self.fate.setdefault(seq, "overflowed")
                    if over[0]["mode"] == "copy":
                        self.copy(over[0], row)
                        self.finish(row, "overflowed")
                    else:
                        self.dispatch(over[0], row)
                    return seq
                self._drop(
                    entry,
                    queue["name"],
                    "the queue is full and its overflow selector is missing or has no credit",
                )
                return None
            if action == "reject" and queue["dead_letter"]:
                self.tx.call_after_commit(
                    lambda: log.warning(
                        "queue %s full: message %s dead-lettered", queue["name"], entry.id
                    )
                )
                return self._exception(
                    entry, queue["dead_letter"], f"queue {queue['name']!r} is full", False
                )
            self._drop(entry, queue["name"], f"the queue is full ({limit} unprocessed)")
            return None
        seq = q.insert_entry(self.tx, entry)
        self.work.append(("route", seq))
        return seq

    def _exception(self, entry: q.NewEntry, dlq: str, reason: str, external: bool) -> int | None:
        """A message that cannot enter its queue goes to ``dlq`` owing no payment; whoever
        moved it here is paid at once (exceptions end the credit obligations)."""
        seq = self.arrive(
            _clone(entry, queue=dlq, reason=reason, parent=None, hops=entry.hops + 1),
            external=external,
        )
        if entry.parent_seq is not None:
            self.pay(entry.parent_seq)
        return seq

    def _drop(self, entry: q.NewEntry, queue: str, why: str) -> None:
        """Discard a message that was never stored in ``queue`` (logged); pay its parent."""
        q.add_discarded(self.tx, queue)
        self._log("queue %s: discarded message %s: %s", queue, entry.id, why)
        if entry.parent_seq is not None:
            self.pay(entry.parent_seq)

    # -- routing ----------------------------------------------------------------------------
    def route(self, seq: int) -> None:
        row = q.get_entry(self.tx, seq)
        if row is None or row["state"] != "ready":
            return
        sels = self.selectors(row["queue"])
        normal = [s for s in sels if s["role"] == "normal"]
        default = next((s for s in sels if s["role"] == "default"), None)
        if not normal and default is None:
            self.fate[seq] = "held"  # no selectors: hold the message as unprocessed
            return
        headers = json.loads(row["headers"])
        matched = [
            s
            for s in normal
            if rules.matches(json.loads(s["match_rule"]), headers)
            and (s["mode"] != "bounce" or row["return_address"])
        ]
        copies = [s for s in matched if s["mode"] == "copy"]
        movers = [s for s in matched if s["mode"] != "copy"]
        copied = bool(row["copied"])
        if copies and not copied:
            for s in copies:
                self.copy(s, row)
            q.mark_copied(self.tx, seq)
            copied = True
        failpoint("engine.mid_route")
        if movers:
            ready = [s for s in movers if s["credits"] > 0]
            if ready:
                self.dispatch(min(ready, key=lambda s: (s["last_used"], s["id"])), row)
            else:
                self.fate[seq] = "held"  # matching selectors are busy: wait for credit
            return
        if copied:
            self.finish(row, "processed")
            return
        if default is not None and (default["mode"] != "bounce" or row["return_address"]):
            if default["mode"] == "copy":
                self.copy(default, row)
                self.finish(row, "processed")
            elif default["credits"] > 0:
                self.dispatch(default, row)
            else:
                self.fate[seq] = "held"
            return
        queue = self.queue(row["queue"])
        assert queue is not None
        if queue["dead_letter"]:
            self.dead_letter(row, queue["dead_letter"], "no selector matched")
        else:
            self.discard(row, "no selector matched and the queue has no dead-letter queue")

    def dispatch(self, sel: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """Give a ready entry to a MOVE or BOUNCE selector: spend a credit, make it outstanding."""
        seq = int(row["seq"])
        kind = sel["dest_kind"]
        if sel["mode"] == "bounce":
            target = row["return_address"]
            if not target or self.queue(target) is None:
                self.dead_letter(
                    row,
                    DEAD_LETTERS,
                    f"bounce: return address {target!r} is not a queue",
                    bounced=True,
                )
                return
        if _uses_credit(sel):
            q.spend_credit(self.tx, int(sel["id"]), seq)
        if kind == "consumer":
            q.set_outstanding(
                self.tx, seq, selector_id=int(sel["id"]), consumer=sel["dest"], job_id=None
            )
        elif kind == "job":
            job = self.engine.db.insert(sel["dest"], self.engine.job_args(row))
            q.set_outstanding(self.tx, seq, selector_id=int(sel["id"]), consumer=None, job_id=job)
        else:
            q.set_outstanding(self.tx, seq, selector_id=int(sel["id"]), consumer=None, job_id=None)
            if kind == "bounce":
                child = _from_row(
                    row,
                    queue=row["return_address"],
                    address=row["return_address"],
                    return_address=None,
                    original_address=row["original_address"] or row["address"],
                    parent=seq,
                )
            else:
                child = _from_row(row, queue=sel["dest"], parent=seq)
            self.arrive(child, external=False)
        self.fate.setdefault(seq, "routed")

    def copy(self, sel: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """COPY: no credits, no payment expected."""
        kind = sel["dest_kind"]
        if kind == "queue":
            self.arrive(_from_row(row, queue=sel["dest"], parent=None), external=False)
        elif kind == "job":
            self.engine.db.insert(sel["dest"], self.engine.job_args(row))
        else:  # a consumer gets its own copy entry, outstanding on the COPY selector
            copy = _from_row(row, queue=row["queue"], parent=None, hops=int(row["hops"]))
            seq = q.insert_entry(self.tx, copy)
            q.mark_copied(self.tx, seq)
            q.set_outstanding(
                self.tx, seq, selector_id=int(sel["id"]), consumer=sel["dest"], job_id=None
            )

    # -- settling ---------------------------------------------------------------------------
    def finish(self, row: Mapping[str, Any], fate: str) -> None:
        """The entry is processed in its queue: into history; pay whoever moved it here."""
        seq = int(row["seq"])
        q.set_done(self.tx, seq, now=self.now)
        self.fate.setdefault(seq, fate)
        self._trim(row["queue"])
        if row["parent_seq"] is not None:
            self.pay(int(row["parent_seq"]))

    def discard(self, row: Mapping[str, Any], why: str) -> None:
        seq = int(row["seq"])
        q.add_discarded(self.tx, row["queue"])
        self._log("queue %s: discarded message %s (seq %s): %s", row["queue"], row["id"], seq, why)
        self.fate.setdefault(seq, "discarded")
        q.delete_entry(self.tx, seq)
        if row["parent_seq"] is not None:
            self.pay(int(row["parent_seq"]))

    def dead_letter(
        self, row: Mapping[str, Any], dlq: str, reason: str, *, bounced: bool = False
    ) -> None:
        """An exception: a fresh copy goes to ``dlq`` (owing no payment); this entry is done.

        ``bounced``: a bounce failed, so the return address is spent (it is cleared, and
        the message cannot bounce around the dead-letter queue again)."""
        self.fate.setdefault(int(row["seq"]), "dead-lettered")
        extra: dict[str, Any] = {}
        if bounced:
            extra = {
                "return_address": None,
                "original_address": row["original_address"] or row["address"],
            }
        self.arrive(
            _from_row(row, queue=dlq, parent=None, reason=f"{row['queue']}: {reason}", **extra),
            external=False,
        )
        self.finish(row, "dead-lettered")

    def pay(self, seq: int) -> None:
        """Payment for an outstanding entry: it is done, its selector gets its credit back,
        and the queue it sits in pays its own parent in turn (credits flow up the graph)."""
        while True:
            row = q.get_entry(self.tx, seq)
            if row is None or row["state"] != "outstanding":
                return
            q.set_done(self.tx, seq, now=self.now)
            sel = q.selector_by_id(self.tx, int(row["selector_id"]))
            if sel is not None and _uses_credit(sel):
                q.add_credits(self.tx, int(sel["id"]), 1)
                self.work.append(("pump", row["queue"]))
            self._trim(row["queue"])
            if row["parent_seq"] is None:
                return
            seq = int(row["parent_seq"])

    def _trim(self, queue: str) -> None:
        row = self.queue(queue)
        keep = row["max_history"] if row is not None else None
        if keep is not None:
            q.trim_history(self.tx, queue, int(keep))

    # -- returning messages -----------------------------------------------------------------
    def withdraw(self, seq: int) -> None:
        """Take an outstanding entry back from its destination: it is ready again in its queue.

        Children it was moved to are withdrawn recursively (their selectors get their credits
        back); a consumer's lease is cancelled, so a later ack is refused.
        """
        row = q.get_entry(self.tx, seq)
        if row is None or row["state"] != "outstanding":
            return
        for child in q.live_children(self.tx, seq):
            if child["state"] == "outstanding":
                self.withdraw(int(child["seq"]))  # returns the child's selector's credit
            q.delete_entry(self.tx, int(child["seq"]))
        sel = q.selector_by_id(self.tx, int(row["selector_id"]))
        q.set_ready(self.tx, seq)
        if sel is not None and _uses_credit(sel):
            q.add_credits(self.tx, int(sel["id"]), 1)
            self.work.append(("pump", row["queue"]))

    def remove_selector(self, sel: Mapping[str, Any]) -> list[int]:
        """Delete a selector; its outstanding messages go back to its queue (returned seqs).

        Messages given to a job type are settled instead: the job table has them durably and
        a job cannot be taken back from a worker. A COPY selector's outstanding copies are
        dropped (the original was never owed to it).
        """
        returned: list[int] = []
        for seq in q.outstanding_of(self.tx, int(sel["id"])):
            if sel["mode"] == "copy":
                q.delete_entry(self.tx, seq)
            elif sel["dest_kind"] == "job":
                self.pay(seq)
            else:
                self.withdraw(seq)
                returned.append(seq)
        q.delete_selector(self.tx, int(sel["id"]))
        return returned

    def destroy_queue(self, name: str) -> None:
        """Delete a queue and what it holds: its selectors return their messages; held
        messages are bounced to their return address, or else go to the engine's dead-letter
        queue; selectors of other queues that fed it are deleted (self-destruct cascades)."""
        for sel in self.selectors(name):
            self.remove_selector(sel)
        while True:
            batch = q.entries(self.tx, name, state="ready", limit=_PUMP_BATCH)
            if not batch:
                break
            for row in batch:
                target = row["return_address"]
                if target and target != name and self.queue(target) is not None:
                    self.arrive(
                        _from_row(
                            row,
                            queue=target,
                            address=target,
                            return_address=None,
                            original_address=row["original_address"] or row["address"],
                            parent=None,
                            reason=f"queue {name!r} was deleted",
                        ),
                        external=False,
                    )
                    self.finish(row, "bounced")
                else:
                    self.dead_letter(row, DEAD_LETTERS, f"queue {name!r} was deleted")
        feeders = q.selectors_targeting(self.tx, name)
        q.delete_queue(self.tx, name)
        self._queues.clear()  # the queue is gone, and dead-letter links to it too
        for sel in feeders:
            self.remove_selector(sel)
            self.after_selector_removed(sel["queue"])

    def after_selector_removed(self, queue: str) -> None:
        row = self.queue(queue)
        if row is None:
            return
        if row["self_destruct"] and not self.selectors(queue):
            self.destroy_queue(queue)
        else:
            self.work.append(("pump-all", queue))

    # -- pumping ----------------------------------------------------------------------------
    def pump(self, queue: str, *, everything: bool) -> None:
        """Route the ready entries of ``queue`` again, oldest first.

        After a payment only credit has changed, so it stops once the queue's MOVE selectors
        have no credit left; after a change of selectors (``everything``) every entry is
        routed again, since it may now match, or match nothing.
        """
        after = 0
        while True:
            if not everything and not any(
                _uses_credit(s) and s["credits"] > 0 and s["role"] != "overflow"
                for s in self.selectors(queue)
            ):
                return
            batch = q.entries(self.tx, queue, state="ready", limit=_PUMP_BATCH, after_seq=after)
            if not batch:
                return
            for row in batch:
                after = int(row["seq"])
                self.route(after)
                self.drain_routes()
                if not everything and not any(
                    _uses_credit(s) and s["credits"] > 0 and s["role"] != "overflow"
                    for s in self.selectors(queue)
                ):
                    return

    def drain_routes(self) -> None:
        pending = [w for w in self.work if w[0] == "route"]
        self.work = deque(w for w in self.work if w[0] != "route")
        todo = deque(pending)
        while todo:
            _, seq = todo.popleft()
            self.route(seq)
            todo.extend(w for w in self.work if w[0] == "route")
            self.work = deque(w for w in self.work if w[0] != "route")

    def drain(self) -> None:
        """Do all routing work this transaction made necessary."""
        while self.work:
            self.drain_routes()
            if not self.work:
                return
            kind, queue = self.work.popleft()
            # collapse repeated pumps of one queue
            everything = kind == "pump-all" or ("pump-all", queue) in self.work
            self.work = deque(w for w in self.work if w[1] != queue or w[0] == "route")
            if self.queue(queue) is not None:
                self.pump(queue, everything=everything)


def _from_row(
    row: Mapping[str, Any],
    *,
    queue: str,
    parent: int | None,
    address: str | None = None,
    return_address: Any = ...,
    original_address: Any = ...,
    reason: Any = ...,
    hops: int | None = None,
) -> q.NewEntry:
    """A new entry for the message of ``row``; unnamed envelope fields are kept."""
    body = row["body"]
    return q.NewEntry(
        id=row["id"],
        queue=queue,
        headers=row["headers"],
        body=bytes(body) if body is not None else None,
        body_kind=row["body_kind"],
        address=address if address is not None else row["address"],
        return_address=row["return_address"] if return_address is ... else return_address,
        original_address=row["original_address"] if original_address is ... else original_address,
        reason=row["reason"] if reason is ... else reason,
        parent_seq=parent,
        hops=int(row["hops"]) + 1 if hops is None else hops,
        created_at=float(row["created_at"]),
    )


def _clone(
    e: q.NewEntry, *, queue: str, reason: str, parent: int | None, hops: int | None = None
) -> q.NewEntry:
    return q.NewEntry(
        id=e.id,
        queue=queue,
        headers=e.headers,
        body=e.body,
        body_kind=e.body_kind,
        address=e.address,
        return_address=e.return_address,
        original_address=e.original_address,
        reason=reason,
        parent_seq=parent,
        hops=e.hops if hops is None else hops,
        created_at=e.created_at,
    )


# -- the public API ------------------------------------------------------------------------
class Engine:
    """Queues and selectors as a directed graph, in a homing store (seed 001).

    ``Engine(db)`` works on a ``homing.Database`` (one store). Calls made inside an open
    ``db.transaction()`` join it, so a consumer's ``ack`` commits together with its own
    writes.
    """

    def __init__(
        self,
        db: Database,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_headers_bytes: int = DEFAULT_MAX_HEADERS_BYTES,
    ) -> None:
        if not isinstance(db, Database):
            raise ConfigurationError(
                "the queue engine works on one store (homing.Database); a sharded store is not "
                "supported: connect to a single URL"
            )
        self.db = db
        self.max_body_bytes = int(
            _count("max_body_bytes", max_body_bytes, allow_none=False, minimum=1) or 1
        )
        self.max_headers_bytes = int(
            _count("max_headers_bytes", max_headers_bytes, allow_none=False, minimum=2) or 2
        )

    @contextmanager
    def _run(self) -> Iterator[_Run]:
        with self.db.store.transaction() as tx:
            q.lock_engine(tx)
            run = _Run(self, tx)
            yield run
            run.drain()

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
        exist_ok: bool = False,
    ) -> QueueInfo:
        """Create a queue. ``on_overflow`` is what happens to a new message when
        ``max_unprocessed`` are waiting: ``reject`` (the publisher gets ``QueueFull``),
        ``discard`` (logged; the default) or ``overflow`` (the overflow selector takes it).
        ``max_history`` processed messages are kept (oldest dropped first; None keeps all).
        A ``self_destruct`` queue deletes itself when its last selector is deleted."""
        _name("queue name", name)
        if dead_letter is not None:
            _name("dead_letter", dead_letter, reserved_ok=True)
            if dead_letter == name:
                raise InvalidArgument(f"queue {name!r} cannot be its own dead-letter queue")
        mu = _count("max_unprocessed", max_unprocessed)
        mh = _count("max_history", max_history)
        if on_overflow not in _OVERFLOW_ACTIONS:
            raise InvalidArgument(
                f"on_overflow must be one of {', '.join(_OVERFLOW_ACTIONS)}, got {on_overflow!r}"
            )
        if not isinstance(self_destruct, bool):
            raise InvalidArgument(f"self_destruct must be true or false, got {self_destruct!r}")
        with self._run() as run:
            existing = q.get_queue(run.tx, name)
            if existing is not None:
                same = (
                    existing["dead_letter"] == dead_letter
                    and existing["max_unprocessed"] == mu
                    and existing["on_overflow"] == on_overflow
                    and existing["max_history"] == mh
                    and bool(existing["self_destruct"]) == self_destruct
                )
                if exist_ok and same:
                    return _queue_info(existing)
                raise InvalidState(
                    f"queue {name!r} exists already"
                    + ("" if same else " with other settings")
                    + "; delete it first or pick another name"
                )
            if dead_letter is not None and q.get_queue(run.tx, dead_letter) is None:
                raise QueueNotFound(
                    f"dead-letter queue {dead_letter!r} does not exist; create it first"
                )
            q.insert_queue(
                run.tx,
                name=name,
                dead_letter=dead_letter,
                max_unprocessed=mu,
                on_overflow=on_overflow,
                max_history=mh,
                self_destruct=self_destruct,
                now=run.now,
            )
            row = q.get_queue(run.tx, name)
            assert row is not None
            return _queue_info(row)

    def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue. Without ``force`` it must be empty and unused (no selectors, no
        unprocessed or outstanding messages, nothing routing to it). With ``force`` its
        selectors return their messages, held messages are bounced or dead-lettered, and
        selectors of other queues that feed it are deleted."""
        _name("queue name", name)
        with self._run() as run:
            row = q.get_queue(run.tx, name)
            if row is None:
                raise QueueNotFound(f"no queue {name!r}; `homing queues list` shows the queues")
            if not force:
                busy = []
                if q.selectors_of(run.tx, name):
                    busy.append("it has selectors")
                if q.count(run.tx, name, "ready") or q.count(run.tx, name, "outstanding"):
                    busy.append("it holds unprocessed or outstanding messages")
                feeders = q.selectors_targeting(run.tx, name)
                if feeders:
                    busy.append(
                        "selectors route to it: "
                        + ", ".join(f"{s['queue']}/{s['name']}" for s in feeders)
                    )
                if busy:
                    raise InvalidState(
                        f"queue {name!r} is in use ({'; '.join(busy)}); unbind and drain it, "
                        "or delete with force=True"
                    )
            run.destroy_queue(name)

    def queue(self, name: str) -> QueueInfo:
        """One queue with its depths."""
        for info in self.queues():
            if info.name == name:
                return info
        raise QueueNotFound(f"no queue {name!r}")

    def queues(self) -> list[QueueInfo]:
        """Every queue (the engine's dead-letter queue ``$dead`` too) with its depths."""
        with self.db.store.transaction(write=False) as tx:
            return [_queue_info(r) for r in q.list_queues(tx)]

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
        _name("queue name", queue, reserved_ok=True)
        _name("selector name", name)
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
            dest_kind, dest = "bounce", None
        else:
            if len(given) != 1:
                raise InvalidArgument(
                    "give a selector exactly one destination: to=QUEUE, consumer=NAME or job_type=TYPE"
                )
            dest_kind, dest = given[0]
            if dest_kind == "queue":
                _name("destination queue", dest, reserved_ok=True)
            elif dest_kind == "consumer":
                _name("consumer name", dest)
            else:
                from homing.jobs import check_type

                check_type(dest)
        rule = rules.validate(match)
        n = int(_count("credits", credits, allow_none=False) or 0)
        if mode == "copy":
            n = 0
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
                _check_acyclic(q.queue_edges(run.tx), queue, dest)
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
            run.work.append(("pump-all", queue))
            row = q.selector_by_id(run.tx, sid)
            assert row is not None
            return _selector_info(row)

    def unbind(self, queue: str, name: str) -> list[int]:
        """Delete a selector. Its outstanding messages return to ``queue`` and are routed
        again (to other selectors, the default, the dead-letter queue, or held); returns
        their sequence numbers. A self-destructive queue left without selectors is deleted."""
        _name("queue name", queue, reserved_ok=True)
        with self._run() as run:
            sel = q.get_selector(run.tx, queue, name)
            if sel is None:
                raise SelectorNotFound(f"queue {queue!r} has no selector {name!r}")
            returned = run.remove_selector(sel)
            run.after_selector_removed(queue)
            return returned

    def selectors(self, queue: str | None = None) -> list[SelectorInfo]:
        with self.db.store.transaction(write=False) as tx:
            rows = q.all_selectors(tx) if queue is None else q.selectors_of(tx, queue)
            return [_selector_info(r) for r in rows]

    def grant(self, queue: str, name: str, credits: int) -> SelectorInfo:
        """Give a MOVE/BOUNCE selector more credits (trust for more unpaid messages)."""
        n = int(_count("credits", credits, allow_none=False, minimum=1) or 1)
        with self._run() as run:
            sel = q.get_selector(run.tx, queue, name)
            if sel is None:
                raise SelectorNotFound(f"queue {queue!r} has no selector {name!r}")
            if not _uses_credit(sel):
                raise InvalidState(f"selector {queue}/{name} copies; COPY uses no credits")
            q.add_credits(run.tx, int(sel["id"]), n, grant=True)
            run.work.append(("pump", queue))
            row = q.selector_by_id(run.tx, int(sel["id"]))
            assert row is not None
            return _selector_info(row)

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
        raises ``QueueFull`` and stores nothing.
        """
        _name("queue name", queue, reserved_ok=True)
        if return_address is not None:
            _name("return_address", return_address, reserved_ok=True)
        if id is None:
            message_id = ids.uuid7()
        elif isinstance(id, str) and ids.is_uuid(id):
            message_id = id
        else:
            raise InvalidArgument(
                f"a message id is a UUID in text form (homing.uuid7()), got {id!r}"
            )
        data, kind = _encode_body(body, self.max_body_bytes)
        head = _encode_headers(headers, self.max_headers_bytes)
        with self._run() as run:
            seen = q.published(run.tx, message_id)
            if seen is not None:
                return Published(message_id, seen["queue"], seen["seq"], seen["outcome"], True)
            entry = q.NewEntry(
                id=message_id,
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
            if run.queue(queue) is None:
                entry = _clone(entry, queue=DEAD_LETTERS, reason=f"no queue {queue!r}", parent=None)
                run.tx.call_after_commit(
                    lambda: log.warning(
                        "publish to unknown queue %r: message %s dead-lettered", queue, message_id
                    )
                )
            seq = run.arrive(entry, external=True)
            run.drain()
            if entry.queue == DEAD_LETTERS and queue != DEAD_LETTERS:
                outcome = "dead-lettered"
            elif seq is None:
                outcome = "discarded"
            else:
                outcome = _outcome(run, seq)
            q.record_published(
                run.tx, message_id, queue=queue, seq=seq, outcome=outcome, now=run.now
            )
            return Published(message_id, queue, seq, outcome)

    def take(self, consumer: str, *, limit: int = 1, lease_for: float = 60.0) -> list[Delivery]:
        """Lease up to ``limit`` messages given to ``consumer``, oldest first. A message whose
        lease runs out without ack can be taken again (at-least-once)."""
        _name("consumer name", consumer)
        n = int(_count("limit", limit, allow_none=False, minimum=1) or 1)
        if (
            isinstance(lease_for, bool)
            or not isinstance(lease_for, int | float)
            or not (0 < lease_for <= MAX_LEASE_S and math.isfinite(lease_for))
        ):
            raise InvalidArgument(
                f"lease_for must be seconds in (0, {MAX_LEASE_S:g}], got {lease_for!r}"
            )
        with self._run() as run:
            rows = q.takeable(run.tx, consumer, now=run.now, limit=n)
            token = ids.uuid7()
            until = run.now + float(lease_for)
            out = []
            for row in rows:
                q.lease(run.tx, int(row["seq"]), token=token, until=until)
                row = {**row, "attempts": int(row["attempts"]) + 1}
                out.append(Delivery(_message(row), token, until))
            return out

    def _leased(
        self, run: _Run, delivery: Delivery | int, lease_token: str | None
    ) -> dict[str, Any]:
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
                "deleted and the message returned to its queue (or it was trimmed from history)"
            )
        if row["state"] == "done":
            raise InvalidState(f"message entry {seq} was acked already")
        if row["lease_token"] != token:
            raise StaleLease(
                f"your lease on message entry {seq} is stale: it expired and the message was "
                "taken again (or taken back); drop your work on it"
            )
        return row

    def ack(self, delivery: Delivery | int, *, lease_token: str | None = None) -> None:
        """Pay for a message: it is done, and its selector (and every MOVE selector above it)
        gets its credit back. Runs in the caller's transaction if one is open."""
        with self._run() as run:
            row = self._leased(run, delivery, lease_token)
            run.pay(int(row["seq"]))

    def nack(
        self, delivery: Delivery | int, *, requeue: bool = True, lease_token: str | None = None
    ) -> None:
        """Refuse a message. ``requeue``: it can be taken again at once. Otherwise it is an
        exception: it goes to its queue's dead-letter queue (else it is discarded, logged) and
        is paid for, so the selector's credit comes back."""
        with self._run() as run:
            row = self._leased(run, delivery, lease_token)
            if requeue:
                q.release(run.tx, int(row["seq"]))
                return
            queue = q.get_queue(run.tx, row["queue"])
            dlq = queue["dead_letter"] if queue is not None else None
            if dlq:
                run.arrive(
                    _from_row(
                        row,
                        queue=dlq,
                        parent=None,
                        reason=f"{row['queue']}: rejected by consumer {row['consumer']}",
                    ),
                    external=False,
                )
            else:
                q.add_discarded(run.tx, row["queue"])
                run._log(
                    "queue %s: consumer rejected message %s; discarded", row["queue"], row["id"]
                )
            run.pay(int(row["seq"]))

    def settle_jobs(self, *, limit: int = 1000) -> int:
        """Pay for messages given to job types whose jobs have ended: a done (or
        garbage-collected) job pays; a perm-failed one is an exception (dead-lettered or
        discarded) and pays too. Call it periodically; returns how many were settled."""
        with self._run() as run:
            done = q.finished_job_entries(run.tx, limit)
            for seq, state in done:
                if state == "failed":
                    row = q.get_entry(run.tx, seq)
                    assert row is not None
                    queue = q.get_queue(run.tx, row["queue"])
                    if queue is not None and queue["dead_letter"]:
                        run.arrive(
                            _from_row(
                                row,
                                queue=queue["dead_letter"],
                                parent=None,
                                reason=f"{row['queue']}: job {row['job_id']} failed",
                            ),
                            external=False,
                        )
                    else:
                        q.add_discarded(run.tx, row["queue"])
                run.pay(seq)
            return len(done)

    def messages(
        self, queue: str, *, state: str | None = None, limit: int = 100, after_seq: int = 0
    ) -> list[Message]:
        """Entries of a queue, oldest first (``state``: ready, outstanding or done)."""
        if state not in (None, "ready", "outstanding", "done"):
            raise InvalidArgument(f"state must be ready, outstanding or done, got {state!r}")
        n = int(_count("limit", limit, allow_none=False, minimum=1) or 1)
        with self.db.store.transaction(write=False) as tx:
            if q.get_queue(tx, queue) is None:
                raise QueueNotFound(f"no queue {queue!r}")
            return [
                _message(r) for r in q.entries(tx, queue, state=state, limit=n, after_seq=after_seq)
            ]

    def dead_letters(self, queue: str = DEAD_LETTERS, *, limit: int = 100) -> list[Message]:
        """Unprocessed messages of a dead-letter queue (by default the engine's ``$dead``)."""
        return self.messages(queue, state="ready", limit=limit)

    def redrive(self, seq: int, *, to: str | None = None) -> Published:
        """Publish a held message (typically a dead letter) again, to ``to`` or to its address;
        the old entry is done. An unknown target is refused and nothing changes."""
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise InvalidArgument(f"seq must be an integer, got {seq!r}")
        if to is not None:
            _name("to", to, reserved_ok=True)
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
            new_seq = run.arrive(
                _from_row(row, queue=target, address=target, parent=None, hops=0, reason=None),
                external=True,
            )
            run.finish(row, "redriven")
            run.drain()
            outcome = "discarded" if new_seq is None else _outcome(run, new_seq)
            return Published(str(row["id"]), target, new_seq, outcome)

    def check(self) -> list[str]:
        """Check the books: for every MOVE/BOUNCE selector credits held + messages outstanding
        = credits granted, and the graph's entries are consistent. Returns the violations."""
        problems = []
        with self.db.store.transaction(write=False) as tx:
            for sid, queue, name, held, outstanding, granted in q.credit_books(tx):
                sel = q.selector_by_id(tx, sid)
                if sel is not None and not _uses_credit(sel):
                    continue
                if held < 0 or held + outstanding != granted:
                    problems.append(
                        f"selector {queue}/{name}: {held} credits held + {outstanding} outstanding "
                        f"!= {granted} granted"
                    )
            problems += [f"entry {seq}: {what}" for what, seq in q.orphans(tx)]
        return problems


def _outcome(run: _Run, seq: int) -> str:
    row = q.get_entry(run.tx, seq)
    if row is None:
        return run.fate.get(seq, "discarded")
    if row["state"] == "outstanding":
        return "routed"
    if row["state"] == "ready":
        return "held"
    return run.fate.get(seq, "processed")


def _check_acyclic(edges: list[tuple[str, str]], src: str, dest: str) -> None:
    if src == dest:
        raise GraphCycle(f"a selector on {src!r} cannot route to {src!r} itself")
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    seen = {dest}
    stack = [(dest, [dest])]
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, []):
            if nxt == src:
                loop = " -> ".join([src, *path, src])
                raise GraphCycle(
                    f"routing {src!r} to {dest!r} would close the loop {loop}; messages could "
                    "circle forever. Route elsewhere or unbind a selector of the loop first"
                )
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
