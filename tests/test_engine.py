"""The queue engine (seed 001): every rule of the seed, on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import homing
from homing.engine import (
    DEAD_LETTERS,
    Engine,
    GraphCycle,
    InvalidRule,
    MessageNotFound,
    QueueFull,
    QueueNotFound,
    SelectorNotFound,
)
from homing.errors import InvalidArgument, InvalidState, PayloadTooLarge, StaleLease


@pytest.fixture
def engine(db: homing.Database) -> Engine:
    return Engine(db)


def credits(engine: Engine, queue: str) -> dict[str, tuple[int, int]]:
    return {s.name: (s.credits, s.granted) for s in engine.selectors(queue)}


def depth(engine: Engine, queue: str) -> tuple[int, int, int]:
    info = engine.queue(queue)
    return info.ready, info.outstanding, info.done


def snapshot(engine: Engine) -> Any:
    """Everything visible about the engine's state, to prove a refused call changed nothing."""
    return (
        engine.queues(),
        engine.selectors(),
        [engine.messages(qi.name, limit=1000) for qi in engine.queues()],
    )


def bodies(deliveries: list[Any]) -> list[Any]:
    return [d.body for d in deliveries]


# -- the seed's scenarios ------------------------------------------------------------------
def test_two_selector_credit_scenario_step_by_step(engine: Engine) -> None:
    """Seed 001: two selectors with one credit each, three messages, one acknowledgment."""
    engine.create_queue("work")
    engine.bind("work", "a", consumer="dest-a", credits=1)
    engine.bind("work", "b", consumer="dest-b", credits=1)
    assert credits(engine, "work") == {"a": (1, 1), "b": (1, 1)}

    # Two messages arrive and are passed respectively to each selector.
    assert engine.publish("work", 1).outcome == "routed"
    assert engine.publish("work", 2).outcome == "routed"
    assert credits(engine, "work") == {"a": (0, 1), "b": (0, 1)}  # each now has zero
    # A new message arrives and waits, since there are no available selectors.
    assert engine.publish("work", 3).outcome == "held"
    assert depth(engine, "work") == (1, 2, 0)

    got_a = engine.take("dest-a")
    got_b = engine.take("dest-b")
    assert sorted(bodies(got_a) + bodies(got_b)) == [1, 2]
    # One destination acknowledges: the credit goes to its selector, which takes message 3.
    engine.ack(got_a[0])
    assert credits(engine, "work") == {"a": (0, 1), "b": (0, 1)}
    assert bodies(engine.take("dest-a")) == [3]
    assert engine.take("dest-b") == []
    assert depth(engine, "work") == (0, 2, 1)
    assert engine.check() == []


def test_credits_flow_up_a_chain_of_queues(engine: Engine) -> None:
    """A queue fed by a MOVE selector pays that selector when it is paid itself."""
    engine.create_queue("inbox")
    engine.create_queue("stage")
    engine.bind("inbox", "to-stage", to="stage", credits=2)
    engine.bind("stage", "worker", consumer="w", credits=1)
    for i in range(3):
        engine.publish("inbox", i)
    # m0 -> stage -> w; m1 -> stage (held: worker busy); m2 held in inbox (no credit).
    assert credits(engine, "inbox") == {"to-stage": (0, 2)}
    assert credits(engine, "stage") == {"worker": (0, 1)}
    assert depth(engine, "inbox") == (1, 2, 0)
    assert depth(engine, "stage") == (1, 1, 0)

    (d0,) = engine.take("w")
    assert d0.body == 0
    engine.ack(d0)
    # worker got its credit back and took m1; stage paid inbox for m0, so m2 moved on.
    assert depth(engine, "inbox") == (0, 2, 1)
    assert depth(engine, "stage") == (1, 1, 1)
    assert credits(engine, "inbox") == {"to-stage": (0, 2)}
    for expected in (1, 2):
        (d,) = engine.take("w")
        assert d.body == expected
        engine.ack(d)
    assert depth(engine, "inbox") == (0, 0, 3)
    assert depth(engine, "stage") == (0, 0, 3)
    assert credits(engine, "inbox") == {"to-stage": (2, 2)}
    assert credits(engine, "stage") == {"worker": (1, 1)}
    assert engine.check() == []


