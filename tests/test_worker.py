"""The worker runtime in one process, on both backends: handlers, transactions, replace,
retries and their history, heartbeats, fencing. Processes and kill -9: test_worker_chaos.py."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import homing
from homing.worker import App, JobContext, RetryLater, RetryPolicy
from homing.worker.runtime import Worker

EFFECTS_DDL = "CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER)"
FAST = RetryPolicy(max_attempts=3, base=0.01, factor=2, max_delay=0.05, jitter=0)


def setup_effects(db: homing.Database) -> None:
    with db.transaction() as tx:
        tx.connection.execute(EFFECTS_DDL)


def effects(db: homing.Database) -> Counter[str]:
    with db.transaction() as tx:
        rows = tx.connection.execute("SELECT job_id FROM effects").fetchall()
    return Counter(str(r[0]) for r in rows)


def write_effect(ctx: JobContext, job_id: str) -> None:
    mark = "%s" if ctx.dialect == "postgres" else "?"
    ctx.connection.execute(
        f"INSERT INTO effects (job_id, attempt, pid) VALUES ({mark}, {mark}, 0)",
        (job_id, ctx.attempt),
    )


@pytest.fixture
def sdb(open_db: Callable[..., homing.Database]) -> homing.Database:
    """A store on the parametrized backend with the real clock (leases expire for real)."""
    database = open_db()
    setup_effects(database)
    return database


def drain(app: App, db: homing.Database, **options: Any) -> Worker:
    options.setdefault("concurrency", 4)
    worker = app.worker(db=db, until_idle=True, **options)
    worker.run()
    return worker


def run_until(app: App, db: homing.Database, done: Callable[[], bool], **options: Any) -> Worker:
    """Run a worker until ``done()`` (retries scheduled in the future included)."""
    options.setdefault("concurrency", 4)
    worker = app.worker(db=db, min_poll=0.005, max_poll=0.02, **options).start()
    deadline = time.monotonic() + 20
    try:
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop(grace=2)
    return worker


def test_effects_commit_with_the_completion(sdb: homing.Database) -> None:
    app = App(sdb)

    @app.job("effect")
    def effect(job: homing.Job, ctx: JobContext) -> None:
        write_effect(ctx, job.id)

    @app.job("noop")
    def noop(job: homing.Job, ctx: JobContext) -> None:
        pass

    handles = sdb.insert_many([("effect", {"i": i}) for i in range(60)])
    noops = sdb.insert_many([("noop", None) for _ in range(40)])
    worker = drain(app, sdb)
    assert worker.stats.done == 100 and worker.stats.errors == 0
    counts = effects(sdb)
    assert counts == Counter({h: 1 for h in handles})
    assert {sdb.details(h).state for h in handles + noops} == {"done"}
    stats = {r["type"]: r for r in sdb.stats()}
    assert stats["effect"]["done"] == 60 and stats["noop"]["done"] == 40
    assert stats["effect"]["running"] == 0 and stats["effect"]["ready"] == 0


def test_async_handlers_use_the_same_transaction(sdb: homing.Database) -> None:
    app = App(sdb)
    seen_loops: set[int] = set()

    @app.job("aeffect")
    async def aeffect(job: homing.Job, ctx: JobContext) -> None:
        await asyncio.sleep(0.001)
        seen_loops.add(id(asyncio.get_running_loop()))
        conn = await ctx.aconnection()
        mark = "%s" if ctx.dialect == "postgres" else "?"
        conn.execute(f"INSERT INTO effects (job_id, attempt) VALUES ({mark}, 1)", (job.id,))

    refused: list[str] = []

    @app.job("afail", retry=FAST)
    async def afail(job: homing.Job, ctx: JobContext) -> None:
        try:
            ctx.connection  # noqa: B018 - blocking open on the loop: refused
        except homing.InvalidState as exc:
            refused.append(str(exc))
        await ctx.atransaction()
        write_effect(ctx, job.id)  # open now: the plain form works; rolled back below
        raise RuntimeError("async boom")

    handles = sdb.insert_many([("aeffect", i) for i in range(30)])
    bad = sdb.insert("afail")
    run_until(
        app,
        sdb,
        lambda: sdb.details(bad).state == "failed" and len(effects(sdb)) == 30,
        concurrency=8,
    )
    assert effects(sdb) == Counter({h: 1 for h in handles})
    assert len(seen_loops) == 1
    details = sdb.details(bad)
    assert details.state == "failed" and details.attempts == 3
    assert "RuntimeError: async boom" in details.failures[-1].message
    assert len(refused) == 3 and "await ctx.atransaction()" in refused[0]


def test_replace_fans_out_atomically(sdb: homing.Database) -> None:
    app = App(sdb)

    @app.job("fired")
    def fired(job: homing.Job, ctx: JobContext) -> None:
        ctx.replace([("sub", {"k": k}) for k in range(job.args["n"])])

    @app.job("sub")
    def sub(job: homing.Job, ctx: JobContext) -> None:
        write_effect(ctx, job.id)

    parents = [sdb.insert("fired", {"n": n}) for n in (0, 1, 5)]
    drain(app, sdb)
    counts = effects(sdb)
    assert len(counts) == 6 and set(counts.values()) == {1}
    children = [sdb.details(h) for h in counts]
    assert Counter(c.parent for c in children) == {parents[1]: 1, parents[2]: 5}
    assert {sdb.details(p).state for p in parents} == {"done"}


def test_always_failing_job_ends_failed_with_full_history(sdb: homing.Database) -> None:
    app = App(sdb)
    calls: list[int] = []

    @app.job("flaky", retry=FAST)
    def flaky(job: homing.Job, ctx: JobContext) -> None:
        calls.append(job.attempts)
        write_effect(ctx, job.id)  # rolled back with each failure
        raise ValueError(f"boom {job.attempts}")

    handle = sdb.insert("flaky", {"x": 1})
    worker = run_until(app, sdb, lambda: sdb.details(handle).state == "failed", concurrency=1)
    d = sdb.details(handle)
    assert d.state == "failed" and d.attempts == 3 and calls == [1, 2, 3]
    assert [f.kind for f in d.failures] == ["temp_fail", "temp_fail", "perm_fail"]
    assert [f.attempt for f in d.failures] == [1, 2, 3]
    assert "ValueError: boom 1" in d.failures[0].message
    assert "gave up after 3 attempts" in d.failures[2].message
    assert "ValueError: boom 3" in d.failures[2].message
    assert all(f.pid is not None and f.host for f in d.failures)
    assert effects(sdb) == Counter()
    assert worker.stats.retried == 2 and worker.stats.failed == 1


def test_permanent_failure_and_retry_later(sdb: homing.Database) -> None:
    app = App(sdb)

    @app.job("bounce")
    def bounce(job: homing.Job, ctx: JobContext) -> None:
        raise homing.PermanentFailure("550 no such user")

    @app.job("later")
    def later(job: homing.Job, ctx: JobContext) -> None:
        raise RetryLater("421 try again in an hour", delay=3600)

    perm = sdb.insert("bounce")
    wait = sdb.insert("later")
    drain(app, sdb)
    p = sdb.details(perm)
    assert p.state == "failed" and p.attempts == 1
    assert "550 no such user" in p.failures[0].message and p.failures[0].kind == "perm_fail"
    w = sdb.details(wait)
    assert w.state == "ready" and w.attempts == 1 and w.failures[0].kind == "temp_fail"
    assert 3590 < w.run_at - time.time() <= 3600


def test_a_handler_slower_than_the_lease_runs_once(sdb: homing.Database) -> None:
    """Heartbeats extend the lease, so the second worker never gets the job."""
    app = App(sdb, lock_for=1.0)
    runs: list[str] = []

    @app.job("slow")
    def slow(job: homing.Job, ctx: JobContext) -> None:
        runs.append(ctx.worker_id)
        time.sleep(3.0)  # three lock intervals, outside the transaction
        write_effect(ctx, job.id)

    handle = sdb.insert("slow")
    w1 = app.worker(db=sdb, concurrency=2, name="one").start()
    started = time.monotonic()
    while not runs and time.monotonic() - started < 5:
        time.sleep(0.01)
    w2 = app.worker(db=sdb, concurrency=2, name="two", min_poll=0.01, max_poll=0.05).start()
    try:
        while sdb.details(handle).state != "done" and time.monotonic() - started < 10:
            time.sleep(0.05)
        time.sleep(0.3)  # w2 keeps polling: it must not find the job
    finally:
        w1.stop(grace=1)
        w2.stop(grace=1)
    d = sdb.details(handle)
    assert d.state == "done" and d.attempts == 1 and d.failures == []
    assert len(runs) == 1 and runs[0].endswith(":one")
    assert effects(sdb) == Counter({handle: 1})


def test_a_lost_lease_refuses_the_completion(sdb: homing.Database, open_db: Any) -> None:
    """Fencing: without heartbeats the lease runs out, another holder takes the job, and the
    first handler's writes are rolled back when it tries to complete."""
    app = App(sdb, lock_for=0.3)
    release = threading.Event()
    started = threading.Event()

    @app.job("stuck")
    def stuck(job: homing.Job, ctx: JobContext) -> None:
        started.set()
        release.wait(10)
        write_effect(ctx, job.id)

    handle = sdb.insert("stuck")
    worker = app.worker(db=sdb, concurrency=1, heartbeat=0, prefetch=0).start()
    try:
        assert started.wait(5)
        time.sleep(0.45)
        other = open_db()
        job = other.grab("stuck", lock_for=30)
        assert job is not None and job.handle == handle and job.attempts == 2
        with other.transaction() as tx:
            tx.connection.execute(
                "INSERT INTO effects (job_id, attempt) VALUES "
                + ("(%s, 2)" if other.dialect == "postgres" else "(?, 2)"),
                (job.id,),
            )
            tx.complete(job)
        release.set()
        deadline = time.monotonic() + 5
        while worker.stats.lease_lost == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        release.set()
        worker.stop(grace=1)
    assert worker.stats.lease_lost == 1 and worker.stats.done == 0
    assert effects(sdb) == Counter({handle: 1})
    d = sdb.details(handle)
    assert d.state == "done" and [f.kind for f in d.failures] == ["lease_expired"]


