"""The delivery worker: homing workers that deliver ProcessNotification jobs.

Email goes over real SMTP (``smtplib``) with seed 002's policy: a 5xx answer fails the job
permanently, anything else retries less and less (5 minutes doubling up to 4 hours, giving
up at 4.5 days; ``--retry-scale`` shrinks that clock for a demo run); the SMTP server drops
repeats by the job id (``X-Homing-Id``). Webhooks and IM go through ``homing.http``'s
reliable sender: the handler stores the request in the outbox *in the transaction that
completes the job* (a transactional outbox; ``ctx.on_complete`` batches it with other
jobs' completions in one commit), and the dispatcher running in each worker
process delivers it until the receiver's durable inbox acknowledges it (see
docs/pipeline.md and docs/http.md).

Run: ``python -m homing.pipeline.deliver --db URL --smtp-port P --http-port Q``.
"""

from __future__ import annotations

import argparse
import smtplib
import threading
from email.message import EmailMessage
from typing import Any

from homing.database import Database, connect
from homing.errors import ConfigurationError, PermanentFailure
from homing.http import RetryPolicy as HttpRetryPolicy
from homing.http import Sender
from homing.worker import App, RetryPolicy

NOTIFICATION = "ProcessNotification"
DAY = 86400.0


def smtp_policy(scale: float, give_up_after: float | None = None) -> RetryPolicy:
    """Seed 002's SMTP retry schedule, with time multiplied by ``scale`` (1.0 = real).

    It gives up on a message 4.5 days (scaled) after it was queued, like an MTA's queue
    lifetime. ``give_up_after`` overrides that horizon: a demo run that compresses days
    into seconds must not give up on messages that merely waited in its own backlog
    longer than the compressed "4.5 days" (the pipeline passes its run's timeout)."""
    return RetryPolicy(
        max_attempts=None,
        base=300.0 * scale,
        factor=2.0,
        max_delay=4 * 3600.0 * scale,
        jitter=0.1,
        max_age=give_up_after if give_up_after is not None else 4.5 * DAY * scale,
        name="smtp",
    )


SENDER = "notifications@homing.invalid"


def _email_bytes(job_id: str, to: str, args: dict[str, Any]) -> bytes:
    """The message as bytes: a plain template when every field is plain ASCII (building an
    ``EmailMessage`` costs more CPU than the SMTP conversation), else the email package."""
    subject = f"event {args['event_id']}"
    text = f"Event {args['event_id']} for subscriber {args['subscriber_id']}."
    fields = (job_id, to, subject, text)
    if all(f.isascii() and "\r" not in f and "\n" not in f for f in fields):
        return (
            f"From: {SENDER}\r\nTo: {to}\r\nSubject: {subject}\r\n"
            f"Message-ID: <{job_id}@homing>\r\nX-Homing-Id: {job_id}\r\n"
            "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n"
            f"\r\n{text}\r\n"
        ).encode("ascii")
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = SENDER, to, subject
    msg["Message-ID"], msg["X-Homing-Id"] = f"<{job_id}@homing>", job_id
    msg.set_content(text)
    return msg.as_bytes()


class Channels:
    """Per-thread SMTP and HTTP connections, reused between jobs."""

    def __init__(self, smtp_port: int) -> None:
        self.smtp_port = smtp_port
        self.local = threading.local()

    def smtp(self) -> smtplib.SMTP:
        conn: smtplib.SMTP | None = getattr(self.local, "smtp", None)
        if conn is None:
            conn = smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=10)
            self.local.smtp = conn
        return conn

    def drop_smtp(self) -> None:
        conn = getattr(self.local, "smtp", None)
        self.local.smtp = None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def send_email(self, job_id: str, args: dict[str, Any]) -> None:
        to = str(args["email"])
        data = _email_bytes(job_id, to, args)
        try:
            refused = self.smtp().sendmail(SENDER, [to], data)
        except smtplib.SMTPRecipientsRefused as exc:
            code, text = next(iter(exc.recipients.values()))
            if 500 <= code < 600:
                raise PermanentFailure(f"SMTP {code} {text.decode(errors='replace')}") from exc
            raise RuntimeError(f"SMTP {code} {text.decode(errors='replace')}") from exc
        except smtplib.SMTPResponseException as exc:
            if exc.smtp_code >= 500:
                self.drop_smtp()
                raise PermanentFailure(f"SMTP {exc.smtp_code} {exc.smtp_error!r}") from exc
            if exc.smtp_code == 451:  # the session is still usable after a 4xx to DATA
                raise RuntimeError(f"SMTP {exc.smtp_code}: temporary, retrying later") from exc
            self.drop_smtp()
            raise
        except (OSError, smtplib.SMTPException):
            self.drop_smtp()
            raise
        if refused:
            raise RuntimeError(f"SMTP refused some recipients: {refused}")


def make_app(
    url: str,
    *,
    smtp_port: int,
    http_port: int,
    lock_for: float,
    retry_scale: float,
    give_up_after: float | None = None,
) -> tuple[App, Sender]:
    """The delivery app and its reliable HTTP sender (close it after ``app.run``)."""
    db = connect(url)
    if not isinstance(db, Database):
        raise ConfigurationError("the delivery workers run on one store, not a sharded one")
    app = App(db, lock_for=lock_for, name="pipeline")
    channels = Channels(smtp_port)
    hooks = f"http://127.0.0.1:{http_port}/hook/"
    # The dispatcher (a thread of this process) drains the outbox; the other worker
    # processes run theirs on the same outbox, and a killed one's claims are released.
    sender = Sender(
        db,
        retry=HttpRetryPolicy(initial=0.2, maximum=5.0),
        request_timeout=10.0,
        # Both hooks share one origin (the local receiver): with more requests in flight,
        # each group commit of acknowledgements (and each of the receiver's) covers more
        # messages, so fewer fsyncs a delivery (16 -> 64: 1.29x deliveries/s with the
        # receiver change below, bench/results/make-run-ab-pipeline-config-2026-11-27.log).
        per_destination=64,
        max_in_flight=128,
        # The receiver is homing's: the due webhooks and IMs go many a request, so the
        # client's and the receiver's cost per request is shared (batch_wire).
        batch=64,
    )

    @app.job(NOTIFICATION, retry=smtp_policy(retry_scale, give_up_after))
    def deliver(job: Any, ctx: Any) -> None:
        args = job.args
        if args["channel"] == "email":
            channels.send_email(job.id, args)
        else:
            url, body = hooks + args["channel"], {**args, "notification_id": job.id}
            ctx.on_complete(lambda tx: sender.enqueue("send", url, body, tx=tx))

    return app, sender


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--smtp-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lock-for", type=float, default=5.0)
    parser.add_argument(
        "--name",
        default="deliver",
        help="the worker's name, one per process: a restart under the same name takes back "
        "the jobs the dead process left leased",
    )
    parser.add_argument("--retry-scale", type=float, default=1 / 600)
    parser.add_argument(
        "--give-up-after", type=float, help="seconds after queueing (default: 4.5 days, scaled)"
    )
    a = parser.parse_args()
    app, sender = make_app(
        a.db,
        smtp_port=a.smtp_port,
        http_port=a.http_port,
        lock_for=a.lock_for,
        retry_scale=a.retry_scale,
        give_up_after=a.give_up_after,
    )
    try:
        app.run(concurrency=a.concurrency, name=a.name)
    finally:
        sender.close()  # in-flight requests end; their claims are released at next start


if __name__ == "__main__":
    main()
