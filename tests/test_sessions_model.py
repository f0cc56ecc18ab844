"""recover() against a plain Python model of the seed's states (Hypothesis state machine).

Random sequences of prepare / resubmit / drop / submit / serve / take / confirm / reconnect, with
"crashes" anywhere between transactions (a reconnect is a new ``Sessions`` object); after
every step ``recover()`` must report exactly the model's state for every request.
Each example uses a fresh client id and queue, so one store serves all examples.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import homing
from homing.sessions import Server, Sessions

KEEP = 3


class SessionModel(RuleBasedStateMachine):
    db: homing.Database

    def __init__(self) -> None:
        super().__init__()
        self.client = "m-" + homing.uuid7()
        self.queue = "mq-" + self.client
        self.sessions = Sessions(self.db, keep_replies=KEEP)
        self.session = self.sessions.open(self.client)
        self.server = Server(self.db, self.queue, lambda r, t: {"re": r.body})
        self.state: dict[str, str] = {}  # id -> prepared | queued | replied | taken
        self.order: list[str] = []  # enqueue order
        self.remembered: list[str] = []  # taken and not confirmed, oldest first
        self.last_request: str | None = None  # T0's LastRequest
        self.last_enqueued: str | None = None
        self.last_dequeued: str | None = None
        self.counter = 0

    def _body(self) -> dict[str, int]:
        self.counter += 1
        return {"n": self.counter}

    @rule()
    def prepare(self) -> None:
        request = self.session.prepare(self.queue, self._body())
        self.state[request.id] = "prepared"  # every prepared request stays recoverable (A)
        self.last_request = request.id

    def _prepared(self) -> list[str]:
        return [r for r, s in self.state.items() if s == "prepared"]

    @precondition(lambda self: bool(self._prepared()))
    @rule(data=st.data(), by_default=st.booleans())
    def resubmit(self, data: Any, by_default: bool) -> None:
        if by_default and self.last_request in self._prepared():
            request = self.session.resubmit()  # the LastRequest
            assert request.id == self.last_request
        else:
            rid = data.draw(st.sampled_from(self._prepared()))
            request = self.session.resubmit(rid)
            assert request.id == rid
        self._enqueued(request.id)

    @precondition(lambda self: bool(self._prepared()))
    @rule(data=st.data())
    def drop(self, data: Any) -> None:
        rid = data.draw(st.sampled_from(self._prepared()))
        assert self.session.drop(rid).id == rid
        del self.state[rid]
        if rid == self.last_request:
            self.last_request = None

    @rule(remember=st.booleans())
    def submit(self, remember: bool) -> None:
        request = self.session.submit(self.queue, self._body(), remember=remember)
        if remember:
            self.last_request = request.id
        self._enqueued(request.id)

    def _enqueued(self, rid: str) -> None:
        self.state[rid] = "queued"
        self.order.append(rid)
        self.last_enqueued = rid

    @rule()
    def serve_one(self) -> None:
        queued = [r for r in self.order if self.state[r] == "queued"]
        assert self.server.process_one() == bool(queued)
        if queued:
            self.state[queued[0]] = "replied"

    @rule()
    def take(self) -> None:
        replied = [r for r in self.order if self.state[r] == "replied"]
        reply = self.session.take_reply()
        if not replied:
            assert reply is None
            return
        # replies come in reply order, which is request order here (one server, FIFO)
        assert reply is not None and reply.request_id == replied[0]
        self.state[replied[0]] = "taken"
        self.last_dequeued = replied[0]
        self.remembered = ([*self.remembered, replied[0]])[-KEEP:]

    @rule(data=st.data())
    def confirm(self, data: Any) -> None:
        if not self.remembered:
            return
        chosen = data.draw(st.lists(st.sampled_from(self.remembered), unique=True, max_size=3))
        assert self.session.confirm(chosen) == len(chosen)
        self.remembered = [r for r in self.remembered if r not in chosen]

    @rule()
    def crash_and_reconnect(self) -> None:
        self.sessions = Sessions(self.db, keep_replies=KEEP)
        self.session = self.sessions.open(self.client)
        assert self.session.reestablished

    @invariant()
    def recover_matches_the_model(self) -> None:
        rec = self.session.recover()
        assert (rec.last_enqueued_id, rec.last_dequeued_id) == (
            self.last_enqueued,
            self.last_dequeued,
        )
        expected = {}
        for rid, s in self.state.items():
            if s == "prepared":
                expected[rid] = "A"
            elif s == "queued":
                expected[rid] = "B"
            elif s == "replied":
                expected[rid] = "C"
            elif rid in self.remembered:
                expected[rid] = "D"
        assert {r.request_id: r.state for r in rec.requests} == expected
        last = self.last_request or self.last_enqueued
        if last is None:
            assert rec.last is None
        else:
            assert rec.last is not None and rec.last.request_id == last
            want = {"prepared": "A", "queued": "B", "replied": "C", "taken": "D"}[self.state[last]]
            assert rec.last.state == want


def test_recover_against_the_model(db: homing.Database) -> None:
    SessionModel.db = db
    machine_settings = settings(
        max_examples=8,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    SessionModel.TestCase.settings = machine_settings
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(SessionModel, settings=machine_settings)