def test_heartbeat_notices_a_lost_lease_and_cancels_an_async_handler(
    sdb: homing.Database, open_db: Any
) -> None:
    app = App(sdb, lock_for=0.4)  # the heartbeat extends it every ~0.2 s
    cancelled = threading.Event()
    started = threading.Event()
    tokens: list[str] = []

    @app.job("long")
    async def long(job: homing.Job, ctx: JobContext) -> None:
        tokens.append(job.lease_token)
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    handle = sdb.insert("long")
    worker = app.worker(db=sdb, concurrency=1, heartbeat=0.05, prefetch=0).start()
    try:
        assert started.wait(10)
        # Another holder takes the job over (as after an expiry, but without a race with
        # the heartbeat): the next beat finds the lease gone and cancels the coroutine.
        other = open_db()
        other.release(handle, "taken over by the test", lease_token=tokens[0])
        job = other.grab("long", lock_for=30)
        assert job is not None and job.handle == handle
        assert cancelled.wait(10)
        deadline = time.monotonic() + 10
        while worker.stats.lease_lost == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop(grace=1)
    assert worker.stats.lease_lost == 1
    d = sdb.details(handle)
    assert d.state == "running" and d.attempts == 2  # the new holder has it


def test_stop_releases_unfinished_jobs_after_the_grace_period(sdb: homing.Database) -> None:
    app = App(sdb, lock_for=30)
    started = threading.Event()
    gate = threading.Event()

    @app.job("quick")
    def quick(job: homing.Job, ctx: JobContext) -> None:
        write_effect(ctx, job.id)

    @app.job("endless")
    def endless(job: homing.Job, ctx: JobContext) -> None:
        started.set()
        gate.wait(10)
        write_effect(ctx, job.id)

    stuck = sdb.insert("endless")
    worker = app.worker(db=sdb, concurrency=2).start()
    try:
        assert started.wait(5)
        t0 = time.monotonic()
        worker.stop(grace=0.3)
        assert time.monotonic() - t0 < 3
    finally:
        gate.set()
    d = sdb.details(stuck)
    assert d.state == "ready" and d.holder is None
    assert d.failures[-1].kind == "released" and "grace period" in d.failures[-1].message
    assert worker.stats.released == 1
    time.sleep(0.2)  # the released handler returns now: its completion must be refused
    assert effects(sdb) == Counter()
    assert sdb.details(stuck).state == "ready"


