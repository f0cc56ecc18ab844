"""The job features under several real worker processes, on SQLite and PostgreSQL:
a concurrency limit of 3 under 4 processes (checked in the store at every completion),
per-key concurrency, a rate limit, timeouts of sync and async handlers, cancel racing with
completion (exactly one wins), a scheduler killed with SIGKILL at a tick (exactly one
job per tick), and job dependencies (each step once, after its dependencies)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import homing

WORKERS = r"""
import asyncio, json, os, sys, time
import homing
from homing.worker import RetryPolicy

url, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
db = homing.connect(url, migrate=False)
app = homing.App(db, lock_for=float(os.environ.get("LOCK_FOR", "30")))
log = open(out, "a", buffering=1)
field = "json_extract(args, '$.user_id')" if db.dialect == "sqlite" else "args->>'user_id'"


def count(tx, type_, user=None):
    sql = ("SELECT COUNT(*) FROM homing_jobs WHERE type = ? AND state = 'running' "
           "AND lease_expires_at > ?")
    params = [type_, db.clock.now()]
    if user is not None:
        sql += f" AND {field} = ?"
        params.append(user if db.dialect == "sqlite" else str(user))
    return tx.query_one(sql, params)[0]


def running(type_, user=None):
    with db.store.transaction(write=False) as tx:
        return count(tx, type_, user)


def ready(type_):
    with db.store.transaction(write=False) as tx:
        return tx.query_one(
            "SELECT COUNT(*) FROM homing_jobs WHERE type = ? AND state = 'ready'", (type_,))[0]


def wait_for(type_, n):
    # let the limit fill up, so that the test exercises it (not a condition for passing)
    seen, deadline = [running(type_)], time.monotonic() + 10
    while seen[-1] < n and ready(type_) > 0 and time.monotonic() < deadline:
        time.sleep(0.01)
        seen.append(running(type_))
    return max(seen)


def note(**fields):
    log.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")


@app.job("lim")
def lim(job, ctx):
    peak = wait_for("lim", 3)
    # checked in the store at every completion, in the completing transaction
    ctx.on_complete(lambda tx: note(id=job.id, peak=peak, at_completion=count(tx.tx, "lim")))


@app.job("pk")
def pk(job, ctx):
    user = job.args["user_id"]
    mine = running("pk", user)
    # the first three jobs (users 0, 1, 2) are grabbed first and can all run: wait for that
    peak = wait_for("pk", 3) if job.args["i"] < 3 else running("pk")
    ctx.on_complete(lambda tx: note(id=job.id, user=user, mine=mine, peak=peak,
                                    at_completion=count(tx.tx, "pk", user)))


@app.job("rt")
def rt(job, ctx):
    note(id=job.id, grabbed_at=job.lease_expires_at - app.lock_for)


FAST = RetryPolicy(max_attempts=5, base=0.05, jitter=0.0)


@app.job("tsync", timeout=0.5, retry=FAST)
def tsync(job, ctx):
    start = time.monotonic()
    if job.attempts == 1:
        while not ctx.timed_out and time.monotonic() - start < 10:
            time.sleep(0.01)
        note(id=job.id, timed_out=ctx.timed_out)
        time.sleep(0.2)  # runs on past the timeout, then tries to commit its effect
    ctx.connection.execute(
        "INSERT INTO effects (job_id, attempt) VALUES (%s, %s)".replace(
            "%s", "?" if db.dialect == "sqlite" else "%s"), (job.id, job.attempts))


@app.job("tasync", timeout=0.5, retry=FAST)
async def tasync(job, ctx):
    if job.attempts == 1:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            note(id=job.id, cancelled_at_attempt=job.attempts)
            raise
    conn = await ctx.aconnection()
    conn.execute("INSERT INTO effects (job_id, attempt) VALUES (%s, %s)".replace(
        "%s", "?" if db.dialect == "sqlite" else "%s"), (job.id, job.attempts))


