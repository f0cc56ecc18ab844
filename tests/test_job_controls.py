"""Cancel, pause/resume, limits, per-job timeouts and schedules through the job API, on
SQLite and PostgreSQL (and the sharded store where it applies), with a manual clock."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

import homing
from homing import schedules as sched
from homing.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidState,
    JobCancelled,
    JobNotFound,
    JobTimedOut,
)
from homing.job_controls import ControlCache


# -- cancel --------------------------------------------------------------------------------
def test_a_cancelled_ready_or_scheduled_job_never_runs(jobs: homing.JobAPI, clock) -> None:
    ready = jobs.insert("t", {"n": 1})
    later = jobs.insert("t", {"n": 2}, run_at=clock.now() + 60)
    assert jobs.cancel(ready) == "ready"
    assert jobs.cancel(later) == "ready"
    assert jobs.cancel(ready) == "cancelled"  # again: a no-op
    clock.advance(120)
    assert jobs.grab("t", lock_for=10) is None
    d = jobs.details(ready)
    assert d.state == "cancelled" and d.cancelled_at is not None and d.attempts == 0
    assert [f.kind for f in d.failures] == ["cancelled"]
    row = next(r for r in jobs.stats() if r["type"] == "t")
    assert (row["cancelled"], row["failed"], row["ready"], row["scheduled"]) == (2, 0, 0, 0)
    with pytest.raises(InvalidState, match="redriven"):
        jobs.redrive(ready)


def test_a_running_jobs_completion_is_refused_after_cancel(jobs: homing.JobAPI) -> None:
    handle = jobs.insert("t", {})
    job = jobs.grab("t", lock_for=30)
    assert job is not None
    assert jobs.cancel(handle, "operator said so") == "running"
    for refused in (
        lambda: jobs.complete(job),
        lambda: jobs.temp_fail(job, "x", retry_in=1),
        lambda: jobs.perm_fail(job, "x"),
        lambda: jobs.extend(job, 10),
        lambda: jobs.replace(job, [("child", {})]),
    ):
        with pytest.raises(JobCancelled, match="cancelled"):
            refused()
    d = jobs.details(handle)
    assert d.state == "cancelled" and d.last_error == "operator said so" and d.holder is None


def test_cancel_of_finished_or_unknown_jobs_is_refused(jobs: homing.JobAPI) -> None:
    handle = jobs.insert("t", {})
    job = jobs.grab("t", lock_for=30)
    assert job is not None
    jobs.complete(job)
    with pytest.raises(InvalidState, match="already done"):
        jobs.cancel(handle)
    assert jobs.details(handle).state == "done"
    unknown = homing.uuid7()
    with pytest.raises(JobNotFound):
        jobs.cancel(f"0:{unknown}" if ":" in handle else unknown)
    with pytest.raises((InvalidArgument, JobNotFound)):  # sharded: not a shard's handle
        jobs.cancel("")


def test_cancel_children_of_a_replaced_parent_in_one_call(jobs: homing.JobAPI) -> None:
    parent = jobs.insert("fan", {})
    job = jobs.grab("fan", lock_for=30)
    assert job is not None
    children = jobs.replace(job, [("child", {"i": i}) for i in range(5)])
    running = jobs.grab("child", lock_for=30)
    assert running is not None
    done = jobs.grab("child", lock_for=30)
    assert done is not None
    jobs.complete(done)
    cancelled = jobs.cancel_children(parent)
    assert sorted(cancelled) == sorted(set(children) - {done.handle})
    assert jobs.grab("child", lock_for=30) is None
    with pytest.raises(JobCancelled):
        jobs.complete(running)
    assert jobs.details(done.handle).state == "done"
    assert jobs.cancel_children(parent) == []


# -- timeouts ------------------------------------------------------------------------------
def test_a_per_job_timeout_travels_with_the_job(jobs: homing.JobAPI) -> None:
    handle = jobs.insert("t", {}, timeout=2.5)
    plain = jobs.insert("t", {})
    many = jobs.insert_many([homing.JobSpec("t", {}, timeout=7)])
    assert jobs.details(handle).timeout == 2.5 and jobs.details(plain).timeout is None
    grabbed = {j.handle: j.timeout for j in jobs.grab_many("t", lock_for=10, limit=10)}
    assert grabbed == {handle: 2.5, plain: None, many[0]: 7.0}
    with pytest.raises(InvalidArgument, match="timeout"):
        jobs.insert("t", {}, timeout=0)
    with pytest.raises(InvalidArgument, match="timeout"):
        jobs.insert("t", {}, timeout=float("nan"))


def test_a_unique_key_repeat_does_not_change_the_first_jobs_timeout(jobs: homing.JobAPI) -> None:
    first = jobs.insert("t", {}, unique_key="k", timeout=3)
    assert jobs.insert("t", {}, unique_key="k", timeout=9) == first
    assert jobs.details(first).timeout == 3.0


def test_a_completion_after_the_attempt_ended_says_so(db: homing.Database) -> None:
    db.insert("t", {})
    job = db.grab("t", lock_for=30)
    assert job is not None
    db.temp_fail(job, "JobTimeout: ran past 1s", retry_in=5)  # what the worker's timer does
    with pytest.raises(JobTimedOut, match="timeout"):
        db.complete(job)


# -- pause / resume ------------------------------------------------------------------------
def test_pause_is_durable_and_honoured_by_other_connections(
    db: homing.Database, open_db, clock
) -> None:
    other = open_db(clock=clock)
    db.insert("a", {})
    db.insert("b", {})
    assert other.grab_many(["a", "b"], lock_for=5, limit=1)  # warms other's cache: b or a
    db.pause("a")
    db.pause("b")
    time.sleep(ControlCache.refresh_every + 0.1)  # other's cached controls are now stale
    assert other.grab_many(["a", "b"], lock_for=5, limit=10) == []
    again = open_db(clock=clock)  # a new process after a restart: still paused
    assert again.grab_many(["a", "b"], lock_for=5, limit=10) == []
    assert {c.type for c in again.controls() if c.paused} == {"a", "b"}
    assert all(r["paused"] for r in again.stats())
    db.resume("a")
    db.resume("b")
    time.sleep(ControlCache.refresh_every + 0.1)
    assert len(other.grab_many(["a", "b"], lock_for=5, limit=10)) == 1
    assert db.controls() == []  # nothing set: no row, nothing for grabs to look at


def test_pause_on_a_sharded_store_pauses_every_shard(jobs: homing.JobAPI) -> None:
    for i in range(4):
        jobs.insert("p", {"i": i})
    jobs.pause("p")
    assert jobs.grab_many("p", lock_for=5, limit=10) == []
    jobs.resume("p")
    assert len(jobs.grab_many("p", lock_for=5, limit=10)) == 4


# -- limits --------------------------------------------------------------------------------
def test_max_running_counts_live_leases(db: homing.Database, clock) -> None:
    db.limit("lim", max_running=3)
    for i in range(10):
        db.insert("lim", {"i": i})
    first = db.grab_many(["lim", "free"], lock_for=10, limit=10)
    assert len(first) == 3
    assert db.grab_many("lim", lock_for=10, limit=10) == []
    db.complete(first[0])
    assert len(db.grab_many("lim", lock_for=10, limit=10)) == 1
    clock.advance(11)  # every lease expired: their holders are presumed dead
    taken = db.grab_many("lim", lock_for=10, limit=10)
    assert len(taken) == 3
    control = db.limit("lim", max_running=None)
    assert control.max_running is None and not control.limited
    # the 3 jobs never grabbed (and, once the expired-lease search reaches them, the 3
    # expired ones: see ExpiryMarks)
    assert len(db.grab_many("lim", lock_for=10, limit=10)) >= 3


def test_rate_limit_is_a_sliding_window(db: homing.Database, clock) -> None:
    db.limit("r", rate=(2, 60))
    for i in range(7):
        db.insert("r", {"i": i})
    assert len(db.grab_many("r", lock_for=5, limit=10)) == 2
    clock.advance(30)
    assert db.grab_many("r", lock_for=5, limit=10) == []
    clock.advance(31)
    assert len(db.grab_many("r", lock_for=5, limit=10)) == 2
    with db.store.transaction() as tx:  # bounded: at most the limit per type
        assert tx.query_one("SELECT COUNT(*) FROM homing_job_starts")[0] == 2


def test_per_key_concurrency(db: homing.Database) -> None:
    db.limit("k", per_key=("user_id", 2))
    for i in range(9):
        db.insert("k", {"user_id": i % 3})
    db.insert("k", {"other": 1})  # no key: not limited by key
    got = db.grab_many("k", lock_for=10, limit=20)
    users = [j.args.get("user_id") for j in got]
    assert sorted(u for u in users if u is not None) == [0, 0, 1, 1, 2, 2]
    assert users.count(None) == 1
    assert db.grab_many("k", lock_for=10, limit=20) == []
    db.complete(next(j for j in got if j.args.get("user_id") == 1))
    again = db.grab_many("k", lock_for=10, limit=20)
    assert [j.args["user_id"] for j in again] == [1]


def test_limits_combine(db: homing.Database) -> None:
    db.limit("c", max_running=2, per_key="u")
    for i in range(6):
        db.insert("c", {"u": i % 2})
    got = db.grab_many("c", lock_for=10, limit=10)
    assert sorted(j.args["u"] for j in got) == [0, 1]


def test_bad_limits_are_refused_and_change_nothing(db: homing.Database) -> None:
    for bad in (
        {"max_running": -1},
        {"max_running": True},
        {"rate": (1, 0)},
        {"rate": (-1, 5)},
        {"rate": "5/s"},
        {"per_key": "a.b"},
        {"per_key": "x'; DROP TABLE homing_jobs; --"},
        {"per_key": ("u", -2)},
    ):
        with pytest.raises(InvalidArgument):
            db.limit("t", **bad)
    with pytest.raises(InvalidArgument):
        db.limit("t")
    with pytest.raises(InvalidArgument):
        db.pause("")
    assert db.controls() == []


def test_a_sharded_store_refuses_limits_and_a_single_one_keeps_them(jobs: homing.JobAPI) -> None:
    if isinstance(jobs, homing.ShardedDatabase):
        with pytest.raises(ConfigurationError, match="shards"):
            jobs.limit("t", max_running=3)
        assert jobs.controls() == []
    else:
        assert isinstance(jobs, homing.Database)
        assert jobs.limit("t", max_running=3).max_running == 3


# -- schedules -----------------------------------------------------------------------------
def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _set(clock, text: str) -> None:
    clock.advance(_at(text) - clock.now())


@pytest.mark.parametrize(
    ("missed", "expected"),
    [("once", ["10:15"]), ("all", ["10:05", "10:10", "10:15"]), ("skip", [])],
)
def test_missed_ticks_follow_the_schedules_policy(db: homing.Database, clock, missed, expected):
    _set(clock, "2026-01-01T10:00:30")
    s = sched.Schedule(
        f"every5-{missed}", "*/5 * * * *", type="report", args={"x": 1}, missed=missed
    )
    sched.register(db.store, [s], max_args_bytes=1000)
    assert sched.run_due(db, s.name) == []
    _set(clock, "2026-01-01T10:16:00")  # 10:05, 10:10, 10:15 passed while nothing ran
    handles = sched.run_due(db, s.name)
    ticks = [datetime.fromtimestamp(db.details(h).run_at, UTC).strftime("%H:%M") for h in handles]
    assert ticks == expected
    assert all(db.details(h).args == {"x": 1} for h in handles)
    assert sched.run_due(db, s.name) == []  # nothing twice
    [row] = [r for r in db.schedules() if r["name"] == s.name]
    assert row["last_tick"] == _at("2026-01-01T10:15:00")  # every policy moves on
    _set(clock, "2026-01-01T10:20:01")  # seen in time: every policy runs it
    assert len(sched.run_due(db, s.name)) == 1
    [row] = [r for r in db.schedules() if r["name"] == s.name]
    assert row["last_tick"] == _at("2026-01-01T10:20:00")
    assert row["next_tick"] == _at("2026-01-01T10:25:00")


def test_a_long_downtime_costs_one_pass(db: homing.Database, clock) -> None:
    _set(clock, "2026-01-01T10:00:00")
    every_second = [
        sched.Schedule(f"s-{m}", "* * * * * *", type="t", missed=m) for m in ("once", "all")
    ]
    sched.register(db.store, every_second, max_args_bytes=1000)
    clock.advance(3 * 86400)  # three days of per-second ticks missed
    assert len(sched.run_due(db, "s-once")) == 1
    assert len(sched.run_due(db, "s-all")) == sched.MAX_CATCH_UP  # the oldest first
    rows = {r["name"]: r for r in db.schedules()}
    assert rows["s-all"]["last_tick"] == _at("2026-01-01T10:00:00") + sched.MAX_CATCH_UP


def test_a_second_scheduler_at_the_same_tick_inserts_nothing(db: homing.Database, open_db, clock):
    _set(clock, "2026-01-01T10:00:30")
    s = sched.Schedule("minutely", "* * * * *", type="m", missed="all")
    sched.register(db.store, [s], max_args_bytes=1000)
    _set(clock, "2026-01-01T10:03:00")
    first = sched.run_due(db, s.name)
    other = open_db(clock=clock)
    sched.register(other.store, [s], max_args_bytes=1000)  # a restart keeps the last tick
    assert sched.run_due(other, s.name) == []
    assert len(first) == 3
    assert len({db.details(h).unique_key for h in first}) == 3


def _local(cron: str, tz: str, start: datetime) -> list[str]:
    after = start.timestamp()
    ticks = sched.ticks_between(cron, tz, after, after + 3 * 86400, limit=10)
    return [datetime.fromtimestamp(t, sched.zone(tz)).isoformat() for t in ticks]


def test_time_zones_and_dst_are_croniters() -> None:
    # 02:30 every day in Paris. On 2026-03-29 the clocks jump from 02:00 to 03:00: that
    # day's tick comes at the jump; on 2026-10-25 02:30 happens twice: two ticks (croniter's
    # behaviour, as documented in docs/jobs.md)
    assert _local("30 2 * * *", "Europe/Paris", datetime(2026, 3, 28, 12, tzinfo=UTC)) == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    assert _local("30 2 * * *", "Europe/Paris", datetime(2026, 10, 24, 12, tzinfo=UTC)) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]
    # 9:00 New York is 14:00 UTC in winter and 13:00 UTC in summer
    winter = sched.next_tick("0 9 * * *", "America/New_York", _at("2026-01-10T00:00:00"))
    summer = sched.next_tick("0 9 * * *", "America/New_York", _at("2026-07-10T00:00:00"))
    assert datetime.fromtimestamp(winter, UTC).hour == 14
    assert datetime.fromtimestamp(summer, UTC).hour == 13


def test_bad_schedules_are_refused(db: homing.Database) -> None:
    for kwargs in (
        {"cron": "61 * * * *"},
        {"cron": "every day"},
        {"tz": "Mars/Olympus"},
        {"missed": "sometimes"},
        {"type": ""},
    ):
        base = {"name": "s", "cron": "* * * * *", "type": "t"} | kwargs
        with pytest.raises(InvalidArgument):
            sched.Schedule(**base)  # type: ignore[arg-type]
    app = homing.App(db)
    app.schedule("one", "* * * * *", type="t")
    with pytest.raises(ConfigurationError, match="already"):
        app.schedule("one", "* * * * *", type="t")


# -- dependencies --------------------------------------------------------------------------
def _beside(jobs: homing.JobAPI, handle: str, type_: str) -> str:
    """A job on the same shard as ``handle`` (the dependencies of a job share a shard)."""
    if isinstance(jobs, homing.ShardedDatabase):
        other = jobs.insert("stray", {})  # round-robin: the next shard
        assert other.split(":")[0] != handle.split(":")[0]
        with pytest.raises(InvalidArgument, match="one shard"):
            jobs.insert("z", {}, after=[handle, other])
        return jobs.shards[int(handle.split(":")[0])].insert(type_, {})
    return jobs.insert(type_, {})


def test_a_dependant_runs_once_after_all_its_dependencies(jobs: homing.JobAPI, clock) -> None:
    a = jobs.insert("a", {})
    b = _beside(jobs, a, "b")
    c = jobs.insert("c", {"n": 1}, after=[a, b], run_at=clock.now() + 5)
    assert jobs.details(c).state == "waiting"
    assert next(r for r in jobs.stats() if r["type"] == "c")["waiting"] == 1
    clock.advance(10)
    assert jobs.grab("c", lock_for=5) is None
    ja = jobs.grab("a", lock_for=5)
    assert ja is not None
    jobs.complete(ja)
    assert jobs.release_waiting() == ([], [])
    jb = jobs.grab("b", lock_for=5)
    assert jb is not None
    jobs.replace(jb, [("b_child", {})])  # a replaced dependency counts as done
    assert jobs.release_waiting() == ([c], [])
    assert jobs.release_waiting() == ([], [])  # released once
    got = jobs.grab_many(["a", "c"], lock_for=5, limit=5)
    assert [j.handle for j in got] == [c] and got[0].args == {"n": 1}


def test_a_failed_or_cancelled_dependency_cancels_the_dependant(jobs: homing.JobAPI) -> None:
    d = jobs.insert("d", {})
    e = _beside(jobs, d, "e")
    after_failed = jobs.insert("x", {}, after=[d])
    after_cancelled = jobs.insert("y", {}, after=[e, d])
    jd = jobs.grab("d", lock_for=5)
    assert jd is not None
    jobs.perm_fail(jd, "boom")
    jobs.cancel(e)
    released, cancelled = jobs.release_waiting()
    assert released == [] and sorted(cancelled) == sorted([after_failed, after_cancelled])
    for h in cancelled:
        detail = jobs.details(h)
        assert detail.state == "cancelled" and "dependency" in (detail.last_error or "")
    assert jobs.grab_many(["x", "y"], lock_for=5, limit=5) == []


def test_a_waiting_job_can_be_cancelled_and_bad_dependencies_are_refused(
    jobs: homing.JobAPI,
) -> None:
    a = jobs.insert("a", {})
    w = jobs.insert("w", {}, after=[a])
    assert jobs.cancel(w) == "ready"
    ja = jobs.grab("a", lock_for=5)
    assert ja is not None
    jobs.complete(ja)
    assert jobs.release_waiting() == ([], [])
    assert jobs.details(w).state == "cancelled"
    unknown = homing.uuid7()
    with pytest.raises(JobNotFound):
        jobs.insert("w", {}, after=[f"0:{unknown}" if ":" in a else unknown])
    for bad in ([], "not-a-list", [""]):
        with pytest.raises((InvalidArgument, JobNotFound)):
            jobs.insert("w", {}, after=bad)  # type: ignore[arg-type]
    assert jobs.stats() and all(r["waiting"] == 0 for r in jobs.stats())
