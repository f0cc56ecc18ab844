"""A homing worker app: seed 002's event fan-out and SMTP-like email delivery.

Run the demo (SQLite in a temporary directory, drained by an in-process worker):

    python examples/worker_app.py

or run real worker processes against your store:

    homing --db sqlite:///homing.db worker --app examples/worker_app.py:app --concurrency 8
    homing --db sqlite:///homing.db insert FiredEvent '{"event": "new_post", "user": 7}'
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import homing
from homing.worker import App, JobContext, RetryLater

app = App(lock_for=30)

SETUP = "CREATE TABLE IF NOT EXISTS outbox_log (job_id TEXT NOT NULL, rcpt TEXT NOT NULL)"


# Your own SQL, in the placeholder style of the driver behind ctx.connection.
LOG_DELIVERY = {
    "sqlite": "INSERT INTO outbox_log (job_id, rcpt) VALUES (?, ?)",
    "postgres": "INSERT INTO outbox_log (job_id, rcpt) VALUES (%s, %s)",
}


@app.job("FiredEvent")
def fired_event(job: homing.Job, ctx: JobContext) -> None:
    """Look up the listeners of an event and replace it by one job per subscription."""
    listeners = [f"user{n}@example.com" for n in range(job.args["user"] % 5 + 1)]
    ctx.replace([("ProcessSubscription", {"rcpt": rcpt, **job.args}) for rcpt in listeners])


@app.job("ProcessSubscription")
def process_subscription(job: homing.Job, ctx: JobContext) -> None:
    """Turn a subscription into the notifications to send (here: one email)."""
    ctx.replace([("send_email", {"rcpt": job.args["rcpt"], "event": job.args["event"]})])


@app.job("send_email", retry="smtp")
def send_email(job: homing.Job, ctx: JobContext) -> None:
    """Deliver to the final SMTP server: 5xx ends the job, 4xx retries less and less.

    The SMTP conversation happens first, outside any transaction (at-least-once: the
    message id is the idempotency key to give the server). Then the delivery is logged
    through ctx.connection, which commits exactly once together with the completion.
    """
    rcpt = job.args["rcpt"]
    if rcpt.startswith("nobody"):
        raise homing.PermanentFailure(f"550 5.1.1 <{rcpt}>: user unknown")
    if rcpt.startswith("greylisted") and ctx.attempt == 1:
        raise RetryLater("451 4.7.1 greylisted, try again later", delay=0.2)
    # smtp.sendmail(..., headers={"Message-ID": f"<{job.id}@homing>"}) would go here
    ctx.connection.execute(LOG_DELIVERY[ctx.dialect], (job.id, rcpt))


def main(url: str | None = None) -> dict[str, Any]:
    """Insert a few events and emails, drain them with a worker, return what happened."""
    tmp = None
    if url is None:
        tmp = tempfile.TemporaryDirectory()
        url = f"sqlite:///{Path(tmp.name) / 'example.db'}"
    db = homing.connect(url)
    try:
        with db.transaction() as tx:
            tx.connection.execute(SETUP)
        db.insert_many(
            [
                ("FiredEvent", {"event": "new_post", "user": 3}),
                ("send_email", {"rcpt": "nobody@example.com", "event": "welcome"}),
                ("send_email", {"rcpt": "greylisted@example.com", "event": "welcome"}),
            ]
        )
        app.worker(db=db, concurrency=4, until_idle=True).run()
        time.sleep(0.3)  # the greylisted email is due again after 0.2 s: a second pass
        app.worker(db=db, concurrency=4, until_idle=True).run()
        with db.transaction() as tx:
            sent = [r[0] for r in tx.connection.execute("SELECT rcpt FROM outbox_log")]
        stats = {r["type"]: {k: r[k] for k in ("done", "failed")} for r in db.stats()}
        return {"sent": sorted(sent), "stats": stats}
    finally:
        db.close()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    import json

    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else None), indent=2))