def test_poison_job_that_kills_its_workers_ends_failed(sdb: homing.Database) -> None:
    """Attempts count grabs, so a job whose worker dies every time still ends."""
    app = App(sdb, lock_for=0.05)

    @app.job("poison", retry=RetryPolicy(max_attempts=2, base=0.01))
    def poison(job: homing.Job, ctx: JobContext) -> None:
        raise AssertionError("must not run")

    handle = sdb.insert("poison")
    for _ in range(2):  # two workers "die" holding the job
        assert sdb.grab("poison", lock_for=0.05) is not None
        time.sleep(0.08)
    drain(app, sdb, lock_for=10)
    d = sdb.details(handle)
    assert d.state == "failed" and d.attempts == 3
    assert "over max_attempts=2" in d.failures[-1].message


def test_bad_configuration_is_refused_clearly(sdb: homing.Database) -> None:
    app = App(sdb)

    @app.job("a")
    def a(job: homing.Job, ctx: JobContext) -> None:
        pass

    with pytest.raises(homing.ConfigurationError, match="already has the handler"):
        app.job("a")(a)
    with pytest.raises(homing.ConfigurationError, match="no handler for job type 'b'"):
        app.worker(types=["b"])
    with pytest.raises(homing.InvalidArgument, match="concurrency"):
        app.worker(concurrency=0)
    with pytest.raises(homing.InvalidArgument, match="unknown retry policy"):
        app.job("c", retry="sometimes")
    with pytest.raises(homing.ConfigurationError, match="no handlers"):
        App(sdb).worker()
    storeless = App()
    storeless.job("x")(a)
    with pytest.raises(homing.ConfigurationError, match="no store"):
        storeless.worker()


