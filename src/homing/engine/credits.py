"""Credits: one credit is the trust for one unpaid message (seed 001).

A MOVE or BOUNCE selector spends a credit to give a message to its destination; the
message is then *outstanding* until it is paid for. Payment (an ack, a settled job, the
child entry in the next queue being settled) makes it done and returns the credit, and a
queue that was paid pays its own parent in turn: credits flow up the graph. Taking a
message back (a deleted selector, a lapsed consumer lease) also returns the credit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homing.engine import codec, limits
from homing.engine.run import Run
from homing.store import engine_queries as q


def finish(run: Run, row: Mapping[str, Any], fate: str) -> None:
    """The entry is processed in its queue: into history; pay whoever moved it here."""
    seq = int(row["seq"])
    q.set_done(run.tx, seq, now=run.now)
    run.fate.setdefault(seq, fate)
    limits.trim(run, row["queue"])
    if row["parent_seq"] is not None:
        pay(run, int(row["parent_seq"]))


def pay(run: Run, seq: int) -> None:
    """Payment for an outstanding entry: it is done, its selector gets its credit back,
    and the queue it sits in pays its own parent in turn (credits flow up the graph)."""
    while True:
        row = q.get_entry(run.tx, seq)
        if row is None or row["state"] != "outstanding":
            return
        q.set_done(run.tx, seq, now=run.now)
        sel = run.selector(int(row["selector_id"]))
        if sel is not None and codec.uses_credit(sel):
            run.refund(int(sel["id"]))
            run.work.append(("pump", row["queue"]))
        limits.trim(run, row["queue"])
        if row["parent_seq"] is None:
            return
        seq = int(row["parent_seq"])


def withdraw(run: Run, seq: int) -> None:
    """Take an outstanding entry back from its destination: it is ready again in its queue.

    Children it was moved to are withdrawn recursively (their selectors get their credits
    back); a consumer's lease is cancelled, so a later ack is refused.
    """
    row = q.get_entry(run.tx, seq)
    if row is None or row["state"] != "outstanding":
        return
    for child in q.live_children(run.tx, seq):
        if child["state"] == "outstanding":
            withdraw(run, int(child["seq"]))  # returns the child's selector's credit
        q.delete_entry(run.tx, int(child["seq"]))
    sel = run.selector(int(row["selector_id"]))
    q.set_ready(run.tx, seq)
    run.work.append(("route", seq))
    if sel is not None and codec.uses_credit(sel):
        run.refund(int(sel["id"]))
        run.work.append(("pump", row["queue"]))


def remove_selector(run: Run, sel: Mapping[str, Any]) -> list[int]:
    """Delete a selector; its outstanding messages go back to its queue (returned seqs).

    Messages given to a job type are settled instead: the job table has them durably and
    a job cannot be taken back from a worker. A COPY selector's outstanding copies are
    dropped (the original was never owed to it).
    """
    returned: list[int] = []
    for seq in q.outstanding_of(run.tx, int(sel["id"])):
        if sel["mode"] == "copy":
            q.delete_entry(run.tx, seq)
        elif sel["dest_kind"] == "job":
            pay(run, seq)
        else:
            withdraw(run, seq)
            returned.append(seq)
    q.delete_selector(run.tx, int(sel["id"]))
    run.forget()
    return returned
