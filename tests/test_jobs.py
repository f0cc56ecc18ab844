"""The job API contract (seed 002), run on SQLite and PostgreSQL through the `db` fixture."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

import homing
from homing import InvalidArgument, InvalidFilter, InvalidState, JobNotFound, StaleLease
from homing.clock import ManualClock


def test_insert_grab_complete_round_trip(db: homing.Database) -> None:
    handle = db.insert("email", {"to": "a@example.org"}, priority=3)
    job = db.grab("email", lock_for=30)
    assert job is not None
    assert (job.handle, job.type, job.args, job.attempts, job.priority) == (
        handle,
        "email",
        {"to": "a@example.org"},
        1,
        3,
    )
    assert job.lease_expires_at == pytest.approx(db.clock.now() + 30)
    assert db.details(handle).state == "running"
    db.complete(job)
    d = db.details(handle)
    assert d.state == "done" and d.holder is None and d.finished_at is not None
    assert db.grab("email", lock_for=30) is None


def test_grab_only_requested_types_and_lists(db: homing.Database) -> None:
    db.insert("a", 1)
    db.insert("b", 2)
    assert db.grab("c", lock_for=5) is None
    got = {db.grab(["b", "c"], lock_for=5).args, db.grab(("a",), lock_for=5).args}  # type: ignore[union-attr]
    assert got == {1, 2}


def test_priority_then_fifo(db: homing.Database, clock: ManualClock) -> None:
    low = db.insert("t", "low", priority=0)
    clock.advance(1)
    high = db.insert("t", "high", priority=10)
    clock.advance(1)
    low2 = db.insert("t", "low2", priority=0)
    order = [db.grab("t", lock_for=5).handle for _ in range(3)]  # type: ignore[union-attr]
    assert order == [high, low, low2]


def test_run_at_delays_a_job(db: homing.Database, clock: ManualClock) -> None:
    db.insert("later", None, run_at=clock.now() + 60)
    assert db.grab("later", lock_for=5) is None
    clock.advance(61)
    assert db.grab("later", lock_for=5) is not None


def test_run_at_accepts_aware_datetimes_only(db: homing.Database) -> None:
    db.insert("t", None, run_at=datetime.now(UTC))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        db.insert("t", None, run_at=datetime.now())


def test_unique_key_returns_first_handle_while_retained(
    db: homing.Database, clock: ManualClock
) -> None:
    first = db.insert("charge", {"cents": 100}, unique_key="order-1")
    assert db.insert("charge", {"cents": 999}, unique_key="order-1") == first
    job = db.grab("charge", lock_for=5)
    assert job is not None
    db.complete(job)
    # finished but retained: still deduplicated, nothing runs twice
    assert db.insert("charge", {"cents": 100}, unique_key="order-1") == first
    assert db.grab("charge", lock_for=5) is None
    assert [d.args for d in [db.details(first)]] == [{"cents": 100}]
    clock.advance(db._ops.retention + 1)
    assert db.gc() == 1
    with pytest.raises(JobNotFound):
        db.details(first)
    # after garbage collection the key is free again
    assert db.insert("charge", {"cents": 100}, unique_key="order-1") != first


def test_unique_key_of_perm_failed_job_and_redrive(db: homing.Database) -> None:
    h = db.insert("x", None, unique_key="k")
    for _ in range(2):
        job = db.grab("x", lock_for=5)
        assert job is not None
        db.temp_fail(job, "try again", retry_in=0)
    job = db.grab("x", lock_for=5)
    assert job is not None and job.attempts == 3
    db.perm_fail(job, "550 no such user")
    assert db.insert("x", None, unique_key="k") == h  # a dead job still holds its key
    assert db.grab("x", lock_for=5) is None
    db.redrive(h)
    d = db.details(h)
    assert (d.state, d.attempts) == ("ready", 0)
    assert [f.kind for f in d.failures] == ["temp_fail", "temp_fail", "perm_fail"]
    again = db.grab("x", lock_for=5)
    assert again is not None and again.attempts == 1
    with pytest.raises(InvalidState, match="only perm-failed"):
        db.redrive(h)


def test_insert_many_in_order_with_duplicates(db: homing.Database) -> None:
    handles = db.insert_many(
        [("t", 1), homing.JobSpec("t", 2, unique_key="u"), homing.JobSpec("t", 3, unique_key="u")]
    )
    assert len(handles) == 3 and handles[1] == handles[2] and handles[0] != handles[1]
    grabbed = db.grab_many("t", lock_for=5, limit=10)
    assert sorted(j.args for j in grabbed) == [1, 2]
    db.complete_many(grabbed)
    assert all(db.details(h).state == "done" for h in handles)


def test_grab_many_is_one_lease_and_respects_limit(db: homing.Database) -> None:
    db.insert_many([("t", i) for i in range(5)])
    batch = db.grab_many("t", lock_for=5, limit=3)
    assert len(batch) == 3 and len({j.lease_token for j in batch}) == 1
    assert len(db.grab_many("t", lock_for=5, limit=3)) == 2


def test_where_search_operators(db: homing.Database) -> None:
    rows = [
        {"user": 1, "region": "eu", "score": 10, "vip": True, "meta": {"tier": "gold"}},
        {"user": 2, "region": "us", "score": 20.5, "vip": False, "meta": {"tier": "free"}},
        {"user": 3, "region": "eu", "score": "high", "vip": None},
        {"user": 4, "region": "apac"},
    ]
    for r in rows:
        db.insert("s", r)

    def probe(where: dict) -> set[int]:
        found = set()
        jobs = db.grab_many("s", lock_for=5, limit=10, where=where)
        for j in jobs:
            found.add(j.args["user"])
            db.release(j)
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
    db: homing.Database, where: object, message: str
) -> None:
    h = db.insert("s", {"a": 1})
    with pytest.raises(InvalidFilter, match=message):
        db.grab("s", lock_for=5, where=where)  # type: ignore[arg-type]
    assert db.details(h).state == "ready" and db.details(h).attempts == 0


def test_expired_lease_is_regrabbed_and_old_holder_is_fenced(
    db: homing.Database, clock: ManualClock
) -> None:
    h = db.insert("t", None)
    first = db.grab("t", lock_for=10, worker_id="w1")
    assert first is not None
    assert db.grab("t", lock_for=10) is None  # held: never two holders at once
    clock.advance(11)
    second = db.grab("t", lock_for=10, worker_id="w2")
    assert second is not None and second.attempts == 2
    for call in (
        lambda: db.complete(first),
        lambda: db.temp_fail(first, "late", retry_in=1),
        lambda: db.perm_fail(first, "late"),
        lambda: db.extend(first, 10),
        lambda: db.replace(first, [("child", None)]),
    ):
        with pytest.raises(StaleLease, match="w2"):
            call()
    d = db.details(h)
    assert d.state == "running" and d.holder is not None and d.holder.worker == "w2"
    assert [(f.kind, f.worker) for f in d.failures] == [("lease_expired", "w1")]
    assert db.grab("child", lock_for=5) is None  # the refused replace inserted nothing
    db.complete(second)
    with pytest.raises(StaleLease, match="now done"):
        db.complete(first)
    assert db.details(h).state == "done"


def test_expired_but_not_regrabbed_lease_may_still_finish(
    db: homing.Database, clock: ManualClock
) -> None:
    db.insert("t", None)
    job = db.grab("t", lock_for=1)
    assert job is not None
    clock.advance(5)
    db.complete(job)  # nobody else took it: the holder's work counts
    db.complete(job)  # a retried complete by the same holder is a no-op
    with pytest.raises(InvalidState, match="already done"):
        db.perm_fail(job, "x")


def test_extend_keeps_the_job_from_others(db: homing.Database, clock: ManualClock) -> None:
    db.insert("t", None)
    job = db.grab("t", lock_for=10)
    assert job is not None
    for _ in range(5):
        clock.advance(8)
        until = db.extend(job, 10)
        assert until == job.lease_expires_at == pytest.approx(clock.now() + 10)
        assert db.grab("t", lock_for=10) is None
    db.complete(job)


def test_forged_token_and_unknown_handle(db: homing.Database) -> None:
    h = db.insert("t", None)
    job = db.grab("t", lock_for=10)
    assert job is not None
    with pytest.raises(StaleLease):
        db.complete(h, lease_token=homing.uuid7())
    with pytest.raises(JobNotFound):
        db.complete(homing.uuid7(), lease_token=job.lease_token)
    with pytest.raises(JobNotFound):
        db.details("not-a-handle")
    with pytest.raises(JobNotFound):
        db.details(homing.uuid7())
    with pytest.raises(InvalidArgument, match="lease_token"):
        db.complete(h)
    assert db.details(h).state == "running"


def test_never_grabbed_job_cannot_be_completed(db: homing.Database) -> None:
    h = db.insert("t", None)
    with pytest.raises(InvalidState, match="never grabbed"):
        db.complete(h, lease_token=homing.uuid7())


def test_temp_fail_schedules_retry_and_records_history(
    db: homing.Database, clock: ManualClock
) -> None:
    h = db.insert("t", {"n": 1})
    job = db.grab("t", lock_for=10, worker_id="w")
    assert job is not None
    when = db.temp_fail(job, "451 try later", retry_in=30)
    assert when == pytest.approx(clock.now() + 30)
    assert db.grab("t", lock_for=10) is None
    clock.advance(31)
    again = db.grab("t", lock_for=10)
    assert again is not None and again.attempts == 2
    db.perm_fail(again, "550 unknown user")
    d = db.details(h)
    assert d.state == "failed" and d.last_error == "550 unknown user"
    assert [(f.attempt, f.kind, f.message) for f in d.failures] == [
        (1, "temp_fail", "451 try later"),
        (2, "perm_fail", "550 unknown user"),
    ]
    assert all(f.host and f.pid for f in d.failures)


def test_replace_is_atomic(db: homing.Database) -> None:
    parent = db.insert("FiredEvent", {"e": 1})
    job = db.grab("FiredEvent", lock_for=10)
    assert job is not None
    kids = db.replace(job, [("ProcessSubscription", {"s": i}) for i in range(100)])
    assert len(set(kids)) == 100
    assert db.details(parent).state == "done"
    assert all(db.details(k).parent == parent for k in kids[:3])
    with pytest.raises(InvalidArgument):
        db.replace(job, [("ok", 1), ("bad", {1, 2})])  # bad args: refused before anything


def test_replace_with_bad_children_changes_nothing(db: homing.Database) -> None:
    parent = db.insert("p", None)
    job = db.grab("p", lock_for=10)
    assert job is not None
    with pytest.raises(InvalidArgument):
        db.replace(job, [("c", 1), ("", 2)])
    assert db.details(parent).state == "running"
    assert db.grab("c", lock_for=5) is None


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


def test_details_show_holder_and_lease(db: homing.Database) -> None:
    h = db.insert("t", {"a": [1, 2]})
    job = db.grab("t", lock_for=10, worker_id="worker-7")
    assert job is not None
    d = db.details(h)
    assert d.holder is not None and d.holder.worker == "worker-7" and d.holder.pid
    assert d.lease_expires_at == pytest.approx(job.lease_expires_at)
    assert d.args == {"a": [1, 2]} and d.as_dict()["handle"] == h


def test_gc_keeps_unfinished_and_recent(db: homing.Database, clock: ManualClock) -> None:
    old = db.insert("t", 1)
    db.insert("t", 2)  # stays ready
    job = db.grab("t", lock_for=10)
    assert job is not None and job.handle == old
    db.complete(job)
    assert db.gc() == 0
    clock.advance(3600)
    assert db.gc(older_than=7200) == 0
    assert db.gc(older_than=60) == 1
    assert db.stats()[0]["ready"] == 1


def test_stats_counts_states(db: homing.Database, clock: ManualClock) -> None:
    db.insert_many([("a", i) for i in range(3)])
    db.insert("a", None, run_at=clock.now() + 100)
    db.insert("b", None)
    j = db.grab("a", lock_for=10)
    assert j is not None
    db.complete(j)
    j = db.grab("a", lock_for=10)
    clock.advance(5)
    rows = {r["type"]: r for r in db.stats()}
    assert (
        rows["a"]["ready"],
        rows["a"]["scheduled"],
        rows["a"]["running"],
        rows["a"]["done"],
    ) == (1, 1, 1, 1)
    assert rows["a"]["oldest_ready_age_s"] == pytest.approx(5)
    assert rows["b"]["ready"] == 1


def test_staged_batch_becomes_visible_at_commit(db: homing.Database) -> None:
    from homing.store import jobs_queries as q

    now = db.clock.now()
    with db.store.transaction() as tx:
        assert q.open_batch(tx, "b1", now=now) == "open"
        tx.execute(
            "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, created_at, batch_id) "
            + (
                "VALUES (?, 'kid', ?::jsonb, 'ready', ?, ?, ?, 'b1')"
                if tx.dialect == "postgres"
                else "VALUES (?, 'kid', ?, 'ready', ?, ?, ?, 'b1')"
            ),
            (homing.uuid7(), "{}", now, now, now),
        )
    assert db.grab("kid", lock_for=5) is None
    assert db.stats()[0]["staged"] == 1
    with db.store.transaction() as tx:
        assert q.commit_batch(tx, "b1", now=now) is True
        assert q.commit_batch(tx, "b1", now=now) is False
    job = db.grab("kid", lock_for=5)
    assert job is not None
    db.complete(job)


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
def test_bad_input_is_refused_and_changes_nothing(db: homing.Database, call, message: str) -> None:  # type: ignore[no-untyped-def]
    before = db.stats()
    with pytest.raises(InvalidArgument, match=message):
        call(db)
    assert db.stats() == before


def test_temp_fail_bad_retry_in_changes_nothing(db: homing.Database) -> None:
    h = db.insert("t", None)
    job = db.grab("t", lock_for=10)
    assert job is not None
    for bad in (-1, math.nan, math.inf, "5", None):
        with pytest.raises(InvalidArgument, match="retry_in"):
            db.temp_fail(job, "x", retry_in=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="message"):
        db.temp_fail(job, 42, retry_in=1)  # type: ignore[arg-type]
    d = db.details(h)
    assert d.state == "running" and d.failures == []


def test_max_args_bytes_is_configurable(store_url: str) -> None:
    with homing.connect(store_url, max_args_bytes=100) as db:
        db.insert("t", "x" * 50)
        with pytest.raises(homing.PayloadTooLarge, match="max_args_bytes"):
            db.insert("t", "x" * 200)


def test_complete_many_is_all_or_none(db: homing.Database, clock: ManualClock) -> None:
    db.insert_many([("t", i) for i in range(3)])
    batch = db.grab_many("t", lock_for=10, limit=3)
    clock.advance(11)
    thief = db.grab("t", lock_for=10)  # one of the expired batch
    assert thief is not None
    stale = [j for j in batch if j.handle == thief.handle]
    assert stale, "the thief took one of the batch"
    with pytest.raises(StaleLease):
        db.complete_many(batch)
    assert all(db.details(j.handle).state == "running" for j in batch)  # nothing completed
    db.complete_many([j for j in batch if j.handle != thief.handle] + [thief])
    assert all(db.details(j.handle).state == "done" for j in batch)


def test_grab_many_beyond_sqlite_variable_limit(db: homing.Database) -> None:
    for _ in range(4):
        db.insert_many([("bulk", None)] * 10_000)
    jobs = db.grab_many("bulk", lock_for=60, limit=40_000)
    assert len(jobs) == 40_000 and len({j.handle for j in jobs}) == 40_000
    db.complete_many(jobs)
    assert {r["type"]: r for r in db.stats()}["bulk"]["done"] == 40_000
