"""The job API contract (seed 002), run through the `jobs` fixture on SQLite, PostgreSQL and a
two-shard PostgreSQL store alike (``homing.JobAPI``); tests of what only a single store
offers (its transactions, a global priority order) use the `db` fixture."""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime

import pytest

import homing
from homing import InvalidArgument, InvalidFilter, InvalidState, JobNotFound, JobSpec, StaleLease
from homing.clock import ManualClock
from homing.job_api import JobAPI
from homing.jobs import DEFAULT_RETENTION_S


def test_insert_grab_complete_round_trip(jobs: JobAPI, clock: ManualClock) -> None:
    handle = jobs.insert("email", {"to": "a@example.org"}, priority=3)
    job = jobs.grab("email", lock_for=30)
    assert job is not None
    assert (job.handle, job.type, job.args, job.attempts, job.priority) == (
        handle,
        "email",
        {"to": "a@example.org"},
        1,
        3,
    )
    assert job.lease_expires_at == pytest.approx(clock.now() + 30)
    assert jobs.details(handle).state == "running"
    jobs.complete(job)
    d = jobs.details(handle)
    assert d.state == "done" and d.holder is None and d.finished_at is not None
    assert jobs.grab("email", lock_for=30) is None


def test_grab_only_requested_types_and_lists(jobs: JobAPI) -> None:
    jobs.insert("a", 1)
    jobs.insert("b", 2)
    assert jobs.grab("c", lock_for=5) is None
    got = {jobs.grab(["b", "c"], lock_for=5).args, jobs.grab(("a",), lock_for=5).args}  # type: ignore[union-attr]
    assert got == {1, 2}


def test_priority_then_fifo(db: homing.Database, clock: ManualClock) -> None:
    low = db.insert("t", "low", priority=0)
    clock.advance(1)
    high = db.insert("t", "high", priority=10)
    clock.advance(1)
    low2 = db.insert("t", "low2", priority=0)
    order = [db.grab("t", lock_for=5).handle for _ in range(3)]  # type: ignore[union-attr]
    assert order == [high, low, low2]


def test_run_at_delays_a_job(jobs: JobAPI, clock: ManualClock) -> None:
    jobs.insert("later", None, run_at=clock.now() + 60)
    assert jobs.grab("later", lock_for=5) is None
    clock.advance(61)
    assert jobs.grab("later", lock_for=5) is not None


def test_run_at_accepts_aware_datetimes_only(jobs: JobAPI) -> None:
    jobs.insert("t", None, run_at=datetime.now(UTC))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        jobs.insert("t", None, run_at=datetime.now())


def test_unique_key_returns_first_handle_while_retained(jobs: JobAPI, clock: ManualClock) -> None:
    first = jobs.insert("charge", {"cents": 100}, unique_key="order-1")
    assert jobs.insert("charge", {"cents": 999}, unique_key="order-1") == first
    job = jobs.grab("charge", lock_for=5)
    assert job is not None
    jobs.complete(job)
    # finished but retained: still deduplicated, nothing runs twice
    assert jobs.insert("charge", {"cents": 100}, unique_key="order-1") == first
    assert jobs.grab("charge", lock_for=5) is None
    assert [d.args for d in [jobs.details(first)]] == [{"cents": 100}]
    clock.advance(DEFAULT_RETENTION_S + 1)
    assert jobs.gc() == 1
    with pytest.raises(JobNotFound):
        jobs.details(first)
    # after garbage collection the key is free again
    assert jobs.insert("charge", {"cents": 100}, unique_key="order-1") != first


def test_a_batch_mixing_keyed_and_plain_jobs_dedupes_only_the_keys(jobs: JobAPI) -> None:
    """A batch with a unique key goes in with ON CONFLICT (PostgreSQL); one without goes in
    plainly: both kinds insert every plain job, and a repeated key returns its first job."""
    first = jobs.insert("mix", {"n": 0}, unique_key="mix-key")
    handles = jobs.insert_many(
        [
            JobSpec("mix", {"n": 1}),
            JobSpec("mix", {"n": 2}, unique_key="mix-key"),
            ("mix", {"n": 3}),
        ]
    )
    assert handles[1] == first and len(set(handles)) == 3
    plain = jobs.insert_many([("mix", {"n": 4}), ("mix", {"n": 5})])
    assert len(set(plain)) == 2
    got = sorted(j.args["n"] for j in jobs.grab_many("mix", lock_for=5, limit=10))
    assert got == [0, 1, 3, 4, 5]


