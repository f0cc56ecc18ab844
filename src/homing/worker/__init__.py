"""Workers for homing's jobs (seed 002): handlers by type, leases kept alive, retries.

    app = homing.worker.App("sqlite:///homing.db")

    @app.job("send_email", retry="smtp")
    def send_email(job, ctx):
        ...                                 # slow work first (no transaction open yet)
        ctx.connection.execute(...)         # then writes that commit with the completion

Run it with ``homing worker --app module:app --concurrency 8``.
"""

from homing.worker.app import App
from homing.worker.context import JobContext, LeaseLost
from homing.worker.handler import Handler, RetryLater
from homing.worker.retry import DEFAULT, NEVER, SMTP, RetryPolicy
from homing.worker.runtime import Worker, WorkerStats

__all__ = [
    "DEFAULT",
    "NEVER",
    "SMTP",
    "App",
    "Handler",
    "JobContext",
    "LeaseLost",
    "RetryLater",
    "RetryPolicy",
    "Worker",
    "WorkerStats",
]
