"""Identity that cannot go backwards or be stolen (issue 13, item 1).

The receiver grants each sender channel its epoch; a sender's clock plays no part. Counted
per message: lost = 0 (acknowledged or failed-to-MSC, never silently dropped), duplicated = 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import zmq
import zmq.auth

import homing
from homing.messenger import Curve, Failure, Incoming, Messenger, MessengerFenced, wire


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


class _Effects:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, m: Incoming) -> None:
        with self.lock:
            self.counts[m.text] += 1


def _clock_behind(seconds: float) -> Any:
    """Every wall clock of this process reads ``seconds`` earlier (a restart after an NTP
    step back): ``time.time`` and ``time.time_ns``."""
    real_time, real_ns = time.time, time.time_ns
    return mock.patch.multiple(
        time,
        time=lambda: real_time() - seconds,
        time_ns=lambda: real_ns() - int(seconds * 1e9),
    )


def test_restart_with_an_earlier_clock_loses_nothing(ctx: zmq.Context[Any]) -> None:
    effects = _Effects()
    with Messenger("srv", context=ctx) as srv:
        srv.listen("inproc://clock", effects)
        with Messenger("cli", context=ctx) as first:
            for i in range(3):
                first.send("inproc://clock", f"before-{i}")
            assert first.wait_idle(10)
        with _clock_behind(5.0), Messenger("cli", context=ctx) as second:
            for i in range(3):
                second.send("inproc://clock", f"after-{i}")
            assert second.wait_idle(10)
        assert srv.wait_idle(10)
        assert srv.stats()["stale"] == 0
    assert effects.counts == Counter({f"{w}-{i}": 1 for w in ("before", "after") for i in range(3)})


def test_durable_restart_with_an_earlier_clock_loses_nothing(stores: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    effects = _Effects()
    sdb, rdb = homing.connect(stores.url("s")), homing.connect(stores.url("r"))
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    try:
        with Messenger("r", db=rdb, context=ctx) as srv:
            srv.listen("inproc://clock-d", effects)
            with Messenger("cli", db=sdb, context=ctx, retry_initial=0.05) as first:
                first.send_many("inproc://clock-d", [f"before-{i}" for i in range(3)])
                assert first.wait_idle(10)
            with (
                _clock_behind(5.0),
                Messenger("cli", db=sdb, context=ctx, retry_initial=0.05) as second,
            ):
                second.send_many("inproc://clock-d", [f"after-{i}" for i in range(3)])
                assert second.wait_idle(10)
            assert srv.wait_idle(10)
            assert srv.stats()["stale"] == 0
    finally:
        sdb.close()
        rdb.close()
        ctx.term()
    assert effects.counts == Counter({f"{w}-{i}": 1 for w in ("before", "after") for i in range(3)})


def _seen_epoch(srv: Messenger, sender: str, channel: str) -> int:
    for w in srv._workers:
        st = w.states.get((sender, channel))
        if st is not None:
            return st.epoch
    raise AssertionError(f"no state for {sender}/{channel}")


def test_forged_frames_neither_drop_later_messages_nor_let_duplicates_through(
    ctx: zmq.Context[Any],
) -> None:
    effects = _Effects()
    with Messenger("srv", context=ctx) as srv, Messenger("cli", context=ctx) as cli:
        endpoint = srv.listen("tcp://127.0.0.1:0", effects)
        for i in range(10):
            cli.send(endpoint, f"m{i}")
        assert cli.wait_idle(10)
        epoch = _seen_epoch(srv, "cli", endpoint)
        forger = ctx.socket(zmq.DEALER)
        forger.setsockopt(zmq.ROUTING_ID, b"mallory")
        forger.setsockopt(zmq.RCVTIMEO, 5000)
        forger.setsockopt(zmq.LINGER, 0)
        forger.connect(endpoint)
        channel = endpoint.encode()
        # 1. a frame naming "cli" with a huge epoch: refused, nothing changes
        forger.send_multipart(wire.encode_message(b"cli", channel, wire.MAX_U64, 1, 0, 0, b"m0"))
        refusal = wire.decode(forger.recv_multipart(), 1000)
        assert isinstance(refusal, wire.Refusal) and refusal.reason == wire.UNKNOWN
        assert _seen_epoch(srv, "cli", endpoint) == epoch
        # 2. a replay of earlier messages with the right epoch: suppressed as duplicates
        forger.send_multipart(wire.encode_message(b"cli", channel, epoch, 3, 0, 0, b"m3"))
        ack = wire.decode(forger.recv_multipart(), 1000)
        assert isinstance(ack, wire.Ack) and ack.ids == (3,)
        # 3. a huge id with a huge epoch again, then the real sender carries on
        forger.send_multipart(
            wire.encode_message(b"cli", channel, wire.MAX_U64 - 1, 1 << 62, 0, 0, b"x")
        )
        assert isinstance(wire.decode(forger.recv_multipart(), 1000), wire.Refusal)
        forger.close(0)
        for i in range(10, 20):
            cli.send(endpoint, f"m{i}")
        assert cli.wait_idle(10) and srv.wait_idle(10)
        stats = srv.stats()
        assert stats["unknown_epoch"] == 2 and stats["duplicates"] >= 1
    # lost = 0, duplicated = 0, unexpected = 0
    assert effects.counts == Counter({f"m{i}": 1 for i in range(20)})


def test_forged_frames_change_nothing_in_a_durable_receiver(stores: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    effects = _Effects()
    rdb = homing.connect(stores.url("r"))
    assert isinstance(rdb, homing.Database)
    try:
        with Messenger("r", db=rdb, context=ctx) as srv, Messenger("cli", context=ctx) as cli:
            srv.listen("inproc://forged-d", effects)
            for i in range(5):
                cli.send("inproc://forged-d", f"m{i}")
            assert cli.wait_idle(10)
            with rdb.store.transaction() as tx:
                before = tx.query("SELECT incarnation, max_seen FROM homing_messenger_seen")
            forger = ctx.socket(zmq.DEALER)
            forger.setsockopt(zmq.ROUTING_ID, b"mallory")
            forger.setsockopt(zmq.RCVTIMEO, 5000)
            forger.connect("inproc://forged-d")
            forged = wire.encode_message(
                b"cli", b"inproc://forged-d", (1 << 63) - 1, 1 << 62, 0, 0, b"x"
            )
            forger.send_multipart(forged)
            assert isinstance(wire.decode(forger.recv_multipart(), 1000), wire.Refusal)
            forger.close(0)
            with rdb.store.transaction() as tx:
                assert tx.query("SELECT incarnation, max_seen FROM homing_messenger_seen") == before
            for i in range(5, 10):
                cli.send("inproc://forged-d", f"m{i}")
            assert cli.wait_idle(10) and srv.wait_idle(10)
    finally:
        rdb.close()
        ctx.term()
    assert effects.counts == Counter({f"m{i}": 1 for i in range(10)})


def test_two_live_processes_with_one_name_fence_the_older_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two messengers named "dup", each with its own ZeroMQ context and TCP connection (as
    two processes would have). The newer one's session fences the older: every message of
    the older is delivered once or handed back to its MSC as failed, never both, never
    neither; the newer loses nothing."""
    caplog.set_level(logging.INFO, logger="homing.messenger")
    effects = _Effects()
    failed: Counter[str] = Counter()

    def msc(r: Incoming | Failure) -> None:
        assert isinstance(r, Failure) and r.reason == "fenced"
        failed[r.text] += 1

    with Messenger("srv") as srv:
        endpoint = srv.listen("tcp://127.0.0.1:0", effects)
        older = Messenger("dup", retry_initial=0.05, retry_max=0.2).start()
        newer = Messenger("dup", retry_initial=0.05, retry_max=0.2).start()
        try:
            for i in range(10):
                older.send(endpoint, f"a{i}", msc)
            assert older.wait_idle(10)
            for i in range(10):
                newer.send(endpoint, f"b{i}")
            assert newer.wait_idle(20)
            for i in range(10, 30):
                older.send(endpoint, f"a{i}", msc)
            wait_for(lambda: bool(older.fenced))
            assert older.wait_idle(20)
            with pytest.raises(MessengerFenced, match="another live process"):
                older.send(endpoint, "too late", msc)
            for i in range(10, 20):
                newer.send(endpoint, f"b{i}")
            assert newer.wait_idle(20) and srv.wait_idle(20)
            assert srv.stats()["stale"] >= 1
            assert older.stats()["fenced"] == 1 and newer.stats()["fenced"] == 0
        finally:
            older.close()
            newer.close()
    assert "FENCED" in caplog.text
    wait_for(lambda: sum(failed.values()) + sum(effects.counts[f"a{i}"] for i in range(30)) >= 30)
    for i in range(30):
        assert effects.counts[f"a{i}"] + failed[f"a{i}"] == 1, f"a{i}"
    assert all(effects.counts[f"a{i}"] == 1 for i in range(10))
    assert sum(failed.values()) >= 1
    assert all(effects.counts[f"b{i}"] == 1 for i in range(20))