def test_ctx_transaction_refuses_other_threads(sdb: homing.Database) -> None:
    app = App(sdb)
    errors: list[BaseException] = []

    @app.job("threads", retry=FAST)
    def threads(job: homing.Job, ctx: JobContext) -> None:
        def helper() -> None:
            try:
                ctx.connection  # noqa: B018 - the access is the test
            except homing.InvalidState as exc:
                errors.append(exc)

        t = threading.Thread(target=helper)
        t.start()
        t.join()
        write_effect(ctx, job.id)

    handle = sdb.insert("threads")
    drain(app, sdb)
    assert len(errors) == 1 and "handler's own thread" in str(errors[0])
    assert effects(sdb) == Counter({handle: 1})


@pytest.fixture
def sharded(tmp_path: Any) -> Any:
    """Two PostgreSQL shards (schemas); sharding is PostgreSQL-only by design."""
    conftest = next(
        m
        for m in list(sys.modules.values())
        if str(getattr(m, "__file__", "") or "").endswith(os.path.join("tests", "conftest.py"))
    )
    factory = conftest.StoreFactory("postgres", tmp_path)
    db = homing.connect([factory.url("shard0"), factory.url("shard1")])
    assert isinstance(db, homing.ShardedDatabase)
    for shard in range(2):
        with db.transaction(shard) as tx:
            tx.connection.execute(EFFECTS_DDL)
    yield db
    db.close()
    factory.cleanup()