def test_unique_key_of_perm_failed_job_and_redrive(jobs: JobAPI) -> None:
    h = jobs.insert("x", None, unique_key="k")
    for _ in range(2):
        job = jobs.grab("x", lock_for=5)
        assert job is not None
        jobs.temp_fail(job, "try again", retry_in=0)
    job = jobs.grab("x", lock_for=5)
    assert job is not None and job.attempts == 3
    jobs.perm_fail(job, "550 no such user")
    assert jobs.insert("x", None, unique_key="k") == h  # a dead job still holds its key
    assert jobs.grab("x", lock_for=5) is None
    jobs.redrive(h)
    d = jobs.details(h)
    assert (d.state, d.attempts) == ("ready", 0)
    assert [f.kind for f in d.failures] == ["temp_fail", "temp_fail", "perm_fail"]
    again = jobs.grab("x", lock_for=5)
    assert again is not None and again.attempts == 1
    with pytest.raises(InvalidState, match="only perm-failed"):
        jobs.redrive(h)


def test_insert_many_in_order_with_duplicates(jobs: JobAPI) -> None:
    handles = jobs.insert_many(
        [("t", 1), homing.JobSpec("t", 2, unique_key="u"), homing.JobSpec("t", 3, unique_key="u")]
    )
    assert len(handles) == 3 and handles[1] == handles[2] and handles[0] != handles[1]
    grabbed = jobs.grab_many("t", lock_for=5, limit=10)
    assert sorted(j.args for j in grabbed) == [1, 2]
    jobs.complete_many(grabbed)
    assert all(jobs.details(h).state == "done" for h in handles)


def test_insert_many_carries_quotes_backslashes_and_unicode_in_names_and_keys(
    jobs: JobAPI,
) -> None:
    """A batch insert travels as one JSON document on PostgreSQL: every string in it must
    arrive as it was sent."""
    odd = 'q"uote\\back\u00e9\u4e2d'
    handles = jobs.insert_many(
        [(odd, {"k": odd}), homing.JobSpec(odd, 2, unique_key=odd), ("plain", [odd])]
    )
    assert len(set(handles)) == 3
    got = jobs.grab_many(odd, lock_for=5, limit=10)
    assert sorted(str(j.args) for j in got) == sorted([str({"k": odd}), "2"])
    assert {j.type for j in got} == {odd}
    assert jobs.insert_many([homing.JobSpec(odd, 3, unique_key=odd)]) == [handles[1]]
    (plain,) = jobs.grab_many("plain", lock_for=5, limit=10)
    assert plain.args == [odd]


def test_grab_many_is_one_lease_and_respects_limit(jobs: JobAPI) -> None:
    jobs.insert_many([("t", i) for i in range(5)])
    batch = jobs.grab_many("t", lock_for=5, limit=3)
    assert len(batch) == 3 and len({j.lease_token for j in batch}) == 1
    assert len(jobs.grab_many("t", lock_for=5, limit=3)) == 2


def test_where_search_operators(jobs: JobAPI) -> None:
    rows = [
        {"user": 1, "region": "eu", "score": 10, "vip": True, "meta": {"tier": "gold"}},
        {"user": 2, "region": "us", "score": 20.5, "vip": False, "meta": {"tier": "free"}},
        {"user": 3, "region": "eu", "score": "high", "vip": None},
        {"user": 4, "region": "apac"},
    ]
    for r in rows:
        jobs.insert("s", r)

    def probe(where: dict) -> set[int]:
        found = set()
        got = jobs.grab_many("s", lock_for=5, limit=10, where=where)
        for j in got:
            found.add(j.args["user"])
            jobs.release(j)
        return found

    assert probe({"region": "eu"}) == {1, 3}
    assert probe({"region": {"$in": ["us", "apac"]}}) == {2, 4}
    assert probe({"score": {"$gte": 10}}) == {1, 2}  # "high" is a string: not compared to numbers
    assert probe({"score": {"$gt": 10, "$lt": 100}}) == {2}
    assert probe({"score": {"$gte": "a"}}) == {3}
    assert probe({"vip": True}) == {1}
    assert probe({"vip": False}) == {2}
    assert probe({"vip": None}) == {3}
    assert probe({"meta.tier": "gold"}) == {1}
    assert probe({"user": 1.0}) == {1}
    assert probe({"region": "eu", "score": 10}) == {1}
    assert probe({"nope": 1}) == set()
    assert probe({"user": 4}) == {4}


@pytest.mark.parametrize(
    "where, message",
    [
        ({"a'; DROP TABLE homing_jobs; --": 1}, "each dot-separated part"),
        ({"a": {"$regex": ".*"}}, "unknown operator"),
        ({"a": {"$in": []}}, "non-empty list"),
        ({"a": {"$in": "abc"}}, "non-empty list"),
        ({"a": [1, 2]}, "cannot be searched"),
        ({"a": {"$lt": True}}, "compares numbers or strings"),
        ({"a": float("nan")}, "finite"),
        ({"a": 2**70}, "64-bit"),
        ({"a": {}}, "empty operator"),
        ({}, "where is empty"),
        ({1: 2}, "must be strings"),
        ({"%": 1}, "each dot-separated part"),
        ("user = 1", "must be a dict"),
    ],
)
def test_malformed_where_is_refused_and_grabs_nothing(
    jobs: JobAPI, where: object, message: str
) -> None:
    h = jobs.insert("s", {"a": 1})
    with pytest.raises(InvalidFilter, match=message):
        jobs.grab("s", lock_for=5, where=where)  # type: ignore[arg-type]
    assert jobs.details(h).state == "ready" and jobs.details(h).attempts == 0


