"""Model-based test: the job life cycle against a plain Python model (hypothesis, stateful).

Rules insert, grab, complete, temp_fail, perm_fail, extend and advance the clock in random
orders, with stale leases kept around and used on purpose. The store must agree with the
model after every step: one live lease at most, stale holders refused, terminal states
absorbing, attempts counted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import homing
from homing import InvalidState, StaleLease
from tests.conftest import StoreFactory


@dataclass
class ModelJob:
    priority: int
    seq: int
    state: str = "ready"
    run_at: float = 0.0
    token: str | None = None
    expires: float = 0.0
    attempts: int = 0


def make_machine(db: homing.Database, clock: homing.ManualClock) -> type[RuleBasedStateMachine]:
    class JobLifeCycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.type = f"m{uuid.uuid4().hex[:12]}"  # a namespace per run, same store
            self.jobs: dict[str, ModelJob] = {}
            self.held: list[homing.Job] = []
            self.seq = 0

        def available(self) -> list[str]:
            now = clock.now()
            return [
                h
                for h, j in self.jobs.items()
                if (j.state == "ready" and j.run_at <= now)
                or (j.state == "running" and j.expires <= now)
            ]

        @rule(priority=st.integers(0, 2))
        def insert(self, priority: int) -> None:
            h = db.insert(self.type, {"p": priority}, priority=priority)
            self.seq += 1
            self.jobs[h] = ModelJob(priority=priority, seq=self.seq, run_at=clock.now())

        @rule(lock_for=st.integers(1, 20))
        def grab(self, lock_for: int) -> None:
            avail = self.available()
            job = db.grab(self.type, lock_for=lock_for)
            if not avail:
                assert job is None
                return
            assert job is not None and job.handle in avail
            # sharded: priorities order each shard's jobs; a grab visits shards in rotation
            shard = job.handle.split(":")[0] if ":" in job.handle else ""
            same = [h for h in avail if (h.split(":")[0] if ":" in h else "") == shard]
            best = max(self.jobs[h].priority for h in same)
            assert self.jobs[job.handle].priority == best
            m = self.jobs[job.handle]
            m.state, m.token, m.expires = "running", job.lease_token, clock.now() + lock_for
            m.attempts += 1
            assert job.attempts == m.attempts
            self.held.append(job)

        def _valid(self, job: homing.Job) -> bool:
            m = self.jobs[job.handle]
            return m.state == "running" and m.token == job.lease_token

        def _refused(self, job: homing.Job, call: object) -> None:
            try:
                call()  # type: ignore[operator]
            except (StaleLease, InvalidState):
                return
            m = self.jobs[job.handle]
            # the one accepted repeat: completing again what this lease completed
            assert m.state == "done" and m.token == job.lease_token, "stale call was accepted"

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 50))
        def complete(self, i: int) -> None:
            job = self.held[i % len(self.held)]
            if self._valid(job):
                db.complete(job)
                self.jobs[job.handle].state = "done"
            else:
                self._refused(job, lambda: db.complete(job))

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 50), retry_in=st.integers(0, 10))
        def temp_fail(self, i: int, retry_in: int) -> None:
            job = self.held[i % len(self.held)]
            if self._valid(job):
                db.temp_fail(job, "again", retry_in=retry_in)
                m = self.jobs[job.handle]
                m.state, m.run_at = "ready", clock.now() + retry_in
            else:
                with_error = lambda: db.temp_fail(job, "again", retry_in=retry_in)  # noqa: E731
                try:
                    with_error()
                    raise AssertionError("stale temp_fail accepted")
                except (StaleLease, InvalidState):
                    pass

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 50))
        def perm_fail(self, i: int) -> None:
            job = self.held[i % len(self.held)]
            if self._valid(job):
                db.perm_fail(job, "dead")
                self.jobs[job.handle].state = "failed"
            else:
                try:
                    db.perm_fail(job, "dead")
                    raise AssertionError("stale perm_fail accepted")
                except (StaleLease, InvalidState):
                    pass

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 50), lock_for=st.integers(1, 20))
        def extend(self, i: int, lock_for: int) -> None:
            job = self.held[i % len(self.held)]
            if self._valid(job):
                db.extend(job, lock_for)
                self.jobs[job.handle].expires = clock.now() + lock_for
            else:
                try:
                    db.extend(job, lock_for)
                    raise AssertionError("stale extend accepted")
                except (StaleLease, InvalidState):
                    pass

        @rule(seconds=st.sampled_from([0.5, 1, 5, 15, 30]))
        def advance(self, seconds: float) -> None:
            clock.advance(seconds)

        @precondition(lambda self: self.held)
        @rule(lock_for=st.integers(1, 20))
        def expire_and_regrab(self, lock_for: int) -> None:
            """The classic hazard: a lease runs out and a second worker takes the job."""
            clock.advance(21)
            self.grab(lock_for)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for h, m in self.jobs.items():
                d = db.details(h)
                assert (d.state, d.attempts) == (m.state, m.attempts), h
                if m.state == "running":
                    assert d.lease_expires_at == m.expires

    return JobLifeCycle


def test_job_life_cycle_matches_model(store_url: str) -> None:
    clock = homing.ManualClock(start=1_800_000_000.0)
    db = homing.connect(store_url, clock=clock)
    assert isinstance(db, homing.Database)
    run_model(db, clock)


def test_job_life_cycle_matches_model_on_two_shards(tmp_path: Path) -> None:
    factory = StoreFactory("postgres", tmp_path)
    clock = homing.ManualClock(start=1_800_000_000.0)
    db = homing.connect([factory.url("m0"), factory.url("m1")], clock=clock)
    assert isinstance(db, homing.ShardedDatabase)
    try:
        run_model(db, clock)  # type: ignore[arg-type]
    finally:
        factory.cleanup()


def run_model(db: homing.Database, clock: homing.ManualClock) -> None:
    try:
        machine = make_machine(db, clock)
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=30,
                stateful_step_count=30,
                deadline=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        db.close()