def test_a_sharded_store_runs_each_job_in_its_shard(sharded: homing.ShardedDatabase) -> None:
    app = App(sharded)

    @app.job("effect")
    def effect(job: homing.Job, ctx: JobContext) -> None:
        write_effect(ctx, job.id)

    @app.job("noop")
    def noop(job: homing.Job, ctx: JobContext) -> None:
        pass

    handles = sharded.insert_many([("effect", i) for i in range(40)])
    noops = sharded.insert_many([("noop", i) for i in range(10)])
    assert {h.split(":")[0] for h in handles} == {"0", "1"}
    worker = app.worker(db=sharded, concurrency=4, until_idle=True)
    worker.run()
    per_shard: Counter[str] = Counter()
    for shard in range(2):
        with sharded.transaction(shard) as tx:
            for (job_id,) in tx.connection.execute("SELECT job_id FROM effects").fetchall():
                per_shard[f"{shard}:{job_id}"] += 1
    assert per_shard == Counter({h: 1 for h in handles})
    assert {sharded.details(h).state for h in handles + noops} == {"done"}


def counting_opened(store: Any) -> Any:
    """Within the block, the names of the store calls that opened a transaction of their
    own (``transaction`` or ``statement``), in order."""
    import contextlib

    @contextlib.contextmanager
    def block() -> Iterator[list[str]]:
        opened: list[str] = []
        real_tx, real_stmt = store.transaction, store.statement

        def counting(real: Any) -> Any:
            def enter(*args: Any, **kw: Any) -> Any:
                if store.in_transaction() is None:
                    opened.append(real.__name__)
                return real(*args, **kw)

            return enter

        store.transaction = counting(real_tx)
        store.statement = counting(real_stmt)
        try:
            yield opened
        finally:
            del store.transaction, store.statement

    return block()


def _three_held_one_stolen(
    sdb: homing.Database, open_db: Any
) -> tuple[Worker, list[homing.Job], list[JobContext], homing.Job]:
    """A worker (not started: its completer is driven by hand) holding three running jobs,
    one of whose expired leases another worker has taken over meanwhile."""
    from homing.worker.context import JobContext as Ctx

    app = App(sdb)

    @app.job("n")
    def n(job: homing.Job, ctx: JobContext) -> None:
        pass

    worker = app.worker(db=sdb)
    sdb.insert_many([("n", i) for i in range(3)])
    jobs = sdb.grab_many("n", lock_for=0.2, limit=3)
    time.sleep(0.3)
    stolen = open_db().grab("n", lock_for=30)  # one expired lease is taken over
    assert stolen is not None
    contexts = [Ctx(worker, j, app.handler("n")) for j in jobs]
    for ctx in contexts:
        ctx.phase = "running"
        worker._held[ctx.job.id] = ctx
    worker._inflight = worker._active = 3
    return worker, jobs, contexts, stolen


def test_a_stale_lease_in_a_batch_of_outcomes_does_not_sink_the_others(
    sdb: homing.Database, open_db: Any
) -> None:
    """The completer writes outcomes in bulk; one refused completion must not undo the rest."""
    from homing.worker.completer import write_outcomes
    from homing.worker.outcome import Outcome

    worker, jobs, contexts, stolen = _three_held_one_stolen(sdb, open_db)
    write_outcomes(worker, [Outcome(ctx, "complete") for ctx in contexts])
    assert worker.stats.done == 2 and worker.stats.lease_lost == 1
    states = {j.handle: sdb.details(j.handle).state for j in jobs}
    assert states.pop(stolen.handle) == "running" and set(states.values()) == {"done"}
    assert worker._inflight == 0 and worker._active == 0 and not worker._held


def _effect_via(tx: homing.Transaction, job_id: str, attempt: int) -> None:
    mark = "%s" if tx.dialect == "postgres" else "?"
    tx.connection.execute(
        f"INSERT INTO effects (job_id, attempt, pid) VALUES ({mark}, {mark}, 1)",
        (job_id, attempt),
    )


