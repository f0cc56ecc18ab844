"""Every delivery's effect counted, and the verdict: lost, duplicated, unexpected.

The receivers' records (the SMTP server's receipt log, the webhook receiver's rows and its
network log) are compared with the store's jobs, over every shard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from homing.database import Database, ShardedDatabase
from homing.pipeline import data
from homing.pipeline.data import HOOK_RECEIVED
from homing.pipeline.stages import EVENT, NOTIFICATION, SUBSCRIPTION
from homing.store import http_queries as hq
from homing.store import spark_queries as sq


def read_receipts(logs: list[Path], hooks: Database, run: str) -> dict[str, Any]:
    """Every delivery's effect, counted: emails from the SMTP server's receipt log, webhooks
    and IM from the ``WebhookReceived`` rows in the webhook receiver's store; refusals and
    lost answers from both receivers' logs."""
    new: dict[str, int] = {}
    dups = temps = lost_acks = 0
    by_channel: dict[str, int] = {}
    first = last = None
    lines = (ln for p in logs if p.exists() for ln in p.read_text().splitlines())
    for rec in map(json.loads, lines):
        if rec["kind"] == "new":
            new[rec["id"]] = new.get(rec["id"], 0) + 1
            by_channel[rec["ch"]] = by_channel.get(rec["ch"], 0) + 1
            first = rec["t"] if first is None else min(first, rec["t"])
            last = rec["t"] if last is None else max(last, rec["t"])
        elif rec["kind"] == "dup":
            dups += 1
        elif rec["kind"] == "temp":
            temps += 1
        elif rec["kind"] == "ack_lost":
            lost_acks += 1
    with hooks.store.transaction(write=False) as tx:
        per_note = sq.run_arg_counts(tx, run, HOOK_RECEIVED, "notification_id")
        per_channel = sq.run_arg_counts(tx, run, HOOK_RECEIVED, "channel")
    for note_id, n, lo, hi in per_note:
        new[note_id] = new.get(note_id, 0) + n
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    for channel, n, _, _ in per_channel:
        by_channel[channel] = by_channel.get(channel, 0) + n
    return {
        "new": new,
        "duplicates_suppressed": dups,
        "temporary_refusals": temps,
        "acks_lost": lost_acks,
        "by_channel": by_channel,
        "first": first,
        "last": last,
    }


def shards(db: Database | ShardedDatabase) -> list[Database]:
    return list(db.shards) if isinstance(db, ShardedDatabase) else [db]


def _add(total: dict[Any, int], part: dict[Any, int]) -> dict[Any, int]:
    for k, v in part.items():
        total[k] = total.get(k, 0) + v
    return total


def http_state(
    db: Database | ShardedDatabase, hooks: Database
) -> tuple[dict[str, int], dict[str, int]]:
    """(sender's outbox over every shard, receiver's inbox) message counts by state."""
    outbox: dict[str, int] = {}
    for shard in shards(db):
        with shard.store.transaction(write=False) as tx:
            _add(outbox, hq.outbox_counts(tx))
    with hooks.store.transaction(write=False) as tx:
        inbox = hq.inbox_counts(tx)
    return outbox, inbox


def job_counts(db: Database | ShardedDatabase, run: str) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for shard in shards(db):
        with shard.store.transaction(write=False) as tx:
            _add(out, sq.run_counts(tx, run))
    return out


PIPELINE_TYPES = (EVENT, SUBSCRIPTION, NOTIFICATION)


def leftover_runs(db: Database | ShardedDatabase) -> dict[str, int]:
    """Runs with ready or running pipeline jobs in the store, and how many of them: a run
    still going, or one stopped before it finished. A new run's workers would take those
    jobs and deliver them to the new run's receivers, so both runs' checks would fail."""
    out: dict[str, int] = {}
    for shard in shards(db):
        with shard.store.transaction(write=False) as tx:
            for run, n in sq.unfinished_by_run(tx, PIPELINE_TYPES).items():
                out[run] = out.get(run, 0) + n
    return out


