"""Durable messenger: two real processes (seed 003's replication example), SIGKILLed at the
failpoints and at random moments, restarted; then every record counted (lost = 0, dup = 0)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import homing
from homing.messenger import Messenger

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "messenger_replication.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Role:
    """One side of the example, restarted after every death with the next failpoint plan."""

    def __init__(self, role: str, store: str, endpoint: str, plans: list[str], extra: list[str]):
        self.role = role
        self.cmd = [
            sys.executable,
            str(EXAMPLE),
            role,
            "--store",
            store,
            "--endpoint",
            endpoint,
            "--retry",
            "0.2",
            *extra,
        ]
        self.plans = list(plans)
        self.proc: subprocess.Popen[bytes] | None = None
        self.current: str | None = None
        self.fired: list[str] = []  # failpoint plans that killed the process
        self.random_kills = 0

    def start(self) -> None:
        env = dict(os.environ)
        env.pop("HOMING_FAILPOINTS", None)
        self.current = self.plans.pop(0) if self.plans else None
        if self.current:
            env["HOMING_FAILPOINTS"] = self.current
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL)

    def poll(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def random_kill(self) -> bool:
        """SIGKILL from outside and restart; only between failpoint plans."""
        if self.current is not None or self.poll() is not None:
            return False
        self.kill()
        self.random_kills += 1
        self.start()
        return True

    def check_death(self) -> None:
        code = self.poll()
        if code is None:
            return
        assert code == -signal.SIGKILL, f"{self.role} exited with {code}"
        assert self.current is not None, f"{self.role} died without a planned crash"
        self.fired.append(self.current)
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _count(url: str, sql: str) -> list[tuple[object, ...]]:
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    try:
        with db.store.transaction() as tx:
            return tx.query(sql)
    finally:
        db.close()


def _run(stores, count: int, replica_plans: list[str], primary_plans: list[str], random_kills: int):  # type: ignore[no-untyped-def]
    primary_url, replica_url = stores.url("primary"), stores.url("replica")
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    replica = Role("replica", replica_url, endpoint, replica_plans, [])
    primary = Role("primary", primary_url, endpoint, primary_plans, ["--count", str(count)])
    rng = random.Random(count)
    replica.start()
    primary.start()
    kills_left = random_kills
    next_kill = time.monotonic() + rng.uniform(0.3, 1.0)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert time.monotonic() < deadline, "no progress within 60s"
            if primary.poll() == 0:
                break
            primary.check_death()
            replica.check_death()
            if kills_left and time.monotonic() > next_kill:
                victim = replica if kills_left % 2 else primary
                if victim.random_kill():
                    kills_left -= 1
                    next_kill = time.monotonic() + rng.uniform(0.3, 1.0)
            time.sleep(0.02)
        # the replica forgets its replies once the primary's acks arrive
        until = time.monotonic() + 10
        while _count(replica_url, "SELECT COUNT(*) FROM homing_messenger_out") != [(0,)]:
            assert time.monotonic() < until, "the replica's replies were never acknowledged"
            time.sleep(0.1)
    finally:
        replica.stop()
        primary.kill()
    records = _count(replica_url, "SELECT record, COUNT(*) FROM replica_records GROUP BY record")
    acks = _count(primary_url, "SELECT record, COUNT(*) FROM primary_replicated GROUP BY record")
    expected = {f"record-{i}" for i in range(count)}
    for rows in (records, acks):
        got = {str(r): int(n) for r, n in rows}
        lost = expected - set(got)
        duplicated = {r: n for r, n in got.items() if n > 1}
        unexpected = set(got) - expected
        assert (lost, duplicated, unexpected) == (set(), {}, set())
    assert _count(primary_url, "SELECT COUNT(*) FROM homing_messenger_out") == [(0,)]
    return replica, primary


def test_replication_example_two_processes(stores) -> None:  # type: ignore[no-untyped-def]
    """The seed's example without faults: records persisted once, replies counted once."""
    replica, primary = _run(stores, 200, [], [], 0)
    assert replica.fired == [] and primary.fired == []


def test_kill9_at_failpoints_and_at_random(stores) -> None:  # type: ignore[no-untyped-def]
    """Each side dies at each messenger failpoint in turn (and twice more at random
    moments); after restarts: lost = 0 and duplicated = 0 on both sides."""
    points = [
        "messenger.after_apply_before_ack=2*crash",
        "messenger.after_seen_update=3*crash",
        "messenger.after_ack_sent=2*crash",
    ]
    replica, primary = _run(stores, 300, list(points), list(points), 2)
    # every planned crash fired (a test whose faults never happen proves nothing)
    assert replica.fired == points and primary.fired == points
    assert replica.random_kills + primary.random_kills == 2


def test_restart_resumes_pending_and_keeps_seen_state(stores) -> None:  # type: ignore[no-untyped-def]
    """In one process: a durable sender's unacknowledged messages survive close/reopen
    (no receiver yet), and the receiver's seen state in the store drops the repeats."""
    import zmq

    sender_url, receiver_url = stores.url("s"), stores.url("r")
    ctx = zmq.Context()
    got: list[str] = []
    try:
        sdb = homing.connect(sender_url)
        assert isinstance(sdb, homing.Database)
        with Messenger("s", db=sdb, context=ctx, retry_initial=0.05) as s:
            for i in range(20):
                s.send("inproc://durable-r", f"m{i}")
            assert s.unacknowledged() == 20
        sdb.close()
        rdb = homing.connect(receiver_url)
        sdb = homing.connect(sender_url)
        assert isinstance(rdb, homing.Database) and isinstance(sdb, homing.Database)
        with Messenger("r", db=rdb, context=ctx) as r:
            r.listen("inproc://durable-r", lambda m: got.append(m.text))
            with Messenger("s", db=sdb, context=ctx, retry_initial=0.05) as s:
                assert s.wait_idle(10)
                assert r.wait_idle(10)
            assert sorted(got) == sorted(f"m{i}" for i in range(20))
            with rdb.store.transaction() as tx:
                rows = tx.query("SELECT sender, max_seen, complement FROM homing_messenger_seen")
            assert rows == [("s", 20, "")]
        rdb.close()
        sdb.close()
    finally:
        ctx.term()