@app.job("step")
def step(job, ctx):
    if job.args.get("fail"):
        raise homing.PermanentFailure("this step fails")
    start = job.lease_expires_at - app.lock_for  # the grab's time
    time.sleep(0.05)
    ctx.on_complete(lambda tx: note(id=job.id, started=start, done_at=db.clock.now()))


app.run(concurrency=int(os.environ.get("CONCURRENCY", "3")), types=mode.split(","),
        prefetch=0, idle_wait=0.2, min_poll=0.01, max_poll=0.05)
"""


def _start(tmp_path: Path, url: str, types: str, n: int, **env: str) -> list[subprocess.Popen]:
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    return [
        subprocess.Popen(
            [sys.executable, str(script), url, str(tmp_path / f"out-{i}.jsonl"), types],
            env={**os.environ, **env},
        )
        for i in range(n)
    ]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _drain(db: homing.Database, types: list[str], total: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {r["type"]: r for r in db.stats()}
        if sum(rows[t]["done"] for t in types if t in rows) >= total:
            return
        time.sleep(0.1)
    raise AssertionError(f"not drained in {timeout}s: {db.stats()}")


def _notes(tmp_path: Path) -> list[dict]:
    out = []
    for f in sorted(tmp_path.glob("out-*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line]
    return out


def test_a_limit_of_3_holds_under_4_worker_processes(store_url: str, tmp_path: Path) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    db.limit("lim", max_running=3)
    handles = db.insert_many([("lim", {"i": i}) for i in range(30)])
    procs = _start(tmp_path, store_url, "lim", 4, CONCURRENCY="1")  # 4 slots for 3
    try:
        _drain(db, ["lim"], 30)
    finally:
        _stop(procs)
    notes = _notes(tmp_path)
    assert sorted(n["id"] for n in notes) == sorted(handles)  # each once
    assert max(n["at_completion"] for n in notes) <= 3
    assert max(n["peak"] for n in notes) == 3  # the limit was reached, never passed
    assert len({n["pid"] for n in notes}) >= 3  # one job per process: 3 at once
    assert all(db.details(h).state == "done" for h in handles)
    db.close()


def test_per_key_concurrency_under_4_worker_processes(store_url: str, tmp_path: Path) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    db.limit("pk", per_key="user_id")
    handles = db.insert_many([("pk", {"user_id": i % 3, "i": i}) for i in range(24)])
    procs = _start(tmp_path, store_url, "pk", 4, CONCURRENCY="1")
    try:
        _drain(db, ["pk"], 24)
    finally:
        _stop(procs)
    notes = _notes(tmp_path)
    assert sorted(n["id"] for n in notes) == sorted(handles)
    assert {n["mine"] for n in notes} == {1}  # only itself ran for its user at its start
    assert {n["at_completion"] for n in notes} == {0}  # nobody else at its completion
    assert max(n["peak"] for n in notes) == 3  # three users ran at once
    db.close()


def test_a_rate_limit_holds_under_4_worker_processes(store_url: str, tmp_path: Path) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    db.limit("rt", rate=(4, 1.0))
    handles = db.insert_many([("rt", {"i": i}) for i in range(12)])
    procs = _start(tmp_path, store_url, "rt", 4)
    try:
        _drain(db, ["rt"], 12)
    finally:
        _stop(procs)
    notes = _notes(tmp_path)
    assert sorted(n["id"] for n in notes) == sorted(handles)
    grabs = sorted(n["grabbed_at"] for n in notes)
    for t in grabs:  # every sliding window (t - 1 s, t] holds at most 4 grabs
        assert sum(1 for u in grabs if t - 1.0 < u <= t) <= 4
    assert grabs[-1] - grabs[0] > 2.0 - 1e-6  # 12 grabs at 4 per second
    db.close()


def _effects(db: homing.Database) -> list[tuple[str, int]]:
    with db.store.transaction(write=False) as tx:
        return [(str(a), int(b)) for a, b in tx.query("SELECT job_id, attempt FROM effects")]


def test_timeouts_of_sync_and_async_handlers_under_2_processes(
    store_url: str, tmp_path: Path
) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL)")
    sync = db.insert_many([("tsync", {"i": i}) for i in range(4)])
    asyn = db.insert_many([("tasync", {"i": i}) for i in range(4)])
    procs = _start(tmp_path, store_url, "tsync,tasync", 2, CONCURRENCY="4")
    try:
        _drain(db, ["tsync", "tasync"], 8, timeout=60)
    finally:
        _stop(procs)
    # one effect per job, from its second attempt: the first attempt's late commit of a
    # sync handler was refused (rolled back), the async one was cancelled
    assert sorted(_effects(db)) == sorted((h, 2) for h in sync + asyn)
    for h in sync + asyn:
        d = db.details(h)
        assert d.state == "done" and d.attempts == 2
        assert [f.kind for f in d.failures] == ["temp_fail"]
        assert "timeout of 0.5s" in d.failures[0].message
    notes = _notes(tmp_path)
    assert sorted(n["id"] for n in notes if "cancelled_at_attempt" in n) == sorted(asyn)
    assert sorted(n["id"] for n in notes if n.get("timed_out")) == sorted(sync)
    db.close()


CANCELLER = r"""
import json, random, sys, time
import homing
url, out, handles = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
db = homing.connect(url, migrate=False)
random.Random(7).shuffle(handles)
while sum(r["done"] for r in db.stats()) < 20:  # the completers are under way
    time.sleep(0.005)