def test_printer_example_colour_job_to_black_and_white_printers(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A colour job sent to a queue that has only black-and-white printers is unroutable."""
    engine.create_queue("print")
    engine.bind("print", "bw-1", consumer="bw-1", match={"color": False}, credits=5)
    engine.bind("print", "bw-2", consumer="bw-2", match={"color": False}, credits=5)
    with caplog.at_level(logging.WARNING, logger="homing.engine"):
        result = engine.publish("print", {"doc": "photo.jpg"}, headers={"color": True})
    # By default, selectors but none matching: discard, and log it.
    assert result.outcome == "discarded"
    assert engine.queue("print").discarded == 1
    assert any("no selector matched" in r.getMessage() for r in caplog.records)
    assert engine.publish("print", {"doc": "memo"}, headers={"color": False}).outcome == "routed"

    # With a dead-letter queue configured, the colour job goes there instead.
    engine.create_queue("print-exceptions")
    engine.create_queue("print2", dead_letter="print-exceptions")
    engine.bind("print2", "bw", consumer="bw-3", match={"color": False})
    assert engine.publish("print2", {"doc": "photo"}, headers={"color": True}).outcome == (
        "dead-lettered"
    )
    (dead,) = engine.dead_letters("print-exceptions")
    assert dead.body == {"doc": "photo"}
    assert dead.reason is not None and "no selector matched" in dead.reason

    # A default selector (a colour printer that takes what no one else does) wins over both.
    engine.bind("print2", "colour", consumer="colour-1", role="default")
    assert engine.publish("print2", {"doc": "photo2"}, headers={"color": True}).outcome == (
        "routed"
    )
    assert bodies(engine.take("colour-1")) == [{"doc": "photo2"}]
    assert engine.check() == []


def test_no_selectors_holds_and_binding_later_routes(engine: Engine) -> None:
    engine.create_queue("q")
    assert engine.publish("q", "a").outcome == "held"
    assert engine.publish("q", "b").outcome == "held"
    engine.bind("q", "s", consumer="c", credits=10)
    assert bodies(engine.take("c", limit=10)) == ["a", "b"]


def test_copy_fans_out_without_credits(engine: Engine) -> None:
    engine.create_queue("events")
    for i in range(3):
        engine.create_queue(f"sub{i}")
        engine.bind("events", f"copy{i}", to=f"sub{i}", mode="copy")
    engine.bind("events", "audit", consumer="auditor", mode="copy", match={"kind": "login"})
    for i in range(5):
        r = engine.publish("events", i, headers={"kind": "login" if i % 2 else "view"})
        assert r.outcome == "processed"
    for i in range(3):
        assert [m.body for m in engine.messages(f"sub{i}")] == [0, 1, 2, 3, 4]
    assert bodies(engine.take("auditor", limit=10)) == [1, 3]
    assert all(s.credits == 0 and s.granted == 0 for s in engine.selectors("events"))
    assert engine.check() == []


def test_copy_and_move_together_copy_happens_once(engine: Engine) -> None:
    engine.create_queue("src")
    engine.create_queue("log")
    engine.bind("src", "log", to="log", mode="copy")
    engine.bind("src", "work", consumer="w", credits=1)
    engine.publish("src", "x")
    assert engine.publish("src", "y").outcome == "held"  # waiting for credit, copied already
    (d,) = engine.take("w")
    engine.ack(d)  # y is routed on the credit; it must not be copied a second time
    assert [m.body for m in engine.messages("log")] == ["x", "y"]
    assert bodies(engine.take("w")) == ["y"]


# -- deleting selectors -------------------------------------------------------------------
def test_deleting_a_selector_returns_outstanding_messages(engine: Engine) -> None:
    engine.create_queue("q")
    engine.bind("q", "s1", consumer="c1", credits=2)
    engine.publish("q", "m1")
    engine.publish("q", "m2")
    (d1,) = engine.take("c1")
    returned = engine.unbind("q", "s1")
    assert len(returned) == 2
    assert depth(engine, "q") == (2, 0, 0)  # no selectors left: held again
    with pytest.raises(MessageNotFound):
        engine.ack(d1)  # taken back: a late ack is refused, not counted
    engine.bind("q", "s2", consumer="c2", credits=5)  # routed again to the other selector
    assert bodies(engine.take("c2", limit=5)) == ["m1", "m2"]
    assert engine.check() == []


def test_deleting_a_selector_withdraws_along_the_chain(engine: Engine) -> None:
    engine.create_queue("a")
    engine.create_queue("b")
    engine.create_queue("other")
    engine.bind("a", "to-b", to="b", credits=1)
    engine.bind("a", "to-other", to="other", credits=0)
    engine.bind("b", "w", consumer="w", credits=1)
    engine.publish("a", "m")
    assert credits(engine, "b") == {"w": (0, 1)}
    engine.unbind("a", "to-b")
    # m left b (its consumer's credit came back) and was routed again from a: to "other"
    # as soon as that selector has credit.
    assert credits(engine, "b") == {"w": (1, 1)}
    assert engine.take("w") == []
    assert depth(engine, "a") == (1, 0, 0)
    engine.grant("a", "to-other", 1)
    assert [m.body for m in engine.messages("other", state="ready")] == ["m"]
    assert engine.check() == []


def test_self_destructive_queue_and_service_lookup(engine: Engine) -> None:
    """Seed 001: unknown service -> engine dead-letter queue -> bounced to the caller's
    self-destructive reply queue; the reply queue deletes itself when its reader goes."""
    engine.bind(DEAD_LETTERS, "bounce", mode="bounce", credits=100)
    engine.create_queue("client-7", self_destruct=True)
    engine.bind("client-7", "reader", consumer="client-7", credits=10)

    r = engine.publish("service.lookup", {"q": "x"}, return_address="client-7")
    assert r.outcome == "dead-lettered"
    (d,) = engine.take("client-7")
    assert d.body == {"q": "x"}
    assert d.message.address == "client-7"
    assert d.message.original_address == "service.lookup"  # kept in the envelope
    engine.ack(d)
    # The service exists now: requests reach it and do not bounce.
    engine.create_queue("service.lookup")
    assert engine.publish("service.lookup", {"q": "y"}, return_address="client-7").outcome == (
        "held"
    )
    engine.unbind("client-7", "reader")  # last selector gone: the queue deletes itself
    assert "client-7" not in [qi.name for qi in engine.queues()]
    with pytest.raises(QueueNotFound):
        engine.queue("client-7")
    # A bounce to the vanished return address goes back to the dead-letter queue with its
    # return address spent (so it cannot bounce around $dead forever). There it matches no
    # selector, so $dead's default selector keeps it in "undeliverable" (without one, the
    # rule "none matching: discard, logged" applies).
    engine.create_queue("undeliverable")
    engine.bind(DEAD_LETTERS, "keep", to="undeliverable", role="default", credits=1000)
    engine.publish("service.other", "ping", return_address="client-7")
    (held,) = engine.messages("undeliverable")
    assert held.return_address is None and held.original_address == "service.other"
    assert held.reason is not None and "return address 'client-7'" in held.reason
    assert engine.check() == []


def test_self_destruct_returns_held_messages_by_bounce(engine: Engine) -> None:
    engine.create_queue("home")
    engine.create_queue("temp", self_destruct=True)
    engine.bind("temp", "busy", consumer="c", credits=1)
    engine.publish("temp", "first")  # outstanding on "busy"
    engine.publish("temp", "back-home", return_address="home")  # held: no credit
    engine.publish("temp", "no-return")  # held
    engine.unbind("temp", "busy")
    assert "temp" not in [qi.name for qi in engine.queues()]
    # "first" came back to temp when its selector went; then every held message was
    # bounced to its return address, or else dead-lettered.
    (home,) = engine.messages("home")
    assert (home.body, home.address, home.original_address) == ("back-home", "home", "temp")
    assert sorted(m.body for m in engine.dead_letters()) == ["first", "no-return"]
    assert engine.check() == []


def test_bounce_re_addresses_and_keeps_original(engine: Engine) -> None:
    engine.create_queue("replies")
    engine.create_queue("errors")
    engine.bind("errors", "back", mode="bounce", credits=10)
    engine.create_queue("orders", dead_letter="errors")
    engine.bind("orders", "only-eu", consumer="eu", match={"region": "eu"})
    engine.publish("orders", {"n": 1}, headers={"region": "us"}, return_address="replies")
    (m,) = engine.messages("replies", state="ready")
    assert (m.address, m.original_address, m.return_address) == ("replies", "orders", None)
    # no return address: the bounce selector does not match, so on "errors" (selectors, none
    # matching, no dead-letter queue of its own) the message is discarded, and counted
    engine.publish("orders", {"n": 2}, headers={"region": "us"})
    assert engine.dead_letters("errors") == []
    assert engine.queue("errors").discarded == 1
    # bounce credits: the bounced message is outstanding until the reply queue processes it
    assert credits(engine, "errors") == {"back": (9, 10)}
    engine.bind("replies", "reader", consumer="r")
    engine.ack(engine.take("r")[0])
    assert credits(engine, "errors") == {"back": (10, 10)}
    assert engine.check() == []


# -- limits -------------------------------------------------------------------------------
def test_unprocessed_limit_reject_discard_overflow(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.create_queue("strict", max_unprocessed=2, on_overflow="reject")
    engine.publish("strict", 1)
    engine.publish("strict", 2)
    before = snapshot(engine)
    with pytest.raises(QueueFull, match="full"):
        engine.publish("strict", 3)
    assert snapshot(engine) == before

    engine.create_queue("lossy", max_unprocessed=1)  # default: discard, logged
    engine.publish("lossy", 1)
    with caplog.at_level(logging.WARNING, logger="homing.engine"):
        assert engine.publish("lossy", 2).outcome == "discarded"
    assert engine.queue("lossy").discarded == 1
    assert any("full" in r.getMessage() for r in caplog.records)

    engine.create_queue("spill")
    engine.create_queue("big", max_unprocessed=1, on_overflow="overflow")
    engine.bind("big", "spill", to="spill", role="overflow", mode="copy")
    engine.publish("big", 1)
    assert engine.publish("big", 2).outcome == "overflowed"
    assert [m.body for m in engine.messages("spill")] == [2]
    assert [m.body for m in engine.messages("big", state="ready")] == [1]


def test_full_queue_fed_by_a_selector_dead_letters_and_pays(engine: Engine) -> None:
    """A moved message has no publisher to reject to: it becomes a dead letter, and the
    selector that moved it is paid at once (an exception ends the credit obligation)."""
    engine.create_queue("dlq")
    engine.create_queue("full", max_unprocessed=1, on_overflow="reject", dead_letter="dlq")
    engine.create_queue("a")
    engine.bind("a", "to-full", to="full", credits=2)
    assert engine.publish("a", 1).outcome == "routed"  # held in "full", unpaid
    assert engine.publish("a", 2).outcome == "routed"  # on to "full", which is full: DLQ
    assert [m.body for m in engine.dead_letters("dlq")] == [2]
    assert credits(engine, "a") == {"to-full": (1, 2)}
    with pytest.raises(QueueFull):
        engine.publish("full", 3)  # a publisher is rejected
    assert engine.check() == []


def test_history_keeps_the_newest(engine: Engine) -> None:
    engine.create_queue("h", max_history=3)
    engine.bind("h", "c", consumer="c", credits=100)
    for i in range(6):
        engine.publish("h", i)
    for d in engine.take("c", limit=100):
        engine.ack(d)
    assert [m.body for m in engine.messages("h", state="done")] == [3, 4, 5]


# -- dead letters and redrive ---------------------------------------------------------------
def test_unknown_queue_goes_to_engine_dead_letters_and_redrive(engine: Engine) -> None:
    r = engine.publish("nope", b"\x00raw", headers={"h": 1})
    assert r.outcome == "dead-lettered"
    (dead,) = engine.dead_letters()
    assert (dead.body, dead.address, dead.queue) == (b"\x00raw", "nope", DEAD_LETTERS)
    before = snapshot(engine)
    with pytest.raises(QueueNotFound):
        engine.redrive(dead.seq)  # "nope" still does not exist: refused, nothing changes
    assert snapshot(engine) == before
    engine.create_queue("nope")
    again = engine.redrive(dead.seq)
    assert (again.queue, again.outcome, again.id) == ("nope", "held", r.id)
    assert engine.dead_letters() == []
    with pytest.raises(MessageNotFound):
        engine.redrive(dead.seq)


def test_publish_is_idempotent_by_id(engine: Engine) -> None:
    engine.create_queue("q")
    mid = homing.uuid7()
    first = engine.publish("q", 1, id=mid)
    second = engine.publish("q", 1, id=mid)
    assert second.duplicate and (second.seq, second.outcome) == (first.seq, first.outcome)
    assert len(engine.messages("q")) == 1


# -- consumers -------------------------------------------------------------------------------
def test_take_ack_nack_and_leases(engine: Engine, clock: homing.ManualClock) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq")
    engine.bind("q", "s", consumer="c", credits=2)
    engine.publish("q", "a")
    engine.publish("q", "b")
    da, db_ = engine.take("c", limit=2, lease_for=10)
    engine.nack(da)  # requeue: can be taken again at once
    (again,) = engine.take("c")
    assert again.body == "a" and again.message.attempts == 2
    with pytest.raises(StaleLease):
        engine.ack(da)
    engine.nack(again, requeue=False)  # an exception: to the dead-letter queue, paid
    assert [m.body for m in engine.dead_letters("dlq")] == ["a"]
    assert credits(engine, "q") == {"s": (1, 2)}
    clock.advance(11)  # b's lease ran out: someone else may take it
    (b2,) = engine.take("c")
    with pytest.raises(StaleLease):
        engine.ack(db_)
    engine.ack(b2)
    with pytest.raises(InvalidState, match="acked already"):
        engine.ack(b2)
    assert engine.check() == []


def test_ack_commits_with_the_consumers_own_writes(db: homing.Database, engine: Engine) -> None:
    engine.create_queue("q")
    engine.bind("q", "s", consumer="c")
    engine.publish("q", "x")
    (d,) = engine.take("c")
    with pytest.raises(RuntimeError), db.transaction():
        engine.ack(d)
        raise RuntimeError("handler failed after ack")
    assert credits(engine, "q") == {"s": (0, 1)}  # rolled back together
    with db.transaction():
        engine.ack(d)
    assert credits(engine, "q") == {"s": (1, 1)}


def test_job_type_destination(db: homing.Database, engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("mail", dead_letter="dlq")
    engine.bind("mail", "sender", job_type="send_mail", credits=2)
    engine.publish("mail", {"to": "a@x"}, headers={"prio": 1})
    engine.publish("mail", {"to": "b@x"})
    assert engine.publish("mail", {"to": "c@x"}).outcome == "held"
    j1 = db.grab("send_mail", lock_for=30)
    j2 = db.grab("send_mail", lock_for=30)
    assert j1 is not None and j2 is not None
    assert j1.args["body"] == {"to": "a@x"} and j1.args["headers"] == {"prio": 1}
    db.complete(j1)
    db.perm_fail(j2, "mailbox does not exist")
    assert engine.settle_jobs() == 2
    assert [m.body for m in engine.dead_letters("dlq")] == [{"to": "b@x"}]
    j3 = db.grab("send_mail", lock_for=30)  # the held message moved on the returned credit
    assert j3 is not None and j3.args["body"] == {"to": "c@x"}
    assert engine.check() == []


# -- queues ------------------------------------------------------------------------------
def test_delete_queue_refuses_when_in_use_and_force_dead_letters(engine: Engine) -> None:
    engine.create_queue("a")
    engine.create_queue("b")
    engine.bind("a", "to-b", to="b")
    engine.publish("a", "m")
    with pytest.raises(InvalidState, match="in use"):
        engine.delete_queue("b")
    engine.delete_queue("b", force=True)
    assert [s.name for s in engine.selectors("a")] == []
    (dead,) = engine.dead_letters()
    assert dead.body == "m" and dead.reason is not None and "deleted" in dead.reason
    assert depth(engine, "a") == (0, 0, 1)
    with pytest.raises(QueueNotFound):
        engine.delete_queue("b")
    assert engine.check() == []


# -- bad input: a clear error and nothing changed ---------------------------------------------
def test_bad_input_is_refused_and_changes_nothing(engine: Engine) -> None:
    engine.create_queue("a")
    engine.create_queue("b")
    engine.create_queue("c")
    engine.bind("a", "ab", to="b")
    engine.bind("b", "bc", to="c", mode="copy")
    engine.publish("a", "m")
    before = snapshot(engine)
    small = Engine(engine.db, max_body_bytes=10)
    bad_calls = [
        (GraphCycle, lambda: engine.bind("c", "ca", to="a")),  # a -> b -> c -> a
        (GraphCycle, lambda: engine.bind("a", "aa", to="a")),
        (QueueNotFound, lambda: engine.bind("a", "x", to="missing")),
        (QueueNotFound, lambda: engine.bind("missing", "x", consumer="c")),
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match={"n": {"$regex": ".*"}})),
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match={"n": {"$in": []}})),
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match={"n": [1, 2]})),
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match={"n": {"$gt": True}})),
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match="color = 1; DROP")),  # type: ignore[arg-type]
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match={"$or": []})),
        (InvalidRule, lambda: engine.bind("a", "x", consumer="c", match={"n": float("nan")})),
        (InvalidArgument, lambda: engine.bind("a", "x")),
        (InvalidArgument, lambda: engine.bind("a", "x", to="b", consumer="c")),
        (InvalidArgument, lambda: engine.bind("a", "x", consumer="c", mode="teleport")),
        (InvalidArgument, lambda: engine.bind("a", "x", consumer="c", credits=-1)),
        (InvalidState, lambda: engine.bind("a", "ab", consumer="c")),  # duplicate name
        (SelectorNotFound, lambda: engine.unbind("a", "nope")),
        (PayloadTooLarge, lambda: small.publish("a", "x" * 100)),
        (InvalidArgument, lambda: engine.publish("a", object())),
        (InvalidArgument, lambda: engine.publish("a", float("nan"))),
        (InvalidArgument, lambda: engine.publish("a", 1, headers={1: 2})),  # type: ignore[dict-item]
        (InvalidArgument, lambda: engine.publish("a", 1, id="not-a-uuid")),
        (InvalidArgument, lambda: engine.publish("", 1)),
        (InvalidArgument, lambda: engine.publish("a\x00b", 1)),
        (InvalidArgument, lambda: engine.create_queue("$mine")),
        (InvalidArgument, lambda: engine.create_queue("x", on_overflow="explode")),
        (InvalidArgument, lambda: engine.create_queue("x", max_unprocessed=-1)),
        (QueueNotFound, lambda: engine.create_queue("x", dead_letter="missing")),
        (InvalidState, lambda: engine.create_queue("a")),
        (InvalidArgument, lambda: engine.delete_queue(DEAD_LETTERS)),
        (InvalidArgument, lambda: engine.take("c", limit=0)),
        (InvalidArgument, lambda: engine.take("c", lease_for=float("inf"))),
        (MessageNotFound, lambda: engine.ack(999_999, lease_token="t")),
        (InvalidArgument, lambda: engine.ack("1", lease_token="t")),  # type: ignore[arg-type]
        (MessageNotFound, lambda: engine.redrive(999_999)),
        (InvalidArgument, lambda: engine.messages("a", state="lost")),
        (InvalidState, lambda: engine.grant("b", "bc", 1)),  # COPY has no credits
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc) as info:
            call()
        assert str(info.value), f"{exc.__name__} without a message"
    assert snapshot(engine) == before
    assert engine.check() == []


def test_sharded_store_is_refused() -> None:
    with pytest.raises(homing.ConfigurationError, match="one store"):
        Engine(object())  # type: ignore[arg-type]


def test_rules_operators(engine: Engine) -> None:
    engine.create_queue("r")
    engine.bind(
        "r",
        "s",
        consumer="c",
        credits=100,
        match={
            "pages": {"$gt": 0, "$lte": 10},
            "tray": {"$in": ["A4", "A3"]},
            "x": {"$exists": False},
        },
    )
    cases = [
        ({"pages": 5, "tray": "A4"}, True),
        ({"pages": 0, "tray": "A4"}, False),
        ({"pages": 11, "tray": "A4"}, False),
        ({"pages": "5", "tray": "A4"}, False),  # text is not a number
        ({"pages": True, "tray": "A4"}, False),  # a boolean is not a number
        ({"pages": 5, "tray": "B5"}, False),
        ({"pages": 5, "tray": "A4", "x": None}, False),
        ({"tray": "A4"}, False),
    ]
    for headers, expected in cases:
        outcome = engine.publish("r", headers, headers=headers).outcome
        assert (outcome == "routed") is expected, headers
