"""``homing demo``: a short tour of the job API on the embedded store (what ``make run`` runs)."""

from __future__ import annotations

import json
import os
import tempfile

import click

import homing


def run_demo(url: str) -> dict[str, object]:
    db = homing.connect(url)
    try:
        event = db.insert("FiredEvent", {"event": "post.created", "post": 42}, unique_key="post-42")
        again = db.insert("FiredEvent", {"event": "post.created", "post": 42}, unique_key="post-42")
        assert again == event, "unique_key must deduplicate"
        job = db.grab("FiredEvent", lock_for=30)
        assert job is not None
        subs = db.replace(
            job, [("ProcessSubscription", {"post": 42, "subscriber": s}) for s in range(5)]
        )
        done = 0
        while (sub := db.grab("ProcessSubscription", lock_for=30)) is not None:
            if sub.args["subscriber"] == 3 and sub.attempts == 1:
                db.temp_fail(sub, "mail server said 451, try later", retry_in=0)
                continue
            with db.transaction() as tx:
                tx.insert("ProcessNotification", {"to": sub.args["subscriber"], "via": "email"})
                tx.complete(sub)
            done += 1
        notes = 0
        while (n := db.grab("ProcessNotification", lock_for=30)) is not None:
            db.complete(n)
            notes += 1
        return {
            "event": event,
            "subscriptions": len(subs),
            "processed": done,
            "notifications": notes,
            "retried_job": db.details(subs[3]).as_dict(),
            "stats": db.stats(),
        }
    finally:
        db.close()


@click.command()
@click.option(
    "--db", "url", default=None, help="Store URL; default: a fresh SQLite file in a temp dir."
)
def demo(url: str | None) -> None:
    """Walk a FiredEvent through replace / temp_fail / transactional enqueue."""
    if url is None:
        url = f"sqlite:///{os.path.join(tempfile.mkdtemp(prefix='homing-demo-'), 'demo.db')}"
    result = run_demo(url)
    click.echo(json.dumps(result, indent=2, default=str))
    click.echo(
        f"\nOK: 1 event -> {result['subscriptions']} subscriptions -> {result['notifications']} notifications, each once ({url})"
    )