def test_on_complete_writes_commit_with_batched_completions(sdb: homing.Database) -> None:
    """ctx.on_complete: the write lands in the completer's batch transaction, once per job;
    a write that raises undoes only its own job's writes (retried by the policy) and the
    rest of the batch still completes."""
    app = App(sdb)
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    @app.job("outbox", retry=FAST)
    def outbox(job: homing.Job, ctx: JobContext) -> None:
        attempt = ctx.attempt

        def write(tx: homing.Transaction) -> None:
            _effect_via(tx, job.id, attempt)
            with lock:
                calls[job.id] += 1
                fail = job.args["i"] % 7 == 0 and calls[job.id] <= 2
            if fail:  # twice: the batch's fallback tries it alone once more
                raise RuntimeError("the outbox insert failed")  # after a write: undone

        ctx.on_complete(write)

    handles = sdb.insert_many([("outbox", {"i": i}) for i in range(50)])
    worker = run_until(
        app, sdb, lambda: all(sdb.details(h).state == "done" for h in handles), concurrency=8
    )
    assert effects(sdb) == Counter({h: 1 for h in handles})  # the failed writes were undone
    attempts = {h: sdb.details(h).attempts for h in handles}
    failing = {h for i, h in enumerate(handles) if i % 7 == 0}
    assert all(attempts[h] >= 2 for h in failing) and worker.stats.retried >= len(failing) == 8
    assert all(attempts[h] == 1 for h in handles if h not in failing)
    sdb.insert("other", None)
    job = sdb.grab("other", lock_for=5)
    assert job is not None
    with pytest.raises(homing.InvalidArgument, match="callable"):
        JobContext(worker, job, app.handler("outbox")).on_complete(3)  # type: ignore[arg-type]


def test_on_complete_writes_are_dropped_with_a_lost_lease(
    sdb: homing.Database, open_db: Any
) -> None:
    """A job whose lease was taken over is not completed, and its on_complete writes are
    not kept either (the fencing covers them)."""
    from homing.worker.completer import write_outcomes
    from homing.worker.outcome import Outcome

    worker, jobs, contexts, stolen = _three_held_one_stolen(sdb, open_db)
    for ctx in contexts:
        ctx.on_complete(lambda tx, job_id=ctx.job.id: _effect_via(tx, job_id, 0))
    write_outcomes(worker, [Outcome(ctx, "complete") for ctx in contexts])
    assert worker.stats.done == 2 and worker.stats.lease_lost == 1
    assert effects(sdb) == Counter({j.id: 1 for j in jobs if j.handle != stolen.handle})


def test_a_mixed_batch_of_outcomes_is_one_commit(sdb: homing.Database, open_db: Any) -> None:
    """Plain completions and completions with on_complete writes in one batch share one
    transaction (one commit, one fsync), and the plain completion of a lost lease is still
    refused alone: reported lost, the others done, only their writes kept."""
    from homing.worker.completer import write_outcomes
    from homing.worker.outcome import Outcome

    worker, jobs, contexts, stolen = _three_held_one_stolen(sdb, open_db)
    plain = next(c for c in contexts if c.job.handle == stolen.handle)
    for ctx in contexts:
        if ctx is not plain:
            ctx.on_complete(lambda tx, job_id=ctx.job.id: _effect_via(tx, job_id, 0))
    with counting_opened(sdb.store) as opened:
        write_outcomes(worker, [Outcome(ctx, "complete") for ctx in contexts])
    assert opened == ["transaction"], opened  # before: a statement, then a transaction
    assert worker.stats.done == 2 and worker.stats.lease_lost == 1
    assert effects(sdb) == Counter({j.id: 1 for j in jobs if j.handle != stolen.handle})
    states = {j.handle: sdb.details(j.handle).state for j in jobs}
    assert states.pop(stolen.handle) == "running" and set(states.values()) == {"done"}


def test_the_worker_runs_gc_on_its_own_schedule(sdb: homing.Database) -> None:
    """A deployment that only runs workers stays bounded: the worker's housekeeper deletes
    finished jobs past their retention (here: everything finished, retention 0)."""
    app = App(sdb)

    @app.job("tidy")
    def tidy(job: homing.Job, ctx: JobContext) -> None:
        pass

    handles = sdb.insert_many([("tidy", i) for i in range(5)])
    original = sdb._ops.retention
    sdb._ops.retention = 0.0
    try:
        worker = app.worker(db=sdb, gc_every=0.2, min_poll=0.005, max_poll=0.02).start()
        deadline = time.monotonic() + 20
        gone = False
        while time.monotonic() < deadline and not gone:
            time.sleep(0.05)
            try:
                for h in handles:
                    sdb.details(h)
            except homing.JobNotFound:
                gone = True
        worker.stop(grace=2)
    finally:
        sdb._ops.retention = original
    assert gone, "finished jobs were never collected by the worker's gc"
    with pytest.raises(homing.InvalidArgument, match="gc_every"):
        app.worker(db=sdb, gc_every=-1)