def discard_leftovers(db: Database | ShardedDatabase, runs: list[str]) -> int:
    """Cancel the ready and running pipeline jobs of ``runs`` (one transaction per shard);
    returns how many. Only for runs that no longer run: a live run's check then fails."""
    cancelled = 0
    for shard in shards(db):
        with shard.transaction() as tx:
            for run in runs:
                for job_type in PIPELINE_TYPES:
                    for job_id, state, _ in sq.run_jobs(tx.tx, run, job_type):
                        if state in ("ready", "running"):
                            tx.cancel(job_id, f"discarded: pipeline run {run} left it unfinished")
                            cancelled += 1
    return cancelled


def finished_counts(db: Database | ShardedDatabase) -> dict[tuple[str, str], int]:
    """The pipeline's jobs done and failed, by (type, state), over every shard."""
    out: dict[tuple[str, str], int] = {}
    for shard in shards(db):
        with shard.store.transaction(write=False) as tx:
            _add(out, sq.finished_counts(tx, PIPELINE_TYPES))
    return out


def delivery_figures(rec: dict[str, Any], work: Path) -> dict[str, Any]:
    """What the receivers saw: effects, refusals, repeats dropped (SMTP log + webhook inbox)."""
    stats_file = work / "webhook-receiver-stats.json"
    inbox_stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    delivery_s = (rec["last"] - rec["first"]) if rec["first"] is not None else 0.0
    return {
        "delivered": len(rec["new"]),
        "by_channel": rec["by_channel"],
        "temporary_refusals": rec["temporary_refusals"],
        "acks_lost": rec["acks_lost"],
        "duplicates_suppressed": rec["duplicates_suppressed"]
        + int(inbox_stats.get("duplicates", 0)),
        "seconds": round(delivery_s, 2),
        "per_s": round(len(rec["new"]) / delivery_s, 1) if delivery_s else None,
    }


def check(
    db: Database | ShardedDatabase,
    hooks: Database,
    run: str,
    expected: data.Expected,
    rec: dict[str, Any],
) -> dict[str, Any]:
    """lost / duplicated / unexpected against the store and the receivers' records."""
    counts = job_counts(db, run)
    with hooks.store.transaction(write=False) as tx:
        inbox = hq.inbox_counts(tx)
    notes: list[tuple[str, str, int]] = []
    for shard in shards(db):
        with shard.store.transaction(write=False) as tx:
            notes += sq.run_jobs(tx, run, NOTIFICATION)
    done = {i for i, s, _ in notes if s == "done"}
    failed = {i for i, s, _ in notes if s == "failed"}
    attempts = sum(a for _, _, a in notes)
    delivered = rec["new"]
    lost = len(done - set(delivered))
    duplicated = sum(1 for n in delivered.values() if n > 1)
    unexpected = len(set(delivered) - done)
    not_terminal = sum(n for (t, s), n in counts.items() if s in ("ready", "running"))
    checks = {
        "events_done": counts.get((EVENT, "done"), 0),
        "subscriptions": sum(n for (t, _), n in counts.items() if t == SUBSCRIPTION),
        "notifications": len(notes),
        "notifications_done": len(done),
        "notifications_perm_failed": len(failed),
        "delivery_attempts": attempts,
        "retries": attempts - len(notes),
        "lost": lost,
        "duplicated": duplicated,
        "unexpected": unexpected,
        "left_unfinished": not_terminal,
        "webhook_inbox_unhandled": inbox.get("received", 0),
        "webhook_inbox_failed": inbox.get("failed", 0),
    }
    checks["ok"] = (
        lost == 0
        and duplicated == 0
        and unexpected == 0
        and not_terminal == 0
        and inbox.get("received", 0) == 0
        and inbox.get("failed", 0) == 0
        and checks["events_done"] == expected.events
        and checks["subscriptions"] == expected.subscriptions
        and len(notes) == expected.notifications
        and len(failed) == expected.bounces
    )
    return checks
