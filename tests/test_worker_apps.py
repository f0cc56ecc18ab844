"""Handlers run by real ``homing worker`` processes in the worker tests (loaded by file path).

The ``effect`` handler is the checker's handler (TESTING.md): it inserts one row into
``effects`` (no unique constraint, so a duplicate stays countable) through the job's own
transaction, so the row commits exactly when the job is marked done.
"""

from __future__ import annotations

import os
import time
from typing import Any

from homing.worker import App, JobContext, RetryPolicy

app = App(lock_for=2.0)

EFFECTS_DDL = "CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER)"
MANY = RetryPolicy(max_attempts=1000, base=0.01, max_delay=0.1)


def insert_effect(ctx: JobContext, job_id: str) -> None:
    mark = "%s" if ctx.dialect == "postgres" else "?"
    ctx.connection.execute(
        f"INSERT INTO effects (job_id, attempt, pid) VALUES ({mark}, {mark}, {mark})",
        (job_id, ctx.attempt, os.getpid()),
    )


@app.job("effect", retry=MANY)
def effect(job: Any, ctx: JobContext) -> None:
    insert_effect(ctx, job.id)


@app.job("noop")
def noop(job: Any, ctx: JobContext) -> None:
    return None


@app.job("fired", retry=MANY)
def fired(job: Any, ctx: JobContext) -> None:
    """Seed 002's fan-out: replace the event by ``n`` jobs, each writing one effect."""
    ctx.replace([("effect", {"parent": job.id, "k": k}) for k in range(job.args["n"])])


@app.job("sleep", retry=MANY)
def sleep(job: Any, ctx: JobContext) -> None:
    """Sleep (outside any transaction), then write one effect."""
    time.sleep(job.args["s"])
    insert_effect(ctx, job.id)


@app.job("sleep_first", retry=MANY)
def sleep_first(job: Any, ctx: JobContext) -> None:
    """Sleep on the first attempt only (a process to kill while it holds the job), then
    write one effect."""
    if ctx.attempt == 1:
        time.sleep(job.args["s"])
    insert_effect(ctx, job.id)


def test_app_registers_the_checker_handlers() -> None:
    assert app.types == ["effect", "fired", "noop", "sleep", "sleep_first"]
    assert app.handler("effect").retry.max_attempts == 1000
