"""Exceptions: where a message goes when it cannot be processed normally.

Every exception path ends in the same place: the queue's dead-letter queue if it has one,
else the message is discarded (counted in the queue's ``discarded`` and logged). The
paths and their reasons (as in RabbitMQ's ``x-death``):

==============  ==============================================================
``maxlen``      the queue was full (discard, drop-head, or a moved message
                arriving at a full ``reject`` queue)
``rejected``    a consumer nacked it without requeue, or a publisher was
                refused by a full ``reject`` queue (a record; the publisher
                keeps the message)
``unroutable``  selectors, none matching, and no default selector
``delivery_limit``  taken ``max_deliveries`` times without an ack
``expired``     waited longer than the queue's ``message_ttl``
``job_failed``  the job it became failed permanently
``no_queue``    sent to a queue that does not exist (engine queue ``$dead``)
``queue_deleted`` its queue was deleted with ``force``
``bounce_failed`` its return address is not a queue
``hop_limit``   it passed through more than 64 queues
``consumer_absent`` a COPY for a consumer that stayed away past its offer
==============  ==============================================================

Each dead letter carries its death history: one record per (queue, reason) with a count,
newest first, so a message that keeps failing shows how often and where.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from homing.engine import codec, credits, routing
from homing.engine.run import Run
from homing.store import engine_queries as q

MAX_DEATH_RECORDS = 32


def with_death(deaths: str | None, *, queue: str, reason: str, now: float) -> str:
    """The death history ``deaths`` (JSON) with one more death in ``queue`` for ``reason``."""
    records: list[dict[str, Any]] = json.loads(deaths) if deaths else []
    for i, rec in enumerate(records):
        if rec.get("queue") == queue and rec.get("reason") == reason:
            rec["count"] = int(rec.get("count", 0)) + 1
            rec["last"] = now
            records.insert(0, records.pop(i))
            break
    else:
        records.insert(0, {"queue": queue, "reason": reason, "count": 1, "time": now, "last": now})
    return json.dumps(records[:MAX_DEATH_RECORDS], separators=(",", ":"))


def dlq_of(run: Run, queue: str) -> str | None:
    row = run.queue(queue)
    return None if row is None else row["dead_letter"]


def send(
    run: Run, row: Mapping[str, Any], dlq: str, reason: str, detail: str, **envelope: Any
) -> None:
    """A fresh copy of stored entry ``row`` goes to ``dlq`` (owing no payment)."""
    deaths = with_death(row.get("deaths"), queue=row["queue"], reason=reason, now=run.now)
    routing.arrive(
        run,
        codec.from_row(
            row,
            queue=dlq,
            parent=None,
            reason=f"{row['queue']}: {detail}",
            deaths=deaths,
            **envelope,
        ),
        external=False,
    )


def dead_letter(
    run: Run,
    row: Mapping[str, Any],
    dlq: str,
    reason: str,
    detail: str,
    *,
    bounced: bool = False,
) -> None:
    """A ready entry becomes an exception: a copy goes to ``dlq``; this one is done.

    ``bounced``: a bounce failed, so the return address is spent (cleared, so the message
    cannot bounce around the dead-letter queue again)."""
    run.fate.setdefault(int(row["seq"]), "dead-lettered")
    extra: dict[str, Any] = {}
    if bounced:
        extra = {
            "return_address": None,
            "original_address": row["original_address"] or row["address"],
        }
    send(run, row, dlq, reason, detail, **extra)
    credits.finish(run, row, "dead-lettered")


def discard(run: Run, row: Mapping[str, Any], why: str) -> None:
    """Drop a ready entry (counted, logged); pay whoever moved it here."""
    seq = int(row["seq"])
    q.add_discarded(run.tx, row["queue"])
    run.log("queue %s: discarded message %s (seq %s): %s", row["queue"], row["id"], seq, why)
    run.fate.setdefault(seq, "discarded")
    q.delete_entry(run.tx, seq)
    if row["parent_seq"] is not None:
        credits.pay(run, int(row["parent_seq"]))


def fail(run: Run, row: Mapping[str, Any], reason: str, detail: str) -> None:
    """An exception for a stored entry, ready or outstanding: to the queue's dead-letter
    queue, else discarded. An outstanding entry is paid (its selector's credit returns)."""
    dlq = dlq_of(run, row["queue"])
    if row["state"] == "ready":
        if dlq:
            dead_letter(run, row, dlq, reason, detail)
        else:
            discard(run, row, detail)
        return
    if dlq:
        send(run, row, dlq, reason, detail)
    else:
        q.add_discarded(run.tx, row["queue"])
        run.log("queue %s: message %s discarded: %s", row["queue"], row["id"], detail)
    credits.pay(run, int(row["seq"]))


def refuse(
    run: Run, entry: q.NewEntry, queue: Mapping[str, Any] | None, reason: str, detail: str
) -> int | None:
    """A message that never got into its queue: to the queue's dead-letter queue (or, for
    a missing queue, the engine's ``$dead``), else dropped. Whoever moved it is paid at once
    (an exception ends the credit obligation). Returns the dead letter's seq, if stored."""
    name = entry.queue if queue is None else str(queue["name"])
    dlq = codec.DEAD_LETTERS if queue is None else queue["dead_letter"]
    seq: int | None = None
    if dlq and dlq != name:
        deaths = with_death(entry.deaths, queue=name, reason=reason, now=run.now)
        seq = routing.arrive(
            run,
            codec.clone(
                entry,
                queue=dlq,
                reason=f"{name}: {detail}",
                parent=None,
                hops=entry.hops + 1,
                deaths=deaths,
            ),
            external=False,
        )
    else:
        q.add_discarded(run.tx, name)
        run.log("queue %s: discarded message %s: %s", name, entry.id, detail)
    if entry.parent_seq is not None:
        credits.pay(run, entry.parent_seq)
    return seq
