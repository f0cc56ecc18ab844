"""Limits: what bounds a queue, a message and a consumer, and what happens at the bound.

- ``max_unprocessed`` with ``on_overflow``: ``discard`` (default; the new message is an
  exception: dead-lettered with reason ``maxlen`` if the queue has a dead-letter queue,
  else dropped), ``reject`` (a publisher gets ``QueueFull``; a message moved here is an
  exception), ``drop-head`` (the oldest waiting message is the exception, the new one is
  accepted) or ``overflow`` (the overflow selector takes it).
- ``max_history``: processed messages kept; the oldest are dropped.
- ``max_deliveries``: a message taken that many times without an ack is an exception
  (``delivery_limit``) instead of going back to the queue.
- ``message_ttl``: a message unprocessed for that long is an exception (``expired``).
- ``expires``: a queue without selectors and unused for that long deletes itself.
- consumer leases: a message given to a consumer and not taken within
  ``consumer_timeout``, or taken and not acked within its lease, goes back to its queue
  (its credit too), where any live consumer can get it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homing.engine import codec, credits, dead_letters, graph, routing
from homing.engine.model import QueueFull
from homing.engine.run import Run
from homing.store import engine_queries as q

OVERFLOW_ACTIONS = ("reject", "discard", "overflow", "drop-head")
SWEEP_BATCH = 200


def trim(run: Run, queue: str) -> None:
    """Keep at most ``max_history`` processed entries of ``queue``."""
    row = run.queue(queue)
    keep = row["max_history"] if row is not None else None
    if keep is not None:
        q.trim_history(run.tx, queue, int(keep))


def is_full(run: Run, queue: Mapping[str, Any]) -> bool:
    limit = queue["max_unprocessed"]
    return limit is not None and q.count(run.tx, queue["name"], "ready") >= int(limit)


def overflow(
    run: Run, entry: q.NewEntry, queue: Mapping[str, Any], *, external: bool
) -> tuple[bool, int | None]:
    """A message arrives at a full queue. Returns (True, its seq or None) if it was
    handled here, or (False, None) if it should be stored after all (drop-head made room)."""
    name, limit, action = queue["name"], queue["max_unprocessed"], queue["on_overflow"]
    detail = f"the queue is full ({limit} unprocessed)"
    if action == "reject" and external:
        raise QueueFull(
            f"queue {name!r} is full ({limit} unprocessed messages) and rejects new ones; "
            "retry later, or raise its max_unprocessed"
        )
    if action == "drop-head":
        head = q.oldest_ready(run.tx, name)
        if head is not None:
            dead_letters.fail(run, head, "maxlen", f"dropped from the head: {detail}")
            return False, None
        # nothing waits (a limit of 0): the new message is the head, and goes
    if action == "overflow":
        over = [s for s in run.selectors(name) if s["role"] == "overflow"]
        if over and (not codec.uses_credit(over[0]) or over[0]["credits"] > 0):
            seq = q.insert_entry(run.tx, entry)
            row = q.entry_row(seq, entry)
            run.fate.setdefault(seq, "overflowed")
            if over[0]["mode"] == "copy":
                routing.copy(run, over[0], row)
                credits.finish(run, row, "overflowed")
            else:
                routing.dispatch(run, over[0], row)
            return True, seq
        detail += " and its overflow selector is missing or has no credit"
    return True, dead_letters.refuse(run, entry, queue, "maxlen", detail)


def lease_lapsed(run: Run, row: Mapping[str, Any]) -> None:
    """A consumer's lease (or offer) ran out: back to the queue, unless the delivery limit
    is reached (an exception). A COPY's entry is owed to no one else: it is offered to its
    consumer again, or, if that consumer is absent, it is an exception
    (``consumer_absent``), so copies for a vanished consumer do not pile up."""
    queue = run.queue(row["queue"])
    limit = None if queue is None else queue["max_deliveries"]
    if limit is not None and int(row["attempts"]) >= int(limit):
        dead_letters.fail(
            run, row, "delivery_limit", f"delivered {row['attempts']} times without an ack"
        )
        return
    sel = run.selector(int(row["selector_id"])) if row["selector_id"] is not None else None
    if sel is None or not codec.uses_credit(sel):
        if sel is not None and not run.alive(sel):
            dead_letters.fail(
                run, row, "consumer_absent", f"consumer {row['consumer']} did not come back"
            )
        else:  # a COPY is owed to no one else: offered to its consumer again
            q.offer_again(run.tx, int(row["seq"]), until=run.now + run.engine.consumer_timeout)
        return
    credits.withdraw(run, int(row["seq"]))


def over_delivery_limit(run: Run, row: Mapping[str, Any]) -> bool:
    queue = run.queue(row["queue"])
    limit = None if queue is None else queue["max_deliveries"]
    return limit is not None and int(row["attempts"]) >= int(limit)


def sweep(run: Run) -> int:
    """Apply the limits that time triggers: lapsed consumer leases, expired messages,
    unused queues. Returns how many messages and queues were handled."""
    n = 0
    for row in q.lapsed_leases(run.tx, run.now, SWEEP_BATCH):
        fresh = q.get_entry(run.tx, int(row["seq"]))  # an earlier one may have settled it
        if fresh is not None and fresh["state"] == "outstanding" and fresh["lease_until"]:
            if float(fresh["lease_until"]) <= run.now:
                lease_lapsed(run, fresh)
                n += 1
    for row in q.due_to_expire(run.tx, run.now, SWEEP_BATCH):
        fresh = q.get_entry(run.tx, int(row["seq"]))
        if fresh is not None and fresh["state"] == "ready":
            dead_letters.fail(run, fresh, "expired", "its time to live ran out")
            n += 1
    for name in q.unused_queues(run.tx, run.now):
        if run.queue(name) is not None and not q.dead_letter_users(run.tx, name):
            graph.destroy_queue(run, name, why="it expired unused")
            n += 1
    return n
