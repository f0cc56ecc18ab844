"""Issue 14 (engine): no message held forever. Every exception path reaches a dead-letter
queue with its death history; delivery limits, TTL, queue expiry, drop-head; a dead
consumer's messages go to any live consumer; blocking take; batched publish. Both backends.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import homing
from homing.engine import Engine, MessageNotFound, QueueFull
from homing.errors import InvalidArgument, InvalidState, StaleLease


@pytest.fixture
def engine(db: homing.Database) -> Engine:
    return Engine(db, consumer_timeout=30.0)


def deaths(engine: Engine, dlq: str) -> list[tuple[Any, list[tuple[str, str, int]]]]:
    return [
        (m.body, [(d["queue"], d["reason"], d["count"]) for d in m.deaths])
        for m in engine.dead_letters(dlq)
    ]


def test_full_discard_queue_dead_letters_the_new_message(engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", max_unprocessed=1, dead_letter="dlq")  # default: discard
    engine.publish("q", 1)
    assert engine.publish("q", 2).outcome == "dead-lettered"
    assert deaths(engine, "dlq") == [(2, [("q", "maxlen", 1)])]
    assert engine.queue("q").discarded == 0


def test_full_reject_queue_refuses_publisher_and_records_it(engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", max_unprocessed=1, on_overflow="reject", dead_letter="dlq")
    engine.publish("q", 1)
    with pytest.raises(QueueFull):
        engine.publish("q", 2)
    assert deaths(engine, "dlq") == [(2, [("q", "rejected", 1)])]
    assert [m.body for m in engine.messages("q")] == [1]


def test_drop_head_keeps_the_newest(engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", max_unprocessed=2, on_overflow="drop-head", dead_letter="dlq")
    engine.create_queue("lossy", max_unprocessed=1, on_overflow="drop-head")
    for i in range(4):
        engine.publish("q", i)
        engine.publish("lossy", i)
    assert [m.body for m in engine.messages("q", state="ready")] == [2, 3]
    assert deaths(engine, "dlq") == [(0, [("q", "maxlen", 1)]), (1, [("q", "maxlen", 1)])]
    assert [m.body for m in engine.messages("lossy", state="ready")] == [3]
    assert engine.queue("lossy").discarded == 3


def test_unroutable_and_consumer_reject_carry_their_reason(engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq")
    engine.bind("q", "s", consumer="c", match={"k": 1})
    engine.publish("q", "no-match", headers={"k": 2})
    engine.publish("q", "refused", headers={"k": 1})
    (d,) = engine.take("c")
    engine.nack(d, requeue=False)
    assert deaths(engine, "dlq") == [
        ("no-match", [("q", "unroutable", 1)]),
        ("refused", [("q", "rejected", 1)]),
    ]
    (m,) = [m for m in engine.dead_letters("dlq") if m.body == "refused"]
    assert m.deaths[0]["time"] > 0 and m.reason is not None and "rejected" in m.reason


def test_death_history_counts_repeated_deaths(engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq")
    engine.bind("q", "s", consumer="c")
    engine.publish("q", "x")
    for _ in range(3):
        (d,) = engine.take("c")
        engine.nack(d, requeue=False)
        (dead,) = engine.dead_letters("dlq")
        engine.redrive(dead.seq, to="q")
    (d,) = engine.take("c")
    engine.nack(d, requeue=False)
    assert deaths(engine, "dlq") == [("x", [("q", "rejected", 4)])]


def test_delivery_limit_by_nack_and_by_lease_expiry(
    engine: Engine, clock: homing.ManualClock
) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq", max_deliveries=3)
    engine.bind("q", "s", consumer="c", credits=2)
    engine.publish("q", "nacked")
    engine.publish("q", "slow")
    for _ in range(2):
        got = {d.body: d for d in engine.take("c", limit=2, lease_for=10)}
        engine.nack(got["nacked"])  # requeue
        clock.advance(11)  # "slow": its lease runs out
    got = {d.body: d for d in engine.take("c", limit=2, lease_for=10)}
    assert {d.message.attempts for d in got.values()} == {3}
    engine.nack(got["nacked"])  # third delivery refused: the limit
    clock.advance(11)
    assert engine.take("c") == []  # the lapsed third lease is the limit too
    assert sorted(deaths(engine, "dlq")) == [
        ("nacked", [("q", "delivery_limit", 1)]),
        ("slow", [("q", "delivery_limit", 1)]),
    ]
    assert engine.selectors("q")[0].credits == 2
    assert engine.check() == []


def test_message_ttl_dead_letters_what_waits_too_long(
    engine: Engine, clock: homing.ManualClock
) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq", message_ttl=10)
    engine.create_queue("lossy", message_ttl=10)
    engine.publish("q", "old")
    engine.publish("lossy", "old")
    clock.advance(5)
    engine.publish("q", "young")
    clock.advance(6)
    assert engine.sweep() == 2
    assert deaths(engine, "dlq") == [("old", [("q", "expired", 1)])]
    assert [m.body for m in engine.messages("q", state="ready")] == ["young"]
    assert engine.queue("lossy").discarded == 1
    # an expired message found while routing is not delivered
    clock.advance(5)
    engine.bind("q", "s", consumer="c")
    assert engine.take("c") == []
    assert [b for b, _ in deaths(engine, "dlq")] == ["old", "young"]


def test_unused_queue_expires(engine: Engine, clock: homing.ManualClock) -> None:
    engine.create_queue("temp", expires=60)
    engine.create_queue("kept", expires=60)
    engine.bind("kept", "s", consumer="c")
    clock.advance(30)
    engine.publish("temp", "x")  # use keeps it alive
    clock.advance(45)
    assert engine.sweep() == 0
    clock.advance(20)
    engine.sweep()
    names = {q.name for q in engine.queues()}
    assert "temp" not in names and "kept" in names
    (dead,) = engine.dead_letters()
    assert dead.body == "x" and dead.deaths[0]["reason"] == "queue_deleted"
    clock.advance(100)
    engine.unbind("kept", "s")  # unused from now on
    clock.advance(59)
    engine.sweep()
    assert "kept" in {q.name for q in engine.queues()}
    clock.advance(2)
    engine.sweep()
    assert "kept" not in {q.name for q in engine.queues()}


def test_dead_letter_queue_in_use_is_not_deleted_without_force(engine: Engine) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq")
    with pytest.raises(InvalidState, match="dead-letter queue of q"):
        engine.delete_queue("dlq")
    engine.delete_queue("dlq", force=True)
    assert engine.queue("q").dead_letter is None


def test_dead_consumers_messages_go_to_any_live_consumer(
    engine: Engine, clock: homing.ManualClock
) -> None:
    engine.create_queue("q")
    engine.bind("q", "a", consumer="a", credits=2)
    engine.bind("q", "b", consumer="b", credits=2)
    for i in range(6):
        engine.publish("q", i)
    taken_by_a = engine.take("a", limit=2, lease_for=5)
    assert len(taken_by_a) == 2
    # "a" dies. "b" works on; after a's lease and the consumer timeout, a's messages and
    # credits come back and go to b, the live consumer.
    seen: list[Any] = []
    for _ in range(10):
        clock.advance(8)
        for d in engine.take("b", limit=2, lease_for=60):
            seen.append(d.body)
            engine.ack(d)
    assert sorted(seen) == list(range(6))
    with pytest.raises((StaleLease, MessageNotFound, InvalidState)):
        engine.ack(taken_by_a[0])
    assert engine.selectors("q")[0].credits == 2  # a's credits are back
    assert engine.check() == []


def test_returning_consumer_gets_messages_again(engine: Engine, clock: homing.ManualClock) -> None:
    engine.create_queue("q")
    engine.bind("q", "a", consumer="a", credits=1)
    clock.advance(31)  # "a" never came: absent
    engine.publish("q", "x")
    assert engine.messages("q", state="ready")[0].body == "x"  # held, not given to a
    (d,) = engine.take("a")  # a is back
    assert d.body == "x"


def test_take_wait_blocks_until_a_message_or_the_timeout(engine: Engine) -> None:
    engine.create_queue("q")
    engine.bind("q", "s", consumer="c")
    started = time.monotonic()
    assert engine.take("c", wait=0.3) == []
    assert time.monotonic() - started >= 0.3
    timer = threading.Timer(0.3, lambda: engine.publish("q", "late"))
    timer.start()
    try:
        got = engine.take("c", wait=30)
    finally:
        timer.join()
    assert [d.body for d in got] == ["late"]
    with pytest.raises(InvalidArgument):
        engine.take("c", wait=-1)
    with engine.db.transaction(), pytest.raises(InvalidState, match="open transaction"):
        engine.take("c", wait=1)


def test_publish_many_is_one_idempotent_batch(engine: Engine) -> None:
    engine.create_queue("a")
    engine.create_queue("b")
    engine.bind("a", "s", to="b", credits=100)
    engine.bind("b", "s", consumer="c", credits=100)
    ids = [homing.uuid7() for _ in range(5)]
    first = engine.publish_many("a", list(range(5)), ids=ids)
    assert [p.outcome for p in first] == ["routed"] * 5
    again = engine.publish_many("a", list(range(5)), ids=ids)
    assert all(p.duplicate for p in again)
    assert sorted(d.body for d in engine.take("c", limit=10)) == list(range(5))
    engine.create_queue("full", max_unprocessed=2, on_overflow="reject")
    with pytest.raises(QueueFull, match="2 of 3 fitted"):
        engine.publish_many("full", [1, 2, 3])
    assert engine.messages("full") == []
    with pytest.raises(InvalidArgument):
        engine.publish_many("a", [])


@pytest.mark.parametrize(
    "call",
    [
        lambda e: e.create_queue("x", max_deliveries=0),
        lambda e: e.create_queue("x", max_deliveries=True),
        lambda e: e.create_queue("x", message_ttl=-1),
        lambda e: e.create_queue("x", message_ttl=float("nan")),
        lambda e: e.create_queue("x", expires=float("inf")),
        lambda e: e.create_queue("x", expires="60"),
        lambda e: e.create_queue("x", on_overflow="drop-tail"),
        lambda e: e.take("c", wait=-1),
        lambda e: e.take("c", wait=True),
        lambda e: e.take("c", wait=10**9),
        lambda e: e.publish_many("q", []),
        lambda e: e.publish_many("q", "abc"),
        lambda e: e.publish_many("q", [1, 2], ids=[homing.uuid7()]),
        lambda e: e.publish_many("q", [1], ids=["not-a-uuid"]),
        lambda e: e.publish_many("q", list(range(10_001))),
        lambda e: Engine(e.db, consumer_timeout=0),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(engine: Engine, call: Any) -> None:
    engine.create_queue("q")
    before = (engine.queues(), engine.messages("q"))
    with pytest.raises(InvalidArgument):
        call(engine)
    assert (engine.queues(), engine.messages("q")) == before


def test_copies_for_a_vanished_consumer_do_not_pile_up(
    engine: Engine, clock: homing.ManualClock
) -> None:
    engine.create_queue("dlq")
    engine.create_queue("q", dead_letter="dlq")
    engine.bind("q", "tap", consumer="tap", mode="copy")
    engine.bind("q", "main", consumer="main", credits=10)
    engine.publish("q", "x")
    (d,) = engine.take("tap", lease_for=5)
    clock.advance(6)  # tap's lease lapsed, tap is still alive: offered to tap again
    assert [m.body for m in engine.take("tap")] == ["x"]
    engine.publish("q", "y")
    for _ in range(3):  # tap vanishes; main keeps taking (and so sweeping)
        clock.advance(25)
        for got in engine.take("main", limit=10):
            engine.ack(got)
    assert sorted(deaths(engine, "dlq")) == [
        ("x", [("q", "consumer_absent", 1)]),
        ("y", [("q", "consumer_absent", 1)]),
    ]
    assert engine.messages("q", state="outstanding") == []
    with pytest.raises((StaleLease, MessageNotFound, InvalidState)):
        engine.ack(d)