def test_expired_lease_is_regrabbed_and_old_holder_is_fenced(
    jobs: JobAPI, clock: ManualClock
) -> None:
    h = jobs.insert("t", None)
    first = jobs.grab("t", lock_for=10, worker_id="w1")
    assert first is not None
    assert jobs.grab("t", lock_for=10) is None  # held: never two holders at once
    clock.advance(11)
    second = jobs.grab("t", lock_for=10, worker_id="w2")
    assert second is not None and second.attempts == 2
    for call in (
        lambda: jobs.complete(first),
        lambda: jobs.temp_fail(first, "late", retry_in=1),
        lambda: jobs.perm_fail(first, "late"),
        lambda: jobs.extend(first, 10),
        lambda: jobs.replace(first, [("child", None)]),
    ):
        with pytest.raises(StaleLease, match="w2"):
            call()
    d = jobs.details(h)
    assert d.state == "running" and d.holder is not None and d.holder.worker == "w2"
    assert [(f.kind, f.worker) for f in d.failures] == [("lease_expired", "w1")]
    assert jobs.grab("child", lock_for=5) is None  # the refused replace inserted nothing
    jobs.complete(second)
    with pytest.raises(StaleLease, match="now done"):
        jobs.complete(first)
    assert jobs.details(h).state == "done"


def test_expired_but_not_regrabbed_lease_may_still_finish(jobs: JobAPI, clock: ManualClock) -> None:
    jobs.insert("t", None)
    job = jobs.grab("t", lock_for=1)
    assert job is not None
    clock.advance(5)
    jobs.complete(job)  # nobody else took it: the holder's work counts
    jobs.complete(job)  # a retried complete by the same holder is a no-op
    with pytest.raises(InvalidState, match="already done"):
        jobs.perm_fail(job, "x")


def test_extend_keeps_the_job_from_others(jobs: JobAPI, clock: ManualClock) -> None:
    jobs.insert("t", None)
    job = jobs.grab("t", lock_for=10)
    assert job is not None
    for _ in range(5):
        clock.advance(8)
        until = jobs.extend(job, 10)
        assert until == job.lease_expires_at == pytest.approx(clock.now() + 10)
        assert jobs.grab("t", lock_for=10) is None
    jobs.complete(job)


def test_forged_token_and_unknown_handle(jobs: JobAPI) -> None:
    h = jobs.insert("t", None)
    job = jobs.grab("t", lock_for=10)
    assert job is not None
    with pytest.raises(StaleLease):
        jobs.complete(h, lease_token=homing.uuid7())
    with pytest.raises(JobNotFound):
        jobs.complete(homing.uuid7(), lease_token=job.lease_token)
    with pytest.raises(JobNotFound):
        jobs.details("not-a-handle")
    with pytest.raises(JobNotFound):
        jobs.details(homing.uuid7())
    with pytest.raises(InvalidArgument, match="lease_token"):
        jobs.complete(h)
    assert jobs.details(h).state == "running"


def test_never_grabbed_job_cannot_be_completed(jobs: JobAPI) -> None:
    h = jobs.insert("t", None)
    with pytest.raises(InvalidState, match="never grabbed"):
        jobs.complete(h, lease_token=homing.uuid7())


def test_temp_fail_schedules_retry_and_records_history(jobs: JobAPI, clock: ManualClock) -> None:
    h = jobs.insert("t", {"n": 1})
    job = jobs.grab("t", lock_for=10, worker_id="w")
    assert job is not None
    when = jobs.temp_fail(job, "451 try later", retry_in=30)
    assert when == pytest.approx(clock.now() + 30)
    assert jobs.grab("t", lock_for=10) is None
    clock.advance(31)
    again = jobs.grab("t", lock_for=10)
    assert again is not None and again.attempts == 2
    jobs.perm_fail(again, "550 unknown user")
    d = jobs.details(h)
    assert d.state == "failed" and d.last_error == "550 unknown user"
    assert [(f.attempt, f.kind, f.message) for f in d.failures] == [
        (1, "temp_fail", "451 try later"),
        (2, "perm_fail", "550 unknown user"),
    ]
    assert all(f.host and f.pid for f in d.failures)


def test_replace_is_atomic(jobs: JobAPI) -> None:
    parent = jobs.insert("FiredEvent", {"e": 1})
    job = jobs.grab("FiredEvent", lock_for=10)
    assert job is not None
    kids = jobs.replace(job, [("ProcessSubscription", {"s": i}) for i in range(100)])
    assert len(set(kids)) == 100
    assert jobs.details(parent).state == "done"
    assert all(jobs.details(k).parent == parent for k in kids[:3])
    with pytest.raises(InvalidArgument):
        jobs.replace(job, [("ok", 1), ("bad", {1, 2})])  # bad args: refused before anything