def test_curve_binds_the_sender_name_to_the_key(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    """With authorized_keys_dir, ``client.key`` may only send as "client": a messenger that
    holds that key but calls itself "admin" is refused (never acknowledged)."""
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_sec = zmq.auth.create_certificates(keys, "server")
    client_pub, client_sec = zmq.auth.create_certificates(keys, "client")
    (allowed / "client.key").write_bytes(Path(client_pub).read_bytes())
    effects = _Effects()
    failures: list[Failure] = []
    srv_curve = Curve(server_sec, authorized_keys_dir=allowed)
    with Messenger("srv", context=ctx, curve=srv_curve) as srv:
        ep = srv.listen("tcp://127.0.0.1:0", lambda m: effects(m) or m.reply(m.sender))
        cli_curve = Curve(client_sec, server_public_keys={ep: server_pub})
        with (
            Messenger("client", context=ctx, curve=cli_curve) as good,
            Messenger("admin", context=ctx, curve=cli_curve, ttl=1.0) as impostor,
        ):
            replies: list[str] = []
            good.send(ep, "hello", lambda r: replies.append(r.text))
            impostor.send(ep, "I am admin", failures.append)
            assert good.wait_idle(10)
            wait_for(lambda: len(failures) == 1)
            assert impostor.unacknowledged() == 0
            assert srv.stats()["impostors_refused"] >= 1
            wait_for(lambda: replies == ["client"])
    assert effects.counts == Counter({"hello": 1})
    assert failures[0].reason == "ttl" and failures[0].text == "I am admin"


def test_two_durable_processes_with_one_name_lose_nothing(
    stores: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Two durable messengers named "dup" on one store: the newer fences the older; the
    older's unacknowledged rows stay in the store, and the next start of the name sends
    them: every message takes effect once."""
    caplog.set_level(logging.ERROR, logger="homing.messenger")
    effects = _Effects()
    url = stores.url("s")
    dbs = [homing.connect(url) for _ in range(3)]
    assert all(isinstance(d, homing.Database) for d in dbs)
    a_db, b_db, c_db = dbs  # type: ignore[misc]
    try:
        with Messenger("srv", retry_initial=0.05) as srv:
            endpoint = srv.listen("tcp://127.0.0.1:0", effects)
            with (
                Messenger("dup", db=a_db, retry_initial=0.05, retry_max=0.2) as older,
                Messenger("dup", db=b_db, retry_initial=0.05, retry_max=0.2) as newer,
            ):
                older.send_many(endpoint, [f"a{i}" for i in range(5)])
                assert older.wait_idle(10)
                newer.send_many(endpoint, [f"b{i}" for i in range(5)])
                assert newer.wait_idle(10)
                older.send_many(endpoint, [f"a{i}" for i in range(5, 10)])
                wait_for(lambda: bool(older.fenced))
                with pytest.raises(MessengerFenced):
                    older.send(endpoint, "too late")
            with Messenger("dup", db=c_db, retry_initial=0.05) as again:
                assert again.wait_idle(20)
            assert srv.wait_idle(10)
        with c_db.store.transaction() as tx:
            assert tx.query("SELECT COUNT(*) FROM homing_messenger_out") == [(0,)]
    finally:
        for d in dbs:
            d.close()
    assert "FENCED" in caplog.text
    expected = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(5)]
    assert effects.counts == Counter(expected)
