"""Giving up as a feature (issue 13, item 3): TTL and max attempts end a message with a
``Failure`` to its MSC and a dead letter that can be listed and redriven; a poison message is
parked without holding up others; a silent peer is marked dead and not retransmitted to."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

import homing
from homing.messenger import Failure, Incoming, Messenger


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)  # a failed assertion may leave a socket open


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_ttl_ends_in_a_failure_and_a_dead_letter_that_redrives_once(
    ctx: zmq.Context[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="homing.messenger")
    endpoint = _free_endpoint()  # nobody listens there yet
    outcomes: list[Incoming | Failure] = []
    effects: Counter[str] = Counter()
    with Messenger("cli", context=ctx, retry_initial=0.05, retry_max=0.1) as cli:
        cli.send(endpoint, "late", outcomes.append, ttl=0.3)
        cli.send(endpoint, "noop", ttl=0.3)  # no MSC: only a dead letter
        wait_for(lambda: len(outcomes) == 1)
        failure = outcomes[0]
        assert isinstance(failure, Failure) and failure.failed
        assert (failure.reason, failure.text, failure.destination) == ("ttl", "late", endpoint)
        assert cli.wait_idle(5) and cli.unacknowledged() == 0
        letters = cli.dead_letters()
        assert [(d.direction, d.body, d.reason) for d in letters] == [
            ("out", b"late", "ttl"),
            ("out", b"noop", "ttl"),
        ]
        with Messenger("srv", context=ctx) as srv:
            srv.listen(endpoint, lambda m: effects.update([m.text]))
            assert cli.redrive() == 2
            assert cli.redrive(letters) == 0  # already redriven: nothing twice
            assert cli.wait_idle(10) and srv.wait_idle(10)
        assert cli.dead_letters() == []
        assert cli.stats()["gave_up"] == 2
    assert effects == Counter({"late": 1, "noop": 1})


def test_max_attempts_counts_transmissions(ctx: zmq.Context[Any]) -> None:
    failures: list[Failure] = []
    with Messenger("cli", context=ctx, retry_initial=0.02, retry_max=0.05, max_attempts=3) as cli:
        cli.send(_free_endpoint(), "x", failures.append)
        wait_for(lambda: len(failures) == 1)
        assert (failures[0].reason, failures[0].attempts) == ("attempts", 3)
        assert cli.stats()["retransmits"] == 2


def test_a_poison_message_is_parked_without_holding_up_the_others(
    ctx: zmq.Context[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="homing.messenger")
    effects: Counter[str] = Counter()
    broken = threading.Event()
    broken.set()

    def slc(m: Incoming) -> None:
        if m.text == "poison" and broken.is_set():
            raise RuntimeError("cannot handle this one")
        effects[m.text] += 1

    with (
        Messenger("srv", context=ctx, max_handler_attempts=3) as srv,
        Messenger("cli", context=ctx, retry_initial=0.02, retry_max=0.05) as cli,
    ):
        srv.listen("inproc://poison", slc)
        for text in ("a", "poison", "b"):
            cli.send("inproc://poison", text)
        for i in range(50):
            cli.send("inproc://poison", f"after-{i}")
        assert cli.wait_idle(20) and srv.wait_idle(20)
        stats = srv.stats()
        assert (stats["handler_errors"], stats["parked"]) == (3, 1)
        [letter] = srv.dead_letters()
        assert (letter.direction, letter.body, letter.peer) == ("in", b"poison", "cli")
        assert "cannot handle this one" in letter.reason
        assert effects["poison"] == 0 and sum(effects.values()) == 52
        broken.clear()  # the handler is fixed: redrive applies it once
        assert srv.redrive() == 1
        wait_for(lambda: effects["poison"] == 1)
        assert srv.wait_idle(10) and srv.dead_letters() == []
    assert effects == Counter({"a": 1, "b": 1, "poison": 1, **{f"after-{i}": 1 for i in range(50)}})


def test_killed_clients_are_marked_dead_and_not_retransmitted_to(ctx: zmq.Context[Any]) -> None:
    """30 clients go away before the listener's replies reach them: after ``dead_after`` the
    listener stops retransmitting to them (pings only); a client of the same name that
    comes back gets its pending reply at once; the others end as dead letters on TTL."""
    arrived: dict[str, threading.Event] = {f"c{i}": threading.Event() for i in range(30)}
    gone: dict[str, threading.Event] = {f"c{i}": threading.Event() for i in range(30)}
    replied = Counter[str]()

    def slc(m: Incoming) -> None:
        arrived[m.sender].set()
        assert gone[m.sender].wait(20)  # the client was killed before the reply
        m.reply("answer", lambda _r: None)
        replied[m.sender] += 1

    with Messenger(
        "srv", context=ctx, workers=2, retry_initial=0.05, retry_max=0.2, dead_after=0.5, ttl=8.0
    ) as srv:
        endpoint = srv.listen("tcp://127.0.0.1:0", slc)
        for i in range(30):
            with Messenger(f"c{i}", context=ctx, workers=1) as c:
                c.send(endpoint, "question", lambda _r: None)
                assert arrived[f"c{i}"].wait(20)
            gone[f"c{i}"].set()
        wait_for(lambda: sum(replied.values()) == 30)
        wait_for(lambda: srv.stats()["peers_dead"] == 30)
        before = srv.stats()["retransmits"]
        time.sleep(1.0)  # the retry timers would fire ~5 times per peer in 1 s
        assert srv.stats()["retransmits"] == before
        assert srv.unacknowledged() == 30
        with Messenger("c7", context=ctx, workers=1) as again:
            again.connect(endpoint)
            wait_for(lambda: srv.unacknowledged() == 29)  # its reply was delivered
        assert srv.wait_idle(20)  # the 29 others reach their TTL
        letters = srv.dead_letters()
        assert len(letters) == 29 and {d.reason for d in letters} == {"ttl"}
        assert "c7" not in {d.channel.rsplit("#", 1)[1] for d in letters}


def test_durable_dead_letters_survive_a_restart_and_redrive(stores: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    effects: Counter[str] = Counter()
    sdb = homing.connect(stores.url("s"))
    assert isinstance(sdb, homing.Database)
    try:
        with Messenger("s", db=sdb, context=ctx, retry_initial=0.05, ttl=0.3) as s:
            s.send_many("inproc://dead-d", ["x", "y"])
            assert s.wait_idle(10)
            assert {d.body for d in s.dead_letters()} == {b"x", b"y"}
        with Messenger("s", db=sdb, context=ctx, retry_initial=0.05) as s:
            assert s.unacknowledged() == 0  # nothing resumed: they are dead letters now
            with Messenger("r", context=ctx) as r:
                r.listen("inproc://dead-d", lambda m: effects.update([m.text]))
                assert s.redrive() == 2 and s.redrive() == 0
                assert s.wait_idle(10) and r.wait_idle(10)
            assert s.dead_letters() == []
        with sdb.store.transaction() as tx:
            assert tx.query("SELECT COUNT(*) FROM homing_messenger_out") == [(0,)]
    finally:
        sdb.close()
        ctx.term()
    assert effects == Counter({"x": 1, "y": 1})
