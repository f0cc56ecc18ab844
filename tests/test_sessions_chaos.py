"""Exactly-once request/reply under SIGKILL of the client and of the server (seed 004).

Clients and servers run as real child processes (test_sessions_chaos_programs.py) with
``HOMING_FAILPOINTS`` set; a failpoint ``crash`` is SIGKILL of the own process. The
server's handler and the client's reply handler each write one row to ``effects`` (no
unique constraint, so duplicates stay countable) in the transaction that dequeues. After
the drain: every item processed exactly once and its reply taken exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import homing
from homing.sessions import Server, Sessions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_sessions_chaos_programs import QUEUE, client_program, process

PROGRAMS = Path(__file__).resolve().with_name("test_sessions_chaos_programs.py")
KILLED = -signal.SIGKILL


# -- the parent side ---------------------------------------------------------------------
class Child:
    def __init__(self, tmp: Path, role: str, args: list[str], faults: str = "") -> None:
        env = {**os.environ, "HOMING_FAILPOINTS": faults}
        self.log = tmp / f"{role}-{time.monotonic_ns()}.log"
        self.faults = faults
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(PROGRAMS), role, *args], env=env, stdout=out, stderr=out
            )

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"child timed out; log:\n{self.log.read_text()}")

    def reap(self) -> None:
        """Give a child a few seconds to stop on its own, then kill it."""
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def check(self, rc: int) -> int:
        if rc not in (0, KILLED):
            pytest.fail(f"child exited {rc} (faults {self.faults!r}); log:\n{self.log.read_text()}")
        return rc


def make_tables(db: homing.Database) -> None:
    with db.store.transaction() as tx:
        tx.execute(
            "CREATE TABLE effects (client_id TEXT, item INTEGER, request_id TEXT, kind TEXT)"
        )
        tx.execute(
            "CREATE TABLE decisions (client_id TEXT, incarnation INTEGER, request_id TEXT, "
            "state TEXT, is_last INTEGER)"
        )


def server_thread(db: homing.Database) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    server = Server(db, QUEUE, process)
    thread = threading.Thread(
        target=server.run, args=(stop,), kwargs={"idle_wait": 0.05}, daemon=True
    )
    thread.start()
    return thread, stop


def wait_for_decision(db: homing.Database, alive: Any, *, incarnation: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive():
        with db.store.transaction(write=False) as tx:
            row = tx.query_one(
                "SELECT COUNT(*) FROM decisions WHERE incarnation = ?", (incarnation,)
            )
        if row and row[0]:
            return
        time.sleep(0.01)


def check_exactly_once(db: homing.Database, client_id: str, n_items: int) -> dict[str, int]:
    """The checker: lost = 0, duplicated = 0, unexpected = 0, for both effects."""
    with db.store.transaction() as tx:
        effects = tx.query("SELECT item, request_id, kind FROM effects")
        states = Counter(
            r[0]
            for r in tx.query(
                "SELECT state FROM homing_session_requests WHERE client_id = ?", (client_id,)
            )
        )
    expected = set(range(n_items))
    report: dict[str, int] = {}
    for kind in ("processed", "reply"):
        counts = Counter(int(i) for i, _, k in effects if k == kind)
        report[f"{kind}_lost"] = len(expected - set(counts))
        report[f"{kind}_duplicated"] = sum(1 for c in counts.values() if c > 1)
        report[f"{kind}_unexpected"] = len(set(counts) - expected)
    # every effect of an item belongs to one request id: resubmissions never made a second one
    ids_per_item = Counter(int(i) for i, _ in {(i, r) for i, r, _ in effects})
    report["items_with_two_requests"] = sum(1 for c in ids_per_item.values() if c > 1)
    assert report == dict.fromkeys(report, 0), report
    assert states == {"taken": n_items}, states
    return report


# -- one crash per state -----------------------------------------------------------------
CASES = {
    # state: (client failpoint, server running while the client crashes?)
    "A": ("sessions.after_request_prepared=1*crash", False),
    "B": ("sessions.after_request_enqueued=1*crash", False),
    "C": ("sessions.client_before_reply_commit=1*crash", True),
    "D": ("sessions.after_reply_dequeued=1*crash", True),
}


@pytest.mark.parametrize("state", sorted(CASES))
def test_crash_recover_continue_per_state(
    open_db: Any, store_url: str, tmp_path: Path, state: str
) -> None:
    db = open_db()
    make_tables(db)
    faults, serve_meanwhile = CASES[state]
    server = server_thread(db) if serve_meanwhile else None
    client = Child(tmp_path, "client", [store_url, "c1", "1", "0"], faults)
    assert client.check(client.wait()) == KILLED
    if server is not None:
        server[1].set()
        server[0].join()

    rec = Sessions(db).attach("c1").recover()
    assert rec.last is not None and rec.last.state == state, rec
    assert rec.last.action == {"A": "resubmit_or_drop", "B": "wait", "C": "process_reply"}.get(
        state, "continue"
    )

    # restart: a fresh client (a new connection and Sessions object) recovers and goes on
    result: list[int] = []
    again = threading.Thread(
        target=lambda: result.append(client_program(store_url, "c1", 1, 1)), daemon=True
    )
    again.start()
    wait_for_decision(db, again.is_alive, incarnation=1)  # serve only once it has recovered
    thread, stop = server_thread(db)
    again.join(60)
    stop.set()
    thread.join()
    assert result == [0]
    with db.store.transaction() as tx:
        seen = tx.query("SELECT state, is_last FROM decisions WHERE incarnation = 1")
    assert seen == [(state, 1)]  # the restarted client reached the same decision
    check_exactly_once(db, "c1", 1)


def test_server_killed_mid_processing(open_db: Any, store_url: str, tmp_path: Path) -> None:
    """SIGKILL inside Transaction 2: the handler's write rolls back, the request stays B."""
    db = open_db()  # the system clock, like the child processes
    make_tables(db)
    session = Sessions(db).open("c1")
    session.submit(QUEUE, {"item": 0})
    stop_file = tmp_path / "stop"
    server = Child(
        tmp_path, "server", [store_url, str(stop_file)], "sessions.server_before_commit=1*crash"
    )
    assert server.check(server.wait()) == KILLED
    rec = session.recover()
    assert rec.last is not None and rec.last.state == "B"
    thread, stop = server_thread(db)  # a healthy server takes over
    deadline = time.monotonic() + 30
    while (rec := session.recover()).last.state == "B" and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    stop.set()
    thread.join()
    assert rec.last is not None and rec.last.state == "C"
    assert client_program(store_url, "c1", 1, 1) == 0  # the client processes the reply
    check_exactly_once(db, "c1", 1)