def test_replace_with_bad_children_changes_nothing(jobs: JobAPI) -> None:
    parent = jobs.insert("p", None)
    job = jobs.grab("p", lock_for=10)
    assert job is not None
    with pytest.raises(InvalidArgument):
        jobs.replace(job, [("c", 1), ("", 2)])
    assert jobs.details(parent).state == "running"
    assert jobs.grab("c", lock_for=5) is None


def test_transactional_enqueue_commits_and_rolls_back_with_own_writes(db: homing.Database) -> None:
    with db.transaction() as tx:
        tx.connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    with db.transaction() as tx:
        tx.connection.execute("INSERT INTO orders (id, total) VALUES (1, 100)")
        kept = tx.insert("receipt", {"order": 1})
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.connection.execute("INSERT INTO orders (id, total) VALUES (2, 200)")
        lost = tx.insert("receipt", {"order": 2})
        raise RuntimeError("the caller fails: both writes must vanish")
    with db.transaction() as tx:
        cur = tx.connection.execute("SELECT id FROM orders ORDER BY id")
        assert [r[0] for r in cur.fetchall()] == [1]
    assert db.details(kept).state == "ready"
    with pytest.raises(JobNotFound):
        db.details(lost)


def test_complete_inside_transaction_with_effect(db: homing.Database) -> None:
    with db.transaction() as tx:
        tx.connection.execute("CREATE TABLE effects (job TEXT)")
    h = db.insert("t", None)
    job = db.grab("t", lock_for=10)
    assert job is not None
    with pytest.raises(ZeroDivisionError), db.transaction() as tx:
        tx.connection.execute("INSERT INTO effects (job) VALUES ('x')")
        tx.complete(job)
        1 / 0  # noqa: B018
    assert db.details(h).state == "running"
    with db.transaction() as tx:
        tx.connection.execute("INSERT INTO effects (job) VALUES ('y')")
        tx.complete(job)
        # a call on the Database inside the block joins the same transaction
        assert db.details(h).state == "done"
    with db.transaction() as tx:
        assert [r[0] for r in tx.connection.execute("SELECT job FROM effects").fetchall()] == ["y"]


def test_details_show_holder_and_lease(jobs: JobAPI) -> None:
    h = jobs.insert("t", {"a": [1, 2]})
    job = jobs.grab("t", lock_for=10, worker_id="worker-7")
    assert job is not None
    d = jobs.details(h)
    assert d.holder is not None and d.holder.worker == "worker-7" and d.holder.pid
    assert d.lease_expires_at == pytest.approx(job.lease_expires_at)
    assert d.args == {"a": [1, 2]} and d.as_dict()["handle"] == h


def test_holders_are_registered_once_renewed_while_grabbing_and_forgotten_when_idle(
    db: homing.Database, clock: ManualClock
) -> None:
    """The holder registry (jobs schema 9) stays bounded: one row per worker id however
    many grabs, renewed while it grabs, forgotten by gc a day after its last grab unless a
    running job still names it (only a running job's holder is ever read)."""

    def registry() -> dict[str, float]:
        with db.store.transaction(write=False) as tx:
            return {
                str(w): float(s) for w, s in tx.query("SELECT worker, seen_at FROM homing_holders")
            }

    for n in range(30):
        db.insert("reg", n)
    for _ in range(10):
        db.complete_many(db.grab_many(["reg"], lock_for=60, limit=2, worker_id="busy"))
    (idle,) = db.grab_many(["reg"], lock_for=10**5, limit=1, worker_id="holds-one")
    assert set(registry()) == {"busy", "holds-one"}
    first = registry()["busy"]
    clock.advance(601)  # past the renewal period: the next grab renews the registration
    db.complete_many(db.grab_many(["reg"], lock_for=60, limit=2, worker_id="busy"))
    assert registry()["busy"] == pytest.approx(first + 601)

    clock.advance(86400 + 1)  # a day without grabs: "busy" is forgotten, "holds-one" is not
    db.gc()
    assert set(registry()) == {"holds-one"}
    assert db.details(idle).holder is not None
    db.complete_many(db.grab_many(["reg"], lock_for=60, limit=2, worker_id="busy"))
    assert set(registry()) == {"busy", "holds-one"}  # registered afresh, not a forgotten id


def test_workers_lists_recent_grabbers_and_the_jobs_they_hold(
    jobs: JobAPI, clock: ManualClock
) -> None:
    for n in range(4):
        jobs.insert("wl", n)
    held = jobs.grab_many(["wl"], lock_for=10**5, limit=2, worker_id="holds-two")
    done = jobs.grab_many(["wl"], lock_for=60, limit=2, worker_id="finished")
    jobs.complete_many(done)
    assert len(held) == 2
    listed = {w["worker"]: w for w in jobs.workers()}
    assert {k: v["running"] for k, v in listed.items()} == {"holds-two": 2, "finished": 0}
    assert all(w["pid"] == os.getpid() and w["seen_at"] == clock.now() for w in listed.values())
    clock.advance(3600)  # an hour without grabs: only a worker that holds jobs is listed
    assert [(w["worker"], w["running"]) for w in jobs.workers()] == [("holds-two", 2)]
    assert {w["worker"] for w in jobs.workers(within=7200)} == {"holds-two", "finished"}


