"""Routing: a message arrives in a queue and goes to a selector, is held, or is an exception.

Routing is eager, inside the transaction that made a message routable (publish, ack,
bind, grant, unbind, a lapsed lease): a work list of entries to route and queues to pump
is drained before the transaction commits. The graph of queues is kept acyclic and each
message carries a hop count, so the drain always ends.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

from homing._failpoints import failpoint
from homing.engine import codec, credits, dead_letters, limits, rules
from homing.engine.run import Run
from homing.store import engine_queries as q

MAX_HOPS = 64
PUMP_BATCH = 200
HEAD_BATCH = 1000


def arrive(run: Run, entry: q.NewEntry, *, external: bool) -> int | None:
    """Put a message into ``entry.queue`` honouring its limits; returns its seq if stored.

    A message for a missing queue goes to the engine's dead-letter queue; over the
    unprocessed limit, ``limits.overflow`` decides (``external``: a publisher, who can be
    rejected)."""
    queue = run.queue(entry.queue)
    if queue is None:
        return dead_letters.refuse(run, entry, None, "no_queue", f"no queue {entry.queue!r}")
    if entry.hops > MAX_HOPS:
        dead_letters.refuse(
            run, entry, queue, "hop_limit", f"it passed through more than {MAX_HOPS} queues"
        )
        return None
    if limits.is_full(run, queue):
        handled, seq = limits.overflow(run, entry, queue, external=external)
        if handled:
            return seq
    ttl = queue["message_ttl"]
    if ttl is not None:
        entry = _with_expiry(entry, run.now + float(ttl))
    if queue["expires"] is not None and external:
        q.touch_queue(run.tx, entry.queue, run.now)
    seq = _insert_moving(run, entry)
    if seq is None:
        seq = q.insert_entry(run.tx, entry)
        route(run, seq, q.entry_row(seq, entry))
    return seq


def _insert_moving(run: Run, entry: q.NewEntry) -> int | None:
    """The common case in one statement: a queue with only MOVE selectors, one of which
    has credit and takes the message to a queue or a consumer; the entry is stored as
    already given to it. Returns None for everything else (stored ready, then routed)."""
    sels = run.selectors(entry.queue)
    normal = [s for s in sels if s["role"] == "normal"]
    if not normal or any(s["mode"] != "move" for s in normal):
        return None
    matched = _matched(run, normal, json.loads(entry.headers), entry.return_address)
    ready = [s for s in matched if s["credits"] > 0 and run.alive(s)]
    if not ready:
        return None
    sel = min(ready, key=lambda s: (s["last_used"], s["id"]))
    if sel["dest_kind"] not in ("queue", "consumer"):
        return None
    consumer = sel["dest"] if sel["dest_kind"] == "consumer" else None
    offer = run.now + run.engine.consumer_timeout if consumer is not None else None
    seq = q.insert_entry(
        run.tx, entry, selector_id=int(sel["id"]), consumer=consumer, offer_until=offer
    )
    failpoint("engine.mid_route")
    run.spend(sel, seq)
    run.fate.setdefault(seq, "routed")
    if consumer is not None:
        run.notify = True
    else:
        row = {**q.entry_row(seq, entry), "state": "outstanding", "selector_id": int(sel["id"])}
        arrive(run, codec.from_row(row, queue=sel["dest"], parent=seq), external=False)
    return seq


def _with_expiry(e: q.NewEntry, at: float) -> q.NewEntry:
    return q.NewEntry(**{**e.__dict__, "expires_at": at})


def _matched(
    run: Run, sels: list[dict[str, Any]], headers: Mapping[str, Any], ret: Any
) -> list[dict[str, Any]]:
    return [
        s
        for s in sels
        if s["role"] == "normal"
        and rules.matches(json.loads(s["match_rule"]), headers)
        and (s["mode"] != "bounce" or ret)
    ]


def route(run: Run, seq: int, row: Mapping[str, Any] | None = None) -> None:
    """Route one ready entry: copies first, then one MOVE/BOUNCE selector with credit,
    else the default selector, else an exception (``unroutable``)."""
    if row is None:
        row = q.get_entry(run.tx, seq)
    if row is None or row["state"] != "ready":
        return
    if row.get("expires_at") is not None and float(row["expires_at"]) <= run.now:
        dead_letters.fail(run, row, "expired", "its time to live ran out")
        return
    sels = run.selectors(row["queue"])
    normal = [s for s in sels if s["role"] == "normal"]
    default = next((s for s in sels if s["role"] == "default"), None)
    if not normal and default is None:
        run.fate[seq] = "held"  # no selectors: hold the message as unprocessed
        return
    matched = _matched(run, normal, json.loads(row["headers"]), row["return_address"])
    copies = [s for s in matched if s["mode"] == "copy"]
    movers = [s for s in matched if s["mode"] != "copy"]
    copied = bool(row["copied"])
    if copies and not copied:
        for s in copies:
            copy(run, s, row)
        q.mark_copied(run.tx, seq)
        row = {**row, "copied": 1}
        copied = True
    failpoint("engine.mid_route")
    if movers:
        ready = [s for s in movers if s["credits"] > 0 and run.alive(s)]
        if ready:
            dispatch(run, min(ready, key=lambda s: (s["last_used"], s["id"])), row)
        else:
            _hold_for(run, row, movers)  # matching selectors are busy: wait for credit
        return
    if copied:
        credits.finish(run, row, "processed")
        return
    if default is not None and (default["mode"] != "bounce" or row["return_address"]):
        if default["mode"] == "copy":
            copy(run, default, row)
            credits.finish(run, row, "processed")
        elif default["credits"] > 0 and run.alive(default):
            dispatch(run, default, row)
        else:
            _hold_for(run, row, [default])
        return
    dead_letters.fail(run, row, "unroutable", "no selector matched")


def _hold_for(run: Run, row: Mapping[str, Any], selectors: list[dict[str, Any]]) -> None:
    """The entry waits for credit of one of ``selectors``; recorded, so that a payment
    reads only the entries it can move (not every waiting message)."""
    seq = int(row["seq"])
    run.fate[seq] = "held"
    waiting = "," + ",".join(str(s["id"]) for s in sorted(selectors, key=lambda s: s["id"])) + ","
    if row.get("waiting_for") != waiting:
        q.set_waiting(run.tx, seq, waiting)


def dispatch(run: Run, sel: dict[str, Any], row: Mapping[str, Any]) -> None:
    """Give a ready entry to a MOVE or BOUNCE selector: spend a credit, make it outstanding."""
    seq = int(row["seq"])
    kind = sel["dest_kind"]
    if sel["mode"] == "bounce":
        target = row["return_address"]
        if not target or run.queue(target) is None:
            dead_letters.dead_letter(
                run,
                row,
                codec.DEAD_LETTERS,
                "bounce_failed",
                f"bounce: return address {target!r} is not a queue",
                bounced=True,
            )
            return
    if codec.uses_credit(sel):
        run.spend(sel, seq)
    sid = int(sel["id"])
    if kind == "consumer":
        offer = run.now + run.engine.consumer_timeout
        q.set_outstanding(
            run.tx, seq, selector_id=sid, consumer=sel["dest"], job_id=None, offer_until=offer
        )
        run.notify = True
    elif kind == "job":
        job = run.engine.db.insert(sel["dest"], run.engine.job_args(row))
        q.set_outstanding(run.tx, seq, selector_id=sid, consumer=None, job_id=job)
    else:
        q.set_outstanding(run.tx, seq, selector_id=sid, consumer=None, job_id=None)
        if kind == "bounce":
            child = codec.from_row(
                row,
                queue=row["return_address"],
                address=row["return_address"],
                return_address=None,
                original_address=row["original_address"] or row["address"],
                parent=seq,
            )
        else:
            child = codec.from_row(row, queue=sel["dest"], parent=seq)
        arrive(run, child, external=False)
    run.fate.setdefault(seq, "routed")


def copy(run: Run, sel: Mapping[str, Any], row: Mapping[str, Any]) -> None:
    """COPY: no credits, no payment expected."""
    kind = sel["dest_kind"]
    if kind == "queue":
        arrive(run, codec.from_row(row, queue=sel["dest"], parent=None), external=False)
    elif kind == "job":
        run.engine.db.insert(sel["dest"], run.engine.job_args(row))
    else:  # a consumer gets its own copy entry, outstanding on the COPY selector
        entry = codec.from_row(row, queue=row["queue"], parent=None, hops=int(row["hops"]))
        seq = q.insert_entry(run.tx, entry)
        q.mark_copied(run.tx, seq)
        q.set_outstanding(
            run.tx,
            seq,
            selector_id=int(sel["id"]),
            consumer=sel["dest"],
            job_id=None,
            offer_until=run.now + run.engine.consumer_timeout,
        )
        run.notify = True


# -- pumping ----------------------------------------------------------------------------
def _has_credit(run: Run, queue: str) -> list[dict[str, Any]]:
    return [
        s
        for s in run.selectors(queue)
        if codec.uses_credit(s) and s["credits"] > 0 and s["role"] != "overflow" and run.alive(s)
    ]


def pump(run: Run, queue: str, *, everything: bool) -> None:
    """Route the ready entries of ``queue`` again, oldest first.

    After a payment only credit has changed, so only entries that a selector with credit
    now would take are routed (decided from their headers, without loading bodies; equal
    headers are decided once), and it stops once no selector has credit. After a change of
    selectors (``everything``) every entry is routed again, since it may now match, or
    match nothing.
    """
    after = 0
    while True:
        paid = [] if everything else _has_credit(run, queue)
        if not everything and not paid:
            return
        heads = q.ready_heads(
            run.tx,
            queue,
            after_seq=after,
            limit=HEAD_BATCH,
            waiting_for=None if everything else [int(s["id"]) for s in paid],
        )
        if not heads:
            return
        wanted: dict[tuple[str, bool], bool] = {}
        for seq, headers, ret in heads:
            after = seq
            if not everything:
                key = (headers, bool(ret))
                if key not in wanted:
                    wanted[key] = any(s["role"] == "default" for s in paid) or bool(
                        _matched(run, paid, json.loads(headers), ret)
                    )
                if not wanted[key]:
                    continue
            route(run, seq)
            drain_routes(run)
            if not everything:
                before = [s["id"] for s in paid]
                paid = _has_credit(run, queue)
                if not paid:
                    return
                if [s["id"] for s in paid] != before:
                    wanted.clear()


def drain_routes(run: Run) -> None:
    while any(w[0] == "route" for w in run.work):
        todo = [w for w in run.work if w[0] == "route"]
        run.work = deque(w for w in run.work if w[0] != "route")
        for _, seq in todo:
            route(run, seq)


def drain(run: Run) -> None:
    """Do all routing work this transaction made necessary."""
    while run.work:
        drain_routes(run)
        if not run.work:
            break
        kind, queue = run.work.popleft()
        # collapse repeated pumps of one queue
        everything = kind == "pump-all" or ("pump-all", queue) in run.work
        run.work = deque(w for w in run.work if w[1] != queue or w[0] == "route")
        if run.queue(queue) is not None:
            pump(run, queue, everything=everything)