# -- 50 outstanding requests, random crashes of client and servers ----------------------
SUBMIT_POINTS = ("sessions.after_request_prepared", "sessions.after_request_enqueued")
REPLY_POINTS = ("sessions.client_before_reply_commit", "sessions.after_reply_dequeued")


def test_fifty_outstanding_with_random_crashes(
    open_db: Any, store_url: str, tmp_path: Path
) -> None:
    db = open_db()
    n_items = 50
    seed = int(os.environ.get("HOMING_CHAOS_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    make_tables(db)
    stop_file = tmp_path / "stop"
    # Each client incarnation crashes at one point on its nth hit (n <= 6): first the two
    # submit-side points in random order (50 submits to go, so both fire), then the two
    # reply-side points (at most 12 + 6 replies taken by then, so both fire). Then no faults.
    client_faults = [
        f"{point}={rng.randint(1, 6)}*crash"
        for pair in (SUBMIT_POINTS, REPLY_POINTS)
        for point in rng.sample(pair, 2)
    ]
    server_faults = [f"sessions.server_before_commit={rng.randint(1, 8)}*crash" for _ in range(3)]
    crashes = Counter[str]()
    incarnation = 0

    def start_client() -> Child:
        faults = client_faults.pop(0) if client_faults else ""
        return Child(tmp_path, "client", [store_url, "c1", str(n_items), str(incarnation)], faults)

    def start_server() -> Child:
        faults = server_faults.pop(0) if server_faults else ""
        return Child(tmp_path, "server", [store_url, str(stop_file)], faults)

    t0 = time.monotonic()
    timeline: list[str] = []
    client = start_client()
    servers = [start_server(), start_server()]
    try:
        deadline = time.monotonic() + 70
        while True:
            assert time.monotonic() < deadline, f"no progress (seed {seed}); {crashes}"
            rc = client.proc.poll()
            if rc is not None:
                if client.check(rc) == 0:
                    break
                crashes["client"] += 1
                timeline.append(f"{time.monotonic() - t0:.2f} client died ({client.faults})")
                incarnation += 1
                client = start_client()
            for k, server in enumerate(servers):
                rc = server.proc.poll()
                if rc is not None:
                    server.check(rc)
                    crashes["server"] += 1
                    timeline.append(f"{time.monotonic() - t0:.2f} server died ({server.faults})")
                    servers[k] = start_server()
            time.sleep(0.02)
        stop_file.touch()
        for server in servers:
            assert server.check(server.wait()) == 0
    finally:  # never leave a child behind, even when the test fails
        stop_file.touch()
        for child in (client, *servers):
            child.reap()

    report = check_exactly_once(db, "c1", n_items)
    with db.store.transaction() as tx:
        seen = Counter(str(r[0]) for r in tx.query("SELECT state FROM decisions"))
    timeline.append(f"{time.monotonic() - t0:.2f} drained")
    print("\n".join(timeline))
    print(f"seed {seed}: crashes {dict(crashes)}, recovered states {dict(seen)}, {report}")
    assert crashes["client"] == 4 and crashes["server"] >= 1, (seed, crashes)
    # after_request_prepared leaves A, client_before_reply_commit C, after_reply_dequeued D
    assert {"A", "C", "D"} <= set(seen), (seed, seen)


# -- the same on a sharded store (issue 18): a session lives on its client's shard ---------
def test_sharded_sessions_with_random_crashes(tmp_path: Path) -> None:
    """Two shards, a client whose session lives on each, servers that serve both shards
    (``ShardedServer``); clients and servers SIGKILLed at the protocol's failpoints. Each
    client's items are processed once and their replies taken once, on its own shard."""
    from homing.sessions.sharded import ShardedSessions
    from tests.conftest import StoreFactory

    factory = StoreFactory("postgres", tmp_path)
    urls = [factory.url("sess0"), factory.url("sess1")]
    db = homing.connect(urls)
    assert isinstance(db, homing.ShardedDatabase)
    clients = [next(f"c{i}" for i in range(100) if db.shard_for_key(f"c{i}") == s) for s in (0, 1)]
    for shard in db.shards:
        make_tables(shard)
    url = ",".join(urls)
    n_items = 20
    rng = random.Random(int(os.environ.get("HOMING_CHAOS_SEED", "18")))
    faults = {
        c: [
            f"{p}={rng.randint(1, 5)}*crash" for pair in (SUBMIT_POINTS, REPLY_POINTS) for p in pair
        ]
        for c in clients
    }
    server_faults = [f"sessions.server_before_commit={rng.randint(1, 8)}*crash" for _ in range(2)]
    stop_file = tmp_path / "stop"
    crashes: Counter[str] = Counter()
    incarnations = dict.fromkeys(clients, 0)

    def start_client(c: str) -> Child:
        fault = faults[c].pop(0) if faults[c] else ""
        return Child(tmp_path, "client", [url, c, str(n_items), str(incarnations[c])], fault)

    def start_server() -> Child:
        fault = server_faults.pop(0) if server_faults else ""
        return Child(tmp_path, "server", [url, str(stop_file)], fault)

    running = {c: start_client(c) for c in clients}
    servers = [start_server(), start_server()]
    try:
        deadline = time.monotonic() + 90
        while running:
            assert time.monotonic() < deadline, f"no progress; {crashes}"
            for c, child in list(running.items()):
                rc = child.proc.poll()
                if rc is None:
                    continue
                if child.check(rc) == 0:
                    del running[c]
                    continue
                crashes[c] += 1
                incarnations[c] += 1
                running[c] = start_client(c)
            for k, server in enumerate(servers):
                rc = server.proc.poll()
                if rc is not None:
                    server.check(rc)
                    crashes["server"] += 1
                    servers[k] = start_server()
            time.sleep(0.02)
        stop_file.touch()
        for server in servers:
            assert server.check(server.wait()) == 0
    finally:
        stop_file.touch()
        for child in (*running.values(), *servers):
            child.reap()
    try:
        sessions = ShardedSessions(db)
        for shard, c in enumerate(clients):
            home = sessions.database_for(c)
            assert home is db.shards[shard]
            print(c, check_exactly_once(home, c, n_items))
            other = db.shards[1 - shard]
            with other.store.transaction(write=False) as tx:  # nothing of c on the other shard
                row = tx.query_one(
                    "SELECT COUNT(*) FROM homing_session_requests WHERE client_id = ?", (c,)
                )
            assert row == (0,)
        assert all(crashes[c] == 4 for c in clients), crashes
        print(f"crashes {dict(crashes)}")
    finally:
        db.close()
        factory.cleanup()