@pytest.mark.parametrize("backend", ["postgres"])  # the backend with notifications
def test_an_insert_wakes_one_idle_worker_not_all(stores: Any) -> None:
    """Three idle worker processes' worth of stores; each single insert wakes one of them
    (idle workers register in the store, the insert notifies as many as it inserted
    jobs). With a broadcast NOTIFY every insert woke all three, and two of the three grabs
    came back empty, so empty grabs per job were >= 2; here they stay well under."""
    url = stores.url()
    dbs = [homing.connect(url) for _ in range(3)]
    done: list[str] = []
    lock = threading.Lock()
    workers = []
    try:
        for d in dbs:
            app = App(d)

            @app.job("one")
            def one(job: homing.Job, ctx: JobContext) -> None:
                with lock:
                    done.append(job.id)

            workers.append(app.worker(db=d, concurrency=1, prefetch=0, idle_wait=5.0).start())
        time.sleep(0.5)  # all idle and registered
        before = sum(w.stats.empty_grabs for w in workers)
        n = 30
        for i in range(n):
            dbs[0].insert("one", i)
            deadline = time.monotonic() + 10
            while len(done) < i + 1 and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(0.03)  # let the woken worker go idle again
        assert len(done) == n and len(set(done)) == n
        empty = sum(w.stats.empty_grabs for w in workers) - before
        # the worker that ran a job looks once more (empty); idle workers look on their own
        # only from idle_wait / 10 = 0.5 s on; a broadcast adds two empty grabs per job
        assert empty / n < 2.0, f"{empty} empty grabs for {n} jobs"
    finally:
        for w in workers:
            w.stop(grace=1)
        for d in dbs:
            d.close()


def test_short_handlers_are_grabbed_by_the_dozen(sdb: homing.Database) -> None:
    """By default a worker prefetches more when its handlers are short: with a fixed 4 + 4
    a grab takes at most 8 jobs; here the average grab takes far more, and each job still
    runs once."""
    app = App()
    ran: Counter[int] = Counter()

    @app.job("quick")
    def quick(job: Any, ctx: JobContext) -> None:
        ran[job.args["i"]] += 1

    sdb.insert_many([("quick", {"i": i}) for i in range(1500)])
    worker = drain(app, sdb)
    assert worker.stats.grabbed == 1500 and set(ran.values()) == {1} and len(ran) == 1500
    per_grab = worker.stats.grabbed / max(1, worker.stats.grabs - worker.stats.empty_grabs)
    assert per_grab > 12, f"{per_grab:.1f} jobs per grab"


def test_prefetch_grows_only_for_short_handlers_and_a_given_number_is_kept() -> None:
    from types import SimpleNamespace

    from homing.worker.fetcher import MAX_PREFETCH_PER_SLOT, prefetch_for

    def w(mean: float | None, *, adaptive: bool = True, prefetch: int = 4) -> Any:
        return SimpleNamespace(
            adaptive_prefetch=adaptive, prefetch=prefetch, concurrency=4, handler_seconds=mean
        )

    assert prefetch_for(w(None)) == 4  # nothing measured yet
    assert prefetch_for(w(2.0)) == 4  # long handlers: the base
    assert prefetch_for(w(0.001)) == 64  # 20 ms * 4 slots / 1 ms = 80, capped at 16 a slot
    assert prefetch_for(w(0.004)) == 20  # 20 ms * 4 slots / 4 ms
    assert prefetch_for(w(1e-6)) == MAX_PREFETCH_PER_SLOT * 4
    assert prefetch_for(w(1e-6, adaptive=False, prefetch=0)) == 0  # --prefetch 0 is kept
    assert prefetch_for(w(1e-6, adaptive=False, prefetch=7)) == 7


