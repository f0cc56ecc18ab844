"""The worker's side of the job features, in process on both backends: a running
handler sees ``ctx.cancelled`` (an async one is cancelled), a paused type waits while a
worker runs and goes on at resume, lease extensions stop at the timeout, and
``@app.periodic`` runs through the worker and shows in ``homing schedules``."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from click.testing import CliRunner

import homing
from homing.cli import cli


def _wait(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_a_running_handler_sees_cancel_and_an_async_one_is_cancelled(store_url: str) -> None:
    db = homing.connect(store_url)
    app = homing.App(db, lock_for=30)
    started, saw = threading.Event(), threading.Event()
    async_started, async_cancelled = threading.Event(), threading.Event()

    @app.job("sync")
    def sync(job, ctx):
        started.set()
        while not ctx.cancelled:
            time.sleep(0.01)
        saw.set()

    @app.job("async")
    async def run_async(job, ctx):
        async_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            async_cancelled.set()
            raise

    a, b = db.insert("sync", {}), db.insert("async", {})
    worker = app.worker(concurrency=2).start()
    try:
        assert started.wait(30) and async_started.wait(30)
        assert db.cancel(a) == "running" and db.cancel(b) == "running"
        assert saw.wait(30) and async_cancelled.wait(30)
        _wait(lambda: worker.stats.cancelled == 2)
    finally:
        worker.stop(grace=5)
    assert db.details(a).state == db.details(b).state == "cancelled"
    assert worker.stats.done == 0 and worker.stats.lease_lost == 0
    db.close()


def test_a_paused_type_waits_while_the_worker_runs(store_url: str) -> None:
    db = homing.connect(store_url)
    app = homing.App(db, lock_for=30)
    done: list[str] = []

    @app.job("p")
    def p(job, ctx):
        done.append(job.handle)

    @app.job("q")
    def q(job, ctx):
        done.append(job.handle)

    db.pause("p")
    worker = app.worker(concurrency=2).start()
    try:
        held, free = db.insert("p", {}), db.insert("q", {})
        _wait(lambda: free in done)
        time.sleep(1.5)  # every worker honours a pause within a second
        assert held not in done and db.details(held).state == "ready"
        db.resume("p")
        _wait(lambda: held in done)
    finally:
        worker.stop(grace=5)
    db.close()


def test_lease_extensions_stop_at_the_timeout(store_url: str) -> None:
    db = homing.connect(store_url)
    app = homing.App(db, lock_for=0.6)
    samples: list[tuple[float, float]] = []

    @app.job("t", timeout=1.5, retry=homing.RetryPolicy(max_attempts=1))
    def t(job, ctx):
        while not ctx.timed_out:
            with db.store.transaction(write=False) as tx:
                row = tx.query_one(
                    "SELECT lease_expires_at, state FROM homing_jobs WHERE id = ?", (job.id,)
                )
            if row[1] == "running":
                samples.append((float(row[0]), ctx.deadline))
            time.sleep(0.02)

    handle = db.insert("t", {})
    worker = app.worker(concurrency=1, heartbeat=0.05).start()
    try:
        _wait(lambda: worker.stats.timed_out == 1)
    finally:
        worker.stop(grace=5)
    assert samples and max(lease - deadline for lease, deadline in samples) <= 1e-6
    assert max(lease for lease, _ in samples) > samples[0][0]  # it was extended meanwhile
    d = db.details(handle)
    assert d.state == "failed" and "timeout of 1.5s" in (d.last_error or "")  # max_attempts=1
    db.close()


def test_periodic_jobs_run_through_the_worker_and_show_in_the_cli(store_url: str) -> None:
    db = homing.connect(store_url)
    app = homing.App(db, lock_for=30)
    ticks: list[str] = []

    @app.periodic("* * * * * *", missed="skip")
    def heartbeat(job, ctx):
        ticks.append(job.unique_key or "")

    worker = app.worker(concurrency=1).start()
    try:
        _wait(lambda: len(ticks) >= 2)
    finally:
        worker.stop(grace=5)
    assert all(k.startswith("schedule:heartbeat:") for k in ticks)
    result = CliRunner().invoke(cli, ["--db", store_url, "schedules", "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["name"] == row["type"] == "heartbeat" and row["missed"] == "skip"
    assert row["next_tick"] > row["last_tick"] >= int(ticks[-1].rsplit(":", 1)[1])
    db.close()


def test_the_cli_cancels_pauses_and_limits(store_url: str) -> None:
    db = homing.connect(store_url)
    handle = db.insert("c", {})
    run = CliRunner()

    def homing_(*args: str) -> str:
        result = run.invoke(cli, ["--db", store_url, *args])
        assert result.exit_code == 0, result.output
        return result.output

    assert "was ready" in homing_("cancel", handle)
    assert "paused" in homing_("pause", "c")
    out = homing_("limit", "c", "--max-running", "3", "--rate", "10/60", "--per-key", "user_id:2")
    assert "max_running=3 rate=10/60s per_key=user_id:2" in out
    controls = json.loads(homing_("controls", "--json"))
    assert controls[0]["paused"] and controls[0]["max_running"] == 3
    stats = json.loads(homing_("stats", "--json"))
    assert stats[0]["cancelled"] == 1 and stats[0]["paused"]
    bad = run.invoke(cli, ["--db", store_url, "limit", "c", "--rate", "ten"])
    assert bad.exit_code == 1 and "COUNT/SECONDS" in bad.output
    homing_("resume", "c")
    homing_("limit", "c", "--clear")
    assert json.loads(homing_("controls", "--json")) == []
    db.close()
