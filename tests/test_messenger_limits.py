"""Bounded, expiring duplicate-suppression state (issue 13, item 2), each limit under
100,000 adversarial ids, and the garbage collection of durable rows."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

import homing
from homing.messenger import Incoming, Messenger, collect_garbage, wire

N = 100_000


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)  # also closes a raw socket left open by a failed assertion


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _raw(ctx: zmq.Context[Any], endpoint: str, routing_id: bytes) -> zmq.Socket[Any]:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.ROUTING_ID, routing_id)
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.connect(endpoint)
    return s


def _grant(s: zmq.Socket[Any], sender: bytes, channel: bytes) -> int:
    s.send_multipart(wire.encode_epoch_request(sender, channel, 5, 1, True))
    while True:
        d = wire.decode(s.recv_multipart(), 1 << 20)
        if isinstance(d, wire.EpochGrant):
            return d.epoch


def _acked_ids(s: zmq.Socket[Any]) -> set[int]:
    """Every id acknowledged in what has arrived so far (and nothing refused)."""
    out: set[int] = set()
    while True:
        try:
            d = wire.decode(s.recv_multipart(zmq.NOBLOCK), 1 << 20)
        except zmq.Again:
            return out
        assert isinstance(d, wire.Ack), d
        out.update(d.ids)


def test_complement_intervals_are_capped_and_nothing_is_acked_that_was_not_applied(
    ctx: zmq.Context[Any],
) -> None:
    """100,000 ids each opening a gap (2, 4, 6, ...): the complement never holds more than
    ``max_gaps`` intervals; ids that would open more are deferred (neither applied nor
    acknowledged, so the sender retries them); once the gaps fill, they all go through."""
    effects: Counter[int] = Counter()
    cap = 1000
    with Messenger("srv", context=ctx, max_gaps=cap) as srv:
        endpoint = srv.listen("inproc://gaps", lambda m: effects.update([m.message_id]))
        raw = _raw(ctx, endpoint, b"adv")
        epoch = _grant(raw, b"adv", b"c")
        evens = list(range(2, 2 * N + 1, 2))
        for i in range(0, N, 2000):
            records = [(k, 0, 0, b"") for k in evens[i : i + 2000]]
            raw.send_multipart(wire.encode_batch(b"adv", b"c", epoch, records))
        wait_for(lambda: srv.stats()["received"] == N and srv.wait_idle(0))
        stats = srv.stats()
        assert stats["seen_intervals"] == cap
        assert stats["deferred"] == N - cap
        # acks travel after the apply (the I/O thread sends them): collect until the
        # applied ones are all acknowledged, then a moment more to catch any extra ack
        acked: set[int] = set()
        deadline = time.monotonic() + 30
        while not acked >= set(effects) and time.monotonic() < deadline:
            acked |= _acked_ids(raw)
            time.sleep(0.01)
        time.sleep(0.2)
        acked |= _acked_ids(raw)
        assert acked == set(effects) == set(evens[:cap])  # acked <=> applied
        # a sender retries what was not acknowledged: the odd ids fill the gaps, the
        # deferred evens come again; within a few rounds every id is applied
        todo = sorted(set(range(1, 2 * N + 1)) - acked)
        rounds = 0
        while todo:
            rounds += 1
            assert rounds <= 5, f"{len(todo)} ids still not acknowledged"
            received = srv.stats()["received"]
            for i in range(0, len(todo), 2000):
                records = [(k, 0, 0, b"") for k in todo[i : i + 2000]]
                raw.send_multipart(wire.encode_batch(b"adv", b"c", epoch, records))
            target = received + len(todo)
            wait_for(lambda t=target: srv.stats()["received"] == t and srv.wait_idle(0))
            acked |= _acked_ids(raw)
            todo = [k for k in todo if k not in acked]
        raw.close(0)
        stats = srv.stats()
        assert stats["seen_intervals"] == 0
    assert effects == Counter(range(1, 2 * N + 1))  # each id applied once


def test_sender_states_are_capped_and_expire_and_a_legit_sender_loses_nothing(
    ctx: zmq.Context[Any],
) -> None:
    """100,000 sender names each open a session: at most ``max_senders`` states are kept
    (least recently used evicted); idle ones expire after ``seen_idle``; a real sender whose
    state was evicted asks for a new epoch and loses nothing."""
    effects: Counter[str] = Counter()

    def slc(m: Incoming) -> None:
        effects[m.text] += 1

    with (
        Messenger("srv", context=ctx, max_senders=1000, seen_idle=2.0, workers=2) as srv,
        Messenger("cli", context=ctx, retry_initial=0.05, retry_max=0.2) as cli,
    ):
        endpoint = srv.listen("inproc://names", slc)
        for i in range(10):
            cli.send(endpoint, f"before-{i}")
        assert cli.wait_idle(10)
        raw = _raw(ctx, endpoint, b"adv")
        for i in range(N):
            raw.send_multipart(wire.encode_epoch_request(f"s{i}".encode(), b"c", 9, 1, True))
        wait_for(lambda: srv.stats()["epochs_granted"] == N + 1 and srv.wait_idle(0))
        raw.close(0)
        stats = srv.stats()
        assert stats["seen_keys"] <= 1000 and stats["senders_evicted"] >= N - 1000
        for i in range(10):
            cli.send(endpoint, f"after-{i}")
        assert cli.wait_idle(20) and srv.wait_idle(20)
        assert cli.stats()["epoch_renewals"] == 1  # its state had been evicted
        wait_for(lambda: srv.stats()["seen_keys"] == 0, timeout=30)  # all idle, all expired
    assert effects == Counter({f"{w}-{i}": 1 for w in ("before", "after") for i in range(10)})


def test_collect_garbage_deletes_idle_rows_and_keeps_pending_ones(stores: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    sdb, rdb = homing.connect(stores.url("s")), homing.connect(stores.url("r"))
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    try:
        with (
            Messenger("r", db=rdb, context=ctx, retention=3600) as r,
            Messenger("s", db=sdb, context=ctx, retention=3600) as s,
        ):
            r.listen("inproc://gc", lambda m: None)
            s.send_many("inproc://gc", ["a", "b"])
            s.send("inproc://nobody", "stays pending")
            s.send("inproc://nobody-either", "dead", ttl=0.1)
            wait_for(lambda: s.unacknowledged() == 1 and len(s.dead_letters()) == 1)
            assert r.wait_idle(10) and s.wait_idle(0.01) is False
        now = time.time()
        assert collect_garbage(rdb.store, now, retention=3600) == {
            "seen": 0,
            "dead": 0,
            "channels": 0,
        }
        assert collect_garbage(rdb.store, now + 7200, retention=3600)["seen"] == 1
        done = collect_garbage(sdb.store, now + 7200, retention=3600)
        # the pending message's channel stays; the idle one and the dead letter's go
        assert done == {"seen": 0, "dead": 1, "channels": 2}
        with sdb.store.transaction() as tx:
            assert tx.query("SELECT channel FROM homing_messenger_channels") == [
                ("inproc://nobody",)
            ]
            assert tx.query("SELECT COUNT(*) FROM homing_messenger_out") == [(1,)]
    finally:
        sdb.close()
        rdb.close()
        ctx.term()


def test_a_durable_messenger_collects_garbage_on_a_schedule(stores: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    rdb = homing.connect(stores.url("r"))
    assert isinstance(rdb, homing.Database)
    try:
        with (
            Messenger("r", db=rdb, context=ctx, gc_interval=0.2, retention=0.5) as r,
            Messenger("s", context=ctx) as s,
        ):
            r.listen("inproc://gc-auto", lambda m: None)
            s.send("inproc://gc-auto", "x")
            assert s.wait_idle(10)
            wait_for(lambda: r.stats()["gc_seen"] == 1, timeout=30)
            with rdb.store.transaction() as tx:
                assert tx.query("SELECT COUNT(*) FROM homing_messenger_seen") == [(0,)]
    finally:
        rdb.close()
        ctx.term()


def test_durable_gaps_are_rows_that_survive_a_restart(stores: Any) -> None:
    """The durable complement is one row per gap (a batch writes the gaps it changed); a
    restarted receiver rebuilds it from the rows: a gap id is applied, a seen id is not."""
    ctx: zmq.Context[Any] = zmq.Context()
    effects: Counter[int] = Counter()
    rdb = homing.connect(stores.url("r"))
    assert isinstance(rdb, homing.Database)
    try:
        with Messenger("r", db=rdb, context=ctx) as r:
            r.listen("inproc://gaps-d", lambda m: effects.update([m.message_id]))
            raw = _raw(ctx, "inproc://gaps-d", b"adv")
            epoch = _grant(raw, b"adv", b"c")
            raw.send_multipart(
                wire.encode_batch(b"adv", b"c", epoch, [(k, 0, 0, b"") for k in range(2, 202, 2)])
            )
            wait_for(lambda: r.stats()["delivered"] == 100 and r.wait_idle(0))
            raw.close(0)
        with rdb.store.transaction() as tx:
            assert tx.query("SELECT COUNT(*) FROM homing_messenger_gaps") == [(100,)]
            assert tx.query("SELECT max_seen, complement FROM homing_messenger_seen") == [(200, "")]
        with Messenger("r", db=rdb, context=ctx) as r:
            r.listen("inproc://gaps-d", lambda m: effects.update([m.message_id]))
            raw = _raw(ctx, "inproc://gaps-d", b"adv")
            raw.send_multipart(
                wire.encode_batch(b"adv", b"c", epoch, [(3, 0, 0, b""), (2, 0, 0, b"")])
            )
            ack = wire.decode(raw.recv_multipart(), 1000)
            assert isinstance(ack, wire.Ack) and ack.ids == (2, 3)
            wait_for(lambda: r.wait_idle(0))
            assert r.stats()["duplicates"] == 1
            raw.close(0)
        with rdb.store.transaction() as tx:
            assert tx.query("SELECT COUNT(*) FROM homing_messenger_gaps") == [(99,)]
    finally:
        rdb.close()
        ctx.destroy(linger=0)
    assert effects == Counter([*range(2, 202, 2), 3])