def test_gc_keeps_unfinished_and_recent(jobs: JobAPI, clock: ManualClock) -> None:
    old = jobs.insert("t", 1)
    jobs.insert("t", 2)  # stays ready
    job = jobs.grab("t", lock_for=10)
    assert job is not None and job.handle == old
    jobs.complete(job)
    assert jobs.gc() == 0
    clock.advance(3600)
    assert jobs.gc(older_than=7200) == 0
    assert jobs.gc(older_than=60) == 1
    assert jobs.stats()[0]["ready"] == 1


def test_stats_counts_states(jobs: JobAPI, clock: ManualClock) -> None:
    jobs.insert_many([("a", i) for i in range(3)])
    jobs.insert("a", None, run_at=clock.now() + 100)
    jobs.insert("b", None)
    j = jobs.grab("a", lock_for=10)
    assert j is not None
    jobs.complete(j)
    j = jobs.grab("a", lock_for=10)
    clock.advance(5)
    rows = {r["type"]: r for r in jobs.stats()}
    assert (
        rows["a"]["ready"],
        rows["a"]["scheduled"],
        rows["a"]["running"],
        rows["a"]["done"],
    ) == (1, 1, 1, 1)
    assert rows["a"]["oldest_ready_age_s"] == pytest.approx(5)
    assert rows["b"]["ready"] == 1


def _stage(db: homing.Database, batch: str, n: int, *, commit: bool) -> None:
    from homing.store import jobs_queries as q

    now = db.clock.now()
    with db.store.transaction() as tx:
        q.open_batch(tx, batch, now=now)
        for _ in range(n):
            args = "?::jsonb" if tx.dialect == "postgres" else "?"
            tx.execute(
                "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, "
                f"created_at, batch_id) VALUES (?, 'kid', {args}, 'ready', ?, ?, ?, ?)",
                (homing.uuid7(), "{}", now, now, now, batch),
            )
        if commit:
            q.commit_batch(tx, batch, now=now)


def test_staged_batch_becomes_visible_at_commit(db: homing.Database, clock: ManualClock) -> None:
    from homing.store import jobs_queries as q

    now = db.clock.now()
    with db.store.transaction() as tx:
        assert q.open_batch(tx, "b1", now=now) == "open"
    _stage(db, "b1", 1, commit=False)
    assert db.grab("kid", lock_for=5) is None
    assert db.stats()[0]["staged"] == 1
    with db.store.transaction() as tx:
        assert q.commit_batch(tx, "b1", now=now) is True
        assert q.commit_batch(tx, "b1", now=now) is False
    job = db.grab("kid", lock_for=5)
    assert job is not None
    db.complete(job)


def test_staged_jobs_come_after_ready_ones_and_a_full_grab_leaves_them_alone(
    db: homing.Database,
) -> None:
    """A grab takes ready jobs first and staged ones for the rest of its limit; when the
    ready jobs fill it, it does not search the staged batches at all (on PostgreSQL: it
    reads no row of the batches table; the search would have locked staged rows it could
    not lease)."""
    _stage(db, "later", 3, commit=True)
    ready = {db.insert("kid", {"n": i}) for i in range(2)}
    first = db.grab_many("kid", lock_for=5, limit=3)
    assert len(first) == 3
    assert ready < {j.id for j in first}  # both ready ones, and one staged job
    db.complete_many(first)

    more = {db.insert("kid", {"n": i}) for i in range(2)}
    batch_rows_read = (  # the session's counts, those not yet reported included: a delta
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
        "FROM pg_stat_xact_user_tables WHERE relid = 'homing_job_batches'::regclass"
    )
    with db.transaction() as tx:
        pg = db.dialect == "postgres"
        before = tx.connection.execute(batch_rows_read).fetchone() if pg else None
        full = db.grab_many("kid", lock_for=5, limit=2)
        if pg:
            assert tx.connection.execute(batch_rows_read).fetchone() == before
    assert {j.id for j in full} == more
    db.complete_many(full)
    rest = db.grab_many("kid", lock_for=5, limit=10)
    assert len(rest) == 2 and not {j.id for j in rest} & (ready | more)
    db.complete_many(rest)