def test_one_slow_handler_shrinks_the_prefetch_at_once() -> None:
    from homing.worker.runtime import handler_average

    mean = None
    for _ in range(50):
        mean = handler_average(mean, 0.0001)  # fast handlers
    assert mean is not None and mean < 0.001
    slow = handler_average(mean, 2.0)  # one 2 s handler
    assert slow > 0.9  # the prefetch falls to its base at once (20 ms * 4 / 1 s < 4)
    back = slow
    for _ in range(5):
        back = handler_average(back, 0.0001)
    assert back > 0.1  # and grows back only slowly


def test_until_idle_stops_as_soon_as_the_last_outcome_is_written(sdb: homing.Database) -> None:
    """A grab made while a job's outcome was still being written proves nothing, so the
    worker looks again; it must not first sleep out its idle wait (PostgreSQL: up to
    ``idle_wait``; the first step is a tenth of it) when the completer can tell it at once."""
    app = App(sdb)
    ran: list[int] = []

    @app.job("slowish")
    def slowish(job: Any, ctx: JobContext) -> None:
        time.sleep(0.2)  # the fetcher's next grab comes while this job is held
        ran.append(job.args["i"])

    sdb.insert("slowish", {"i": 1})
    began = time.monotonic()
    drain(app, sdb, idle_wait=60.0, max_poll=6.0, min_poll=6.0)
    took = time.monotonic() - began
    assert ran == [1]
    assert took < 3.0, f"stopped {took:.1f} s after start: it slept out its idle wait"


def test_a_grab_waiting_for_outcomes_rides_on_their_commit(
    sdb: homing.Database, open_db: Any
) -> None:
    """On a single-writer store (SQLite) the fetcher's grab, made while outcomes wait for
    the completer, goes into the completer's transaction: one write-lock turn and one
    commit for both. The jobs are answered only after that commit; a batch rolled back
    (an on_complete write failed) leaves the grab unanswered, and it is made alone."""
    from homing.worker.completer import serve_alone, write_outcomes
    from homing.worker.joined_grab import GrabRequest
    from homing.worker.outcome import Outcome

    worker, jobs, contexts, stolen = _three_held_one_stolen(sdb, open_db)
    assert worker.joins_grabs is (not sdb.store.capabilities.concurrent_writers)
    worker.wakeup = sdb.idle_wakeup()
    sdb.insert_many([("n", i) for i in range(10, 12)])
    request = GrabRequest(limit=5)
    with counting_opened(sdb.store) as opened:
        write_outcomes(worker, [Outcome(ctx, "complete") for ctx in contexts], request)
    assert opened == ["transaction"], opened  # before: the completions, then a grab
    assert request.done.is_set() and request.error is None
    assert sorted(j.args for j in request.jobs) == [10, 11]
    assert {sdb.details(j.handle).state for j in request.jobs} == {"running"}
    assert worker.stats.done == 2 and worker.stats.lease_lost == 1

    # an on_complete write fails: the batch is rolled back and written job by job; the
    # grab's leases went with the rollback, so it is not answered, and is made alone
    sdb.insert_many([("n", 20)])
    more = sdb.grab_many("n", lock_for=30, limit=1)
    from homing.worker.context import JobContext as Ctx

    ctx = Ctx(worker, more[0], worker.app.handler("n"))
    ctx.phase = "running"
    worker._held[ctx.job.id] = ctx
    worker._inflight += 1
    worker._active += 1
    ctx.on_complete(lambda tx: (_ for _ in ()).throw(RuntimeError("the write fails")))
    for j in request.jobs:
        sdb.release(j)
    request = GrabRequest(limit=5)
    write_outcomes(worker, [Outcome(ctx, "complete")], request)
    assert not request.done.is_set()
    serve_alone(worker, request)
    assert request.done.is_set() and sorted(j.args for j in request.jobs) == [10, 11]
    assert sdb.details(ctx.job.handle).state in ("ready", "failed")  # the job's failure
