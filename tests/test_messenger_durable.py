"""Durable messenger: two real processes (seed 003's replication example), SIGKILLed at the
failpoints and at random moments, restarted; then every record counted (lost = 0, dup = 0)."""

from __future__ import annotations

import os
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


# Runs the example with every wall clock of the process reading ``offset`` seconds earlier.
_CLOCK_BACK = """
import runpy, sys, time
offset = float(sys.argv[1])
real_time, real_ns = time.time, time.time_ns
time.time = lambda: real_time() - offset
time.time_ns = lambda: real_ns() - int(offset * 1e9)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Role:
    """One side of the example as a child process, started with or without a failpoint;
    with ``clock_back``, each start has a wall clock 5 s earlier than the one before."""

    def __init__(self, role: str, store: str, endpoint: str, clock_back: bool = False) -> None:
        self.role = role
        self.clock_back = clock_back
        self.starts = 0
        self.cmd = [sys.executable, str(EXAMPLE), role, "--store", store]
        self.cmd += ["--endpoint", endpoint, "--retry", "0.2", "--linger", "600"]
        self.cmd += ["--batch", "2", "--pace", "0.02"]  # many small batches: many failpoint hits
        self.proc: subprocess.Popen[bytes] | None = None
        self.fired: list[str] = []  # failpoint plans that killed the process
        self.outside_kills = 0

    def start(self, plan: str | None = None, count: int = 0) -> None:
        env = dict(os.environ)
        env.pop("HOMING_FAILPOINTS", None)
        if plan:
            env["HOMING_FAILPOINTS"] = plan
        extra = ["--count", str(count)] if self.role == "primary" else []
        cmd = [*self.cmd, *extra]
        if self.clock_back:
            cmd = [sys.executable, "-c", _CLOCK_BACK, str(5.0 * self.starts), *cmd[1:]]
        self.starts += 1
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL from outside, at whatever point the process is."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.outside_kills += 1

    def crashed(self, plan: str) -> bool:
        """True once the failpoint killed the process."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return False
        assert code == -signal.SIGKILL, f"{self.role} exited with {code} under {plan}"
        self.fired.append(plan)
        return True

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()


def _query(db: homing.Database, sql: str) -> tuple[object, ...] | None:
    try:
        with db.store.transaction() as tx:
            return tx.query_one(sql)
    except Exception:  # the example has not created its tables yet
        return None


def _run(stores, plans: list[str | None], per_phase: int, clock_back: bool = False):  # type: ignore[no-untyped-def]
    """Each phase SIGKILLs both sides wherever they are, raises the primary's record count
    by ``per_phase`` and restarts both with the phase's failpoint plan; each side is
    restarted plain once the plan killed it. Then both run plain until everything is
    replicated and acknowledged, and the effects are counted."""
    primary_url, replica_url = stores.url("primary"), stores.url("replica")
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    replica = Role("replica", replica_url, endpoint, clock_back)
    primary = Role("primary", primary_url, endpoint, clock_back)
    pdb, rdb = homing.connect(primary_url), homing.connect(replica_url)
    assert isinstance(pdb, homing.Database) and isinstance(rdb, homing.Database)
    count = 0
    try:
        replica.start()
        for plan in plans:
            count += per_phase
            replica.kill()
            replica.start(plan)
            primary.kill()
            primary.start(plan, count)
            if plan is None:
                continue
            waiting = {replica, primary}
            deadline = time.monotonic() + 45
            while waiting:
                for role in list(waiting):
                    if role.crashed(plan):  # restarted plain, so the other side progresses
                        waiting.discard(role)
                        role.start(None, count)
                assert time.monotonic() < deadline, (
                    f"failpoint {plan} never fired in {[r.role for r in waiting]}"
                )
                time.sleep(0.02)
        if not primary.alive():
            primary.start(None, count)
        deadline = time.monotonic() + 60
        while True:
            done = _query(
                pdb,
                "SELECT (SELECT COUNT(DISTINCT record) FROM primary_replicated), "
                "(SELECT COUNT(*) FROM homing_messenger_out)",
            )
            left = _query(rdb, "SELECT COUNT(*) FROM homing_messenger_out")
            if done == (count, 0) and left == (0,):
                break
            assert time.monotonic() < deadline, (
                f"not drained in 60s: primary (replicated, unacked) {done}, replica unacked {left}"
            )
            time.sleep(0.05)
    finally:
        replica.stop()
        primary.stop()
        pdb.close()
        rdb.close()
    records = _count(replica_url, "SELECT record, COUNT(*) FROM replica_records GROUP BY record")
    acks = _count(primary_url, "SELECT record, COUNT(*) FROM primary_replicated GROUP BY record")
    expected = {f"record-{i}" for i in range(count)}
    for rows in (records, acks):
        got = {str(r): int(n) for r, n in rows}
        lost = expected - set(got)
        duplicated = {r: n for r, n in got.items() if n > 1}
        unexpected = set(got) - expected
        assert (lost, duplicated, unexpected) == (set(), {}, set())
    return replica, primary


def _count(url: str, sql: str) -> list[tuple[object, ...]]:
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    try:
        with db.store.transaction() as tx:
            return tx.query(sql)
    finally:
        db.close()


def test_replication_example_two_processes(tmp_path: Path) -> None:
    """The seed's example without faults: records persisted once, replies counted once.
    (SQLite only: the kill -9 test below runs the same example on both backends.)"""

    class SQLiteFiles:
        def url(self, name: str) -> str:
            return f"sqlite:///{tmp_path / name}.db"

    replica, primary = _run(SQLiteFiles(), [None], 200)
    assert replica.fired == primary.fired == []


POINTS = [
    "messenger.after_apply_before_ack=2*crash",
    "messenger.after_seen_update=3*crash",
    "messenger.after_ack_sent=2*crash",
]


def test_kill9_at_failpoints_and_at_random(stores) -> None:  # type: ignore[no-untyped-def]
    """Both sides die at each messenger failpoint in turn, and are also SIGKILLed from
    outside at every phase change (wherever they are); after the restarts:
    lost = 0, duplicated = 0, unexpected = 0 on both sides, nothing left unacknowledged."""
    replica, primary = _run(stores, list(POINTS), 60)
    # every planned crash fired (a test whose faults never happen proves nothing)
    assert replica.fired == POINTS and primary.fired == POINTS
    assert primary.outside_kills >= 2 and replica.outside_kills >= 2


def test_kill9_while_clocks_step_back(stores) -> None:  # type: ignore[no-untyped-def]
    """Both sides are SIGKILLed at every phase change and restarted each time with a wall
    clock 5 s earlier than before (an NTP step back): epochs come from the receivers, so
    lost = 0, duplicated = 0 on both sides all the same."""
    replica, primary = _run(stores, [None, None, None, None], 60, clock_back=True)
    assert primary.outside_kills >= 3 and replica.outside_kills >= 3
    assert primary.starts >= 4 and replica.starts >= 5


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