def test_a_grab_finds_the_staged_jobs_left_among_many_drained_batches(
    db: homing.Database,
) -> None:
    """Committed batches stay in the store for the retention after their jobs were all
    taken (a Spark stream commits one per micro-batch); a grab must neither miss the ones
    that still hold jobs nor take an uncommitted batch's, and on SQLite the work of a grab
    that does not fill its limit must not grow with the drained ones (it read them all:
    10 ms a grab at 5,000)."""
    from homing.store import jobs_queries as q

    def work_of_an_empty_grab() -> int:
        """SQLite: VM steps (in tens) of the grab; PostgreSQL: rows of the batches table
        that the grab read (the session's statistics before and after it: they include
        earlier transactions' counts that the server has not yet reported)."""
        with db.transaction() as tx:
            conn = tx.connection  # this thread's connection: the grab below uses it
            if db.dialect == "postgres":
                read = (
                    "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
                    "FROM pg_stat_xact_user_tables WHERE relid = 'homing_job_batches'::regclass"
                )
                before = conn.execute(read).fetchone()
                assert db.grab_many("kid", lock_for=5, limit=10) == []
                after = conn.execute(read).fetchone()
                return int(after[0] if after else 0) - int(before[0] if before else 0)
        steps = [0]
        conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1) or 0, 10)
        try:
            assert db.grab_many("kid", lock_for=5, limit=10) == []
        finally:
            conn.set_progress_handler(None, 10)
        return steps[0]

    # an open batch is seen, and left alone; it is there for the baseline too (on SQLite a
    # read finds that no job is ready and skips the grab, unless a batch holds some)
    _stage(db, "late-open", 1, commit=False)
    baseline = work_of_an_empty_grab()
    now = db.clock.now()
    with db.store.transaction() as tx:
        for i in range(3_000):
            q.open_batch(tx, f"drained-{i:05d}", now=now)
            q.commit_batch(tx, f"drained-{i:05d}", now=now)
    if db.dialect == "postgres":
        with db.transaction() as tx:
            tx.connection.execute("ANALYZE homing_job_batches")
    assert work_of_an_empty_grab() <= 2 * baseline + 10, baseline
    _stage(db, "late-open", 1, commit=False)
    _stage(db, "late-committed", 3, commit=True)
    _stage(db, "drained-00000x", 1, commit=True)
    got = db.grab_many("kid", lock_for=5, limit=10)
    assert len(got) == 4
    assert db.grab_many("kid", lock_for=5, limit=10) == []
    db.complete_many(got)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda db: db.insert("", {}), "non-empty"),
        (lambda db: db.insert("   ", {}), "non-empty"),
        (lambda db: db.insert(None, {}), "non-empty"),
        (lambda db: db.insert("t\n", {}), "printable"),
        (lambda db: db.insert("t", {1, 2}), "must be JSON"),
        (lambda db: db.insert("t", {"x": math.nan}), "must be JSON"),
        (lambda db: db.insert("t", object()), "must be JSON"),
        (lambda db: db.insert("t", "x" * 2_000_000), "over the limit"),
        (lambda db: db.insert("t", None, priority=1.5), "priority"),
        (lambda db: db.insert("t", None, priority=True), "priority"),
        (lambda db: db.insert("t", None, unique_key=""), "unique_key"),
        (lambda db: db.insert("t", None, run_at=float("inf")), "finite"),
        (lambda db: db.grab("t", lock_for=-1), "lock_for"),
        (lambda db: db.grab("t", lock_for=0), "lock_for"),
        (lambda db: db.grab("t", lock_for=math.nan), "lock_for"),
        (lambda db: db.grab("t", lock_for="10"), "lock_for"),
        (lambda db: db.grab("t", lock_for=10**9), "maximum"),
        (lambda db: db.grab([], lock_for=10), "non-empty list"),
        (lambda db: db.grab_many("t", lock_for=10, limit=0), "limit"),
        (lambda db: db.insert_many([("t", 1), "oops"]), "JobSpec"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(jobs: JobAPI, call, message: str) -> None:  # type: ignore[no-untyped-def]
    before = jobs.stats()
    with pytest.raises(InvalidArgument, match=message):
        call(jobs)
    assert jobs.stats() == before


def test_temp_fail_bad_retry_in_changes_nothing(jobs: JobAPI) -> None:
    h = jobs.insert("t", None)
    job = jobs.grab("t", lock_for=10)
    assert job is not None
    for bad in (-1, math.nan, math.inf, "5", None):
        with pytest.raises(InvalidArgument, match="retry_in"):
            jobs.temp_fail(job, "x", retry_in=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="message"):
        jobs.temp_fail(job, 42, retry_in=1)  # type: ignore[arg-type]
    d = jobs.details(h)
    assert d.state == "running" and d.failures == []


def test_max_args_bytes_is_configurable(store_url: str) -> None:
    with homing.connect(store_url, max_args_bytes=100) as db:
        db.insert("t", "x" * 50)
        with pytest.raises(homing.PayloadTooLarge, match="max_args_bytes"):
            db.insert("t", "x" * 200)


def test_complete_many_is_all_or_none(jobs: JobAPI, clock: ManualClock) -> None:
    jobs.insert_many([("t", i) for i in range(3)])
    batch = jobs.grab_many("t", lock_for=10, limit=3)
    clock.advance(11)
    thief = jobs.grab("t", lock_for=10)  # one of the expired batch
    assert thief is not None
    stale = [j for j in batch if j.handle == thief.handle]
    assert stale, "the thief took one of the batch"
    with pytest.raises(StaleLease):
        jobs.complete_many(batch)
    assert all(jobs.details(j.handle).state == "running" for j in batch)  # nothing completed
    jobs.complete_many([j for j in batch if j.handle != thief.handle] + [thief])
    assert all(jobs.details(j.handle).state == "done" for j in batch)


def test_complete_each_holds_each_job_to_its_own_lease(jobs: JobAPI, clock: ManualClock) -> None:
    """Jobs of several leases in one completion: each must still hold its own lease (one
    statement on PostgreSQL pairs each job with its token). A job re-leased to someone
    else is refused, even though a token of the same call is that of a live lease."""
    jobs.insert_many([("t", i) for i in range(4)])
    old = jobs.grab_many("t", lock_for=10, limit=2)
    clock.advance(11)  # the first lease expires
    fresh = jobs.grab_many("t", lock_for=60, limit=3)  # at least one of the expired two
    assert len(fresh) == 3
    fresh_handles = {j.handle for j in fresh}
    stale = [o for o in old if o.handle in fresh_handles]  # re-leased under a new token
    kept = [o for o in old if o.handle not in fresh_handles]  # expired, taken by no one
    retaken = [j for j in fresh if j.handle in {o.handle for o in old}]
    others = [j for j in fresh if j.handle not in {o.handle for o in old}]
    assert stale and len(stale) + len(kept) == 2  # (on one store: the two ready jobs first)
    stale_handles = [(o.handle, StaleLease) for o in stale]
    refused = jobs.complete_each([*stale, *kept, *others])  # several leases in one call
    assert [(j.handle, type(e)) for j, e in refused] == stale_handles
    assert all(jobs.details(j.handle).state == "running" for j in retaken)  # not by stale
    assert all(jobs.details(j.handle).state == "done" for j in kept + others)
    # the same job twice, the stale pair first: the live one completes it
    refused = jobs.complete_each([*stale, *retaken, *others])  # (others again: accepted)
    assert [(j.handle, type(e)) for j, e in refused] == stale_handles
    assert all(jobs.details(j.handle).state == "done" for j in retaken)


def test_an_expired_lease_left_by_a_full_grab_is_taken_by_the_next(
    jobs: JobAPI, clock: ManualClock
) -> None:
    """A grab filled by ready jobs that come first leaves an expired lease it found; the
    next grab must take it (the search for expired leases resumes from a mark, which must
    not pass it)."""
    jobs.insert_many([JobSpec("t", {"n": "r"}, run_at=clock.now() - 5) for _ in range(3)])
    expired_handle = jobs.insert("t", {"n": "e"})
    held = jobs.grab("t", lock_for=10, where={"n": "e"})
    assert held is not None and held.handle == expired_handle
    clock.advance(11)
    first = jobs.grab_many("t", lock_for=60, limit=3)
    if isinstance(jobs, homing.Database):  # one store: one order (shards grab each their own)
        assert [j.args["n"] for j in first] == ["r", "r", "r"]  # due before the lease expired
    second = jobs.grab_many("t", lock_for=60, limit=3)
    assert len(first) == 3 and len(second) == 1  # the one left, taken at once
    assert expired_handle in {j.handle for j in first + second}
    assert [j.attempts for j in first + second if j.handle == expired_handle] == [2]


def test_grab_many_beyond_sqlite_variable_limit(db: homing.Database) -> None:
    for _ in range(4):
        db.insert_many([("bulk", None)] * 10_000)
    jobs = db.grab_many("bulk", lock_for=60, limit=40_000)
    assert len(jobs) == 40_000 and len({j.handle for j in jobs}) == 40_000
    db.complete_many(jobs)
    assert {r["type"]: r for r in db.stats()}["bulk"]["done"] == 40_000


def test_an_expired_lease_is_not_hidden_by_a_ready_job(jobs: JobAPI, clock: ManualClock) -> None:
    """A grab that takes a ready job while an expired lease of the same priority waits must
    not move the expiry search past that lease (it was hidden for up to 10 s before)."""
    first = jobs.insert("t", 1)
    assert jobs.grab("t", lock_for=1) is not None
    second = jobs.insert("t", 2)
    clock.advance(21)
    taken = [jobs.grab("t", lock_for=1), jobs.grab("t", lock_for=1)]
    assert sorted(j.handle for j in taken if j is not None) == sorted([first, second])


def test_args_written_by_other_hands_read_back(db: homing.Database) -> None:
    """A grab reads args through the JSON scanner directly; text with spaces around it,
    as another program may write into the column, still reads back, and a batch insert
    of many rows (several statements on SQLite) keeps every job and its order."""
    handle = db.insert("spaced", {"a": 1})
    with db.transaction() as tx:
        tx.connection.execute(
            "UPDATE homing_jobs SET args = "
            + ("%s" if db.dialect == "postgres" else "?")
            + " WHERE id = "
            + ("%s" if db.dialect == "postgres" else "?"),
            (' {"a" : [1, "x"] } ', handle),
        )
    job = db.grab("spaced", lock_for=5)
    assert job is not None and job.args == {"a": [1, "x"]}
    handles = db.insert_many([("many", {"i": i, "s": 'é"\\'}) for i in range(250)])
    assert len(set(handles)) == 250
    got = db.grab_many("many", lock_for=5, limit=300)
    assert [j.args["i"] for j in got] == list(range(250))
    assert {j.args["s"] for j in got} == {'é"\\'}


@pytest.mark.parametrize("backend", ["postgres"])  # the backend with notifications
def test_an_insert_broadcasts_only_while_someone_listens(db: homing.Database) -> None:
    """A NOTIFY serialises the commits of every producer, so an insert sends the jobs
    channel's broadcast only when a listener (``wait_for_jobs``, ``wakeup``) has registered
    in the last minute; a session that LISTENs without registering sees the difference."""
    import psycopg
    from psycopg import sql as pgsql

    channel = db.store.notify_channel("homing_jobs")  # type: ignore[attr-defined]
    with psycopg.connect(db.store._listen_conninfo, autocommit=True) as spy:  # type: ignore[attr-defined]
        spy.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
        db.insert("t", 1)
        db.insert_many([("t", 2), ("t", 3)])
        assert list(spy.notifies(timeout=0.5, stop_after=1)) == []  # nobody registered
        assert db.wait_for_jobs(0) is False  # starts (and registers) this store's listener
        db.insert("t", 4)
        assert [n.channel for n in spy.notifies(timeout=5, stop_after=1)] == [channel]
        assert db.wait_for_jobs(5) is True
        db.insert_many([("t", 5), ("t", 6)])
        assert [n.channel for n in spy.notifies(timeout=5, stop_after=1)] == [channel]
        with db.transaction() as tx:  # as if the listener had died a while ago
            tx.connection.execute("UPDATE homing_listeners SET since = since - 120")
        db.insert("t", 7)
        assert list(spy.notifies(timeout=0.5, stop_after=1)) == []


@pytest.mark.parametrize("backend", ["postgres"])  # the backend with notifications
def test_a_listener_registers_while_it_listens_and_leaves_with_its_store(
    db: homing.Database, store_url: str
) -> None:
    """The listener registry stays bounded: a store's listener unregisters when the store
    closes, and ``gc`` deletes what a killed process left behind."""

    def registered() -> int:
        with db.transaction() as tx:
            row = tx.connection.execute("SELECT count(*) FROM homing_listeners").fetchone()
        return int(row[0])

    other = homing.connect(store_url)
    assert isinstance(other, homing.Database)
    other.store.wakeup("homing_jobs_w_idle")  # a worker's own channel: nothing asks for it
    assert registered() == 0
    other.wait_for_jobs(0)
    assert registered() == 1
    other.close()
    deadline = time.monotonic() + 10
    while registered() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registered() == 0
    with db.transaction() as tx:  # what a SIGKILLed listener leaves: a row nobody refreshes
        tx.connection.execute(
            "INSERT INTO homing_listeners (channel, backend, since) VALUES ('x', 1, 0)"
        )
    db.gc()
    assert registered() == 0


def test_a_completion_and_the_next_grab_share_one_commit(db: homing.Database) -> None:
    """The loop of docs/jobs.md ("A loop of your own"): ``tx.complete`` then
    ``tx.grab_many`` in one transaction. Both land with its commit; when the block raises,
    neither does: the job stays leased to its holder (who may complete it again) and the
    next one stays ready."""
    first, second, third = (db.insert("loop", {"n": n}) for n in range(3))
    job = db.grab("loop", lock_for=30)
    assert job is not None and job.handle == first
    with pytest.raises(RuntimeError, match="after the grab"):
        with db.transaction() as tx:
            tx.complete(job)
            taken = tx.grab_many("loop", lock_for=30, limit=1)
            assert [j.handle for j in taken] == [second]
            raise RuntimeError("after the grab")
    assert db.details(first).state == "running"
    assert db.details(second).state == "ready"
    with db.transaction() as tx:
        tx.complete(job)  # the same lease: the rollback undid nothing it held
        nxt = tx.grab_many("loop", lock_for=30, limit=2)
    assert [j.handle for j in nxt] == [second, third]
    assert db.details(first).state == "done"
    assert {db.details(h).state for h in (second, third)} == {"running"}
    with db.transaction() as tx:
        tx.complete_many(nxt)
        assert tx.grab_many("loop", lock_for=30, limit=1) == []
    assert {db.details(h).state for h in (first, second, third)} == {"done"}