with open(out, "w") as f:
    for h in handles:
        try:
            f.write(json.dumps({"id": h, "cancel": db.cancel(h)}) + "\n")
        except homing.InvalidState as exc:
            f.write(json.dumps({"id": h, "cancel_refused": type(exc).__name__}) + "\n")
"""

COMPLETER = r"""
import json, sys, time
import homing
url, out = sys.argv[1], sys.argv[2]
db = homing.connect(url, migrate=False)
idle = n = 0
with open(out, "w", buffering=1) as f:
    while idle < 30 and n < 100:  # 3 x 100 < 400: some jobs are left for the canceller
        n += 1
        job = db.grab("race", lock_for=60)
        if job is None:
            idle += 1
            time.sleep(0.01)
            continue
        idle = 0
        try:
            db.complete(job)
            f.write(json.dumps({"id": job.handle, "complete": True}) + "\n")
        except homing.JobCancelled:
            f.write(json.dumps({"id": job.handle, "complete_refused": True}) + "\n")
"""


def test_cancel_racing_with_completion_exactly_one_wins(store_url: str, tmp_path: Path) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    handles = db.insert_many([("race", {"i": i}) for i in range(400)])
    completers = [
        subprocess.Popen(
            [sys.executable, "-c", COMPLETER, store_url, str(tmp_path / f"c-{i}.jsonl")]
        )
        for i in range(3)
    ]
    canceller = subprocess.Popen(
        [sys.executable, "-c", CANCELLER, store_url, str(tmp_path / "x.jsonl"), json.dumps(handles)]
    )
    assert canceller.wait(timeout=120) == 0
    for p in completers:
        assert p.wait(timeout=120) == 0
    lines = []
    for f in tmp_path.glob("*.jsonl"):
        lines += [json.loads(line) for line in f.read_text().splitlines()]
    completed = {n["id"] for n in lines if n.get("complete")}
    refused = {n["id"] for n in lines if n.get("complete_refused")}
    cancelled = {n["id"] for n in lines if n.get("cancel") in ("ready", "running")}
    too_late = {n["id"] for n in lines if "cancel_refused" in n}
    grabbed = completed | refused
    assert completed | cancelled == set(handles)
    assert not completed & cancelled  # exactly one wins each job
    assert too_late == completed and refused <= cancelled
    never_ran = {n["id"] for n in lines if n.get("cancel") == "ready"}
    assert not never_ran & grabbed  # cancelled while ready: nobody ever got it
    states = {h: db.details(h).state for h in handles}
    assert {h for h, s in states.items() if s == "done"} == completed
    assert {h for h, s in states.items() if s == "cancelled"} == cancelled
    assert len(completed) >= 20 and len(cancelled) >= 100  # both sides won some
    db.close()


SCHEDULER = r"""
import sys, threading, time
import homing
from homing.schedules import Schedule
from homing.worker.scheduler import Scheduler
url, until = sys.argv[1], float(sys.argv[2])
db = homing.connect(url, migrate=False)
stop = threading.Event()
threading.Timer(max(0.0, until - time.time()), stop.set).start()
Scheduler(db, [Schedule("tick", "* * * * * *", type="tick", missed="all")]).run(stop)
"""


def test_a_scheduler_killed_at_a_tick_gives_exactly_one_job_per_tick(
    store_url: str, tmp_path: Path
) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)

    def start(crash_at: int | None, run_for: float = 60.0) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("HOMING_FAILPOINTS", None)
        if crash_at is not None:
            env["HOMING_FAILPOINTS"] = f"scheduler.after_insert_before_commit={crash_at}*crash"
        until = str(time.time() + run_for)
        return subprocess.Popen([sys.executable, "-c", SCHEDULER, store_url, until], env=env)

    # A scheduler alone is killed (SIGKILL) between the insert and the commit of its
    # second tick; its restart is killed at its first (the catch-up of the lost tick);
    # then two schedulers run at once and race for every tick.
    crashes = 0
    for crash_at in (2, 1):
        victim = start(crash_at)
        assert victim.wait(timeout=60) == -signal.SIGKILL
        crashes += 1
    pair = [start(None, 3.0), start(None, 3.0)]
    for p in pair:
        assert p.wait(timeout=60) == 0
    with db.store.transaction(write=False) as tx:
        keys = [
            str(r[0]) for r in tx.query("SELECT unique_key FROM homing_jobs WHERE type = 'tick'")
        ]
    ticks = sorted(int(k.rsplit(":", 1)[1]) for k in keys)
    assert crashes == 2
    assert len(ticks) >= 4
    assert ticks == list(range(ticks[0], ticks[-1] + 1))  # every tick once: none lost, none twice
    [row] = db.schedules()
    assert row["last_tick"] == ticks[-1]
    db.close()


def test_dependencies_under_3_worker_processes(store_url: str, tmp_path: Path) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    # 8 diamonds: two roots, a join that waits for both, a last step that waits for the
    # join; and 4 joins after a root that fails (never run: cancelled)
    diamonds = []
    for i in range(8):
        left, right = db.insert("step", {"i": i}), db.insert("step", {"i": i})
        join = db.insert("step", {"i": i}, after=[left, right])
        last = db.insert("step", {"i": i}, after=[join])
        diamonds.append((left, right, join, last))
    doomed = []
    for i in range(4):
        bad = db.insert("step", {"fail": True})
        doomed.append(db.insert("step", {"i": i}, after=[bad, diamonds[i][0]]))
    procs = _start(tmp_path, store_url, "step", 3)
    try:
        _drain(db, ["step"], 8 * 4)
        deadline = time.monotonic() + 30
        while any(db.details(h).state != "cancelled" for h in doomed):
            assert time.monotonic() < deadline, "the doomed jobs were not cancelled"
            time.sleep(0.05)
    finally:
        _stop(procs)
    notes = {n["id"]: n for n in _notes(tmp_path)}
    assert len(notes) == 8 * 4  # every step ran once; the doomed never
    for left, right, join, last in diamonds:
        assert notes[join]["started"] >= max(notes[left]["done_at"], notes[right]["done_at"])
        assert notes[last]["started"] >= notes[join]["done_at"]
    for h in doomed:
        d = db.details(h)
        assert d.attempts == 0 and "perm-failed" in (d.last_error or "")
    db.close()
