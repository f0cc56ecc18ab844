"""Poison requests, leases and fencing of sessions (issue 14), on both backends.

Chaos: a server process that SIGKILLs itself every time it sees one request does not stop
the others (each served exactly once) and the poison request is dead after
``max_attempts`` takes; two processes that open one client's session fight, and exactly
one acts. In-process: a crash after the take counts an attempt; a hung handler's request
is taken over when its lease runs out, its late commit refused, and it blocks nobody's
submit meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import homing
from homing.sessions import Request, Server, SessionFenced, Sessions
from tests.test_sessions_chaos import KILLED, Child, make_tables
from tests.test_sessions_chaos_programs import FENCED, QUEUE

MAX_ATTEMPTS = 3


def wait_until(what: str, check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- chaos: the poison request -------------------------------------------------------------
def test_a_request_that_kills_its_server_dies_and_others_are_served_once(
    open_db: Any, store_url: str, tmp_path: Path
) -> None:
    db = open_db()
    make_tables(db)
    session = Sessions(db).open("c1")
    poison = session.submit(QUEUE, {"item": -1, "poison": True})  # first in line
    n_items = 20
    ids = {session.submit(QUEUE, {"item": i}).id: i for i in range(n_items)}
    stop_file = tmp_path / "stop"
    args = [store_url, str(stop_file), "1.0", str(MAX_ATTEMPTS)]
    kills = 0

    def all_answered() -> bool:
        with db.store.transaction(write=False) as tx:
            row = tx.query_one(
                "SELECT COUNT(*) FROM homing_session_requests WHERE state = 'queued'"
            )
        return row is not None and row[0] == 0

    server = Child(tmp_path, "poison-server", args)
    try:
        deadline = time.monotonic() + 90
        while not all_answered():
            assert time.monotonic() < deadline, f"not drained after {kills} kills"
            rc = server.proc.poll()
            if rc is not None:
                assert server.check(rc) == KILLED
                kills += 1
                server = Child(tmp_path, "poison-server", args)  # the supervisor restarts it
            time.sleep(0.02)
        stop_file.touch()
        assert server.check(server.wait()) == 0
    finally:
        stop_file.touch()
        server.reap()

    assert kills == MAX_ATTEMPTS  # each take of the poison request cost one server
    record = Sessions(db).lookup(poison.id)
    assert record.attempts == MAX_ATTEMPTS and record.state == "replied"
    assert record.error is not None and record.error.startswith("dead: taken 3 times")
    # the client sees the dead reply in recovery: state C, with the error
    rec = Sessions(db).open("c1").recover()
    dead = [s for s in rec.requests if s.request_id == poison.id]
    assert len(dead) == 1 and dead[0].state == "C"
    assert dead[0].reply is not None and not dead[0].reply.ok
    with db.store.transaction() as tx:
        effects = tx.query("SELECT item, request_id FROM effects WHERE kind = 'processed'")
    counts = Counter(str(rid) for _, rid in effects)
    assert set(counts) == set(ids)  # lost 0, and nothing of the poison request
    assert set(counts.values()) == {1}  # duplicated 0


# -- chaos: two processes fight over one session -------------------------------------------
def test_two_processes_fight_over_one_session_and_exactly_one_acts(
    open_db: Any, store_url: str, tmp_path: Path
) -> None:
    db = open_db()
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE acts (name TEXT, epoch INTEGER, request_id TEXT)")
    go, stop = tmp_path / "go", tmp_path / "stop"
    fighters = {
        name: Child(tmp_path, "fighter", [store_url, "c1", name, str(go), str(stop)])
        for name in ("left", "right")
    }
    try:
        go.touch()  # both open the session at about the same time, then act

        def acts() -> dict[str, list[tuple[int, int]]]:
            with db.store.transaction(write=False) as tx:
                rows = tx.query(
                    "SELECT a.name, a.epoch, r.seq FROM acts a "
                    "JOIN homing_session_requests r ON r.id = a.request_id ORDER BY r.seq"
                )
            out: dict[str, list[tuple[int, int]]] = {"left": [], "right": []}
            for name, epoch, seq in rows:
                out[str(name)].append((int(epoch), int(seq)))
            return out

        def one_fenced_and_the_other_acting() -> bool:
            fenced = [n for n, f in fighters.items() if f.proc.poll() is not None]
            return len(fenced) == 1 and len(acts()[_other(fenced[0])]) >= 20

        wait_until("one fighter fenced, the other acting", one_fenced_and_the_other_acting)
        stop.touch()
        codes = {name: f.wait() for name, f in fighters.items()}
    finally:
        stop.touch()
        for f in fighters.values():
            f.reap()

    assert sorted(codes.values()) == [0, FENCED], codes
    loser = next(n for n, rc in codes.items() if rc == FENCED)
    winner = _other(loser)
    assert codes[winner] == 0, codes
    log = next(f for n, f in fighters.items() if n == loser).log.read_text()
    assert "opened again by another process" in log  # the fenced one got a clear error
    done = acts()
    winner_epochs = {e for e, _ in done[winner]}
    loser_epochs = {e for e, _ in done[loser]}
    assert len(winner_epochs) == 1 and loser_epochs <= {min(winner_epochs) - 1}
    # once the winner acted, the loser never did again: its acts all come first
    if done[loser]:
        assert max(s for _, s in done[loser]) < min(s for _, s in done[winner])
    with db.store.transaction(write=False) as tx:
        n_requests = tx.query_one("SELECT COUNT(*) FROM homing_session_requests")
    assert n_requests is not None
    assert n_requests[0] == len(done[winner]) + len(done[loser])  # every act with its request


def _other(name: str) -> str:
    return "right" if name == "left" else "left"


# -- in process: attempts counted at the take, leases, hung handlers -----------------------
def test_a_crash_after_the_take_counts_and_the_request_dies_after_max_attempts(
    db: homing.Database, clock: homing.ManualClock
) -> None:
    session = Sessions(db).open("c")
    request = session.submit("q", {"n": 1})
    ran: list[str] = []
    server = Server(db, "q", lambda r, t: ran.append(r.id), max_attempts=2, lease=5)
    for attempt in (1, 2):
        assert server._take() is not None  # then the server "dies": no answer, no extension
        assert Sessions(db).lookup(request.id).attempts == attempt
        assert server.process_one() is False  # leased: not due for anyone
        clock.advance(5.1)  # the lease runs out
    assert server.process_one() is True
    assert ran == []  # the third take is over max_attempts: a dead reply, not a third run
    reply = session.take_reply()
    assert reply is not None and reply.error is not None and reply.error.startswith("dead:")
    assert "lease ran out" in reply.error


def test_a_slow_handler_keeps_its_lease_and_one_thread_keeps_every_lease(
    db: homing.Database, clock: homing.ManualClock
) -> None:
    """A handler that runs past its lease keeps the request (a server polling meanwhile
    does not take it over), and the leases of successive requests are kept by one thread
    of the server, not a thread a request."""
    session = Sessions(db).open("c")
    slow_request = session.submit("q", {"n": 0})

    taken = threading.Event()

    def slow(r: Request, txn: homing.Transaction) -> Any:
        if r.id == slow_request.id:
            taken.set()  # the rival starts polling only once this server holds the request
            # 0.8 s of the store's clock against a 0.3 s lease, in steps small enough that
            # only a keeper missing three beats in a row (every 0.1 s) lets the lease lapse
            for _ in range(8):
                clock.advance(0.1)
                time.sleep(0.15)
        return "done"

    server = Server(db, "q", slow, lease=0.3)
    rival = Server(db, "q", lambda r, t: "taken over")
    stop = threading.Event()

    def poll_once_taken() -> None:
        if taken.wait(30):
            rival.run(stop, idle_wait=0.01)

    polling = threading.Thread(target=poll_once_taken)
    polling.start()
    try:
        assert server.process_one() is True
    finally:
        stop.set()
        polling.join(30)
    record = Sessions(db).lookup(slow_request.id)
    assert (record.attempts, record.reply) == (1, "done")
    keepers = []
    for n in range(1, 5):
        session.submit("q", {"n": n})
        assert server.process_one() is True
        keepers.append(server._leases._thread)
    assert keepers[0] is not None and keepers[0].is_alive()
    assert all(k is keepers[0] for k in keepers)


def test_a_server_that_finds_nothing_to_take_makes_no_write_transaction(
    db: homing.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing due, or (PostgreSQL) the due request locked by another server: the take
    finds nothing, and learns from it (PostgreSQL: the same statement; SQLite: a read)
    whether a dead request is owed its reply, instead of a durable transaction (three
    round trips) after every empty take."""
    writes: list[int] = []
    store_type = type(db.store)
    transaction = store_type.transaction

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("write", True):
            writes.append(1)
        return transaction(self, *args, **kwargs)

    server = Server(db, "q", lambda r, t: "answer")
    monkeypatch.setattr(store_type, "transaction", counting)
    assert server.process_one() is False and writes == []
    monkeypatch.setattr(store_type, "transaction", transaction)
    request = Sessions(db).open("c").submit("q", {"n": 1})
    if db.store.capabilities.skip_locked:  # another server's take holds the row meanwhile
        locked, release = threading.Event(), threading.Event()

        def hold() -> None:
            with db.store.transaction() as tx:
                tx.execute("SELECT id FROM homing_session_requests FOR UPDATE")
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert locked.wait(30)
            monkeypatch.setattr(store_type, "transaction", counting)
            assert server.process_one() is False and writes == []
        finally:
            release.set()
            holder.join(30)
        monkeypatch.setattr(store_type, "transaction", transaction)
    assert server.process_one() is True  # and once it is free, it is taken
    assert Sessions(db).lookup(request.id).reply == "answer"


def test_a_hung_handler_blocks_no_submit_and_its_lease_passes_to_another_server(
    db: homing.Database, clock: homing.ManualClock
) -> None:
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (request_id TEXT, by TEXT)")
    session = Sessions(db).open("c")
    request = session.submit("q", {"n": 1})
    release = threading.Event()
    entered = threading.Event()

    def hang(r: Request, txn: homing.Transaction) -> Any:
        entered.set()
        release.wait(60)
        txn.tx.execute("INSERT INTO effects VALUES (?, 'hung')", (r.id,))
        return "late"

    hung = Server(db, "q", hang, lease=1, handler_timeout=0.2)
    thread = threading.Thread(target=hung.process_one, daemon=True)
    thread.start()
    try:
        assert entered.wait(30)
        # another client's submit is not blocked by the hung handler (no write lock held)
        other = Sessions(db).open("other").submit("q2", {"n": 2})
        assert not release.is_set() and Sessions(db).lookup(other.id).state == "queued"

        def took_over(r: Request, txn: homing.Transaction) -> Any:
            txn.tx.execute("INSERT INTO effects VALUES (?, 'second')", (r.id,))
            return "answer"

        second = Server(db, "q", took_over)
        # the lease keeper stops extending after handler_timeout; then the lease runs out
        wait_until("the lease keeper to let go", lambda: not hung._leases.holds(request.id))
        clock.advance(1.5)
        assert second.process_one() is True
    finally:
        release.set()
        thread.join(30)
    assert not thread.is_alive()
    record = Sessions(db).lookup(request.id)
    assert record.attempts == 2 and record.reply == "answer"  # the late commit was refused
    with db.store.transaction(write=False) as tx:
        effects = tx.query("SELECT request_id, by FROM effects")
    assert effects == [(request.id, "second")]


def test_a_fenced_handle_gets_a_clear_error_and_changes_nothing(db: homing.Database) -> None:
    first = Sessions(db).open("c")
    first.submit("q", 1)
    second = Sessions(db).open("c")
    assert second.epoch == (first.epoch or 0) + 1
    for act in (
        lambda: first.submit("q", 2),
        lambda: first.prepare("q", 3),
        lambda: first.take_reply(),
        lambda: first.recover(),
        lambda: first.confirm([]),
        lambda: first.close(),
    ):
        with pytest.raises(SessionFenced, match="opened again by another process"):
            act()
    assert len(second.info().unfinished) == 1
    assert Sessions(db).attach("c").epoch == second.epoch  # attach joins, does not fence
    second.submit("q", 4)


def test_a_handler_whose_sqlite_snapshot_went_stale_runs_again_and_commits_once(
    db: homing.Database,
) -> None:
    """SQLite: the handler's deferred transaction read, then another writer committed, so
    its write is refused (SQLITE_BUSY_SNAPSHOT); the server runs it again in the same lease.
    PostgreSQL has no such refusal: the handler runs once."""
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (request_id TEXT)")
    request = Sessions(db).open("c").submit("q", {"n": 1})
    runs: list[int] = []

    def handler(r: Request, txn: homing.Transaction) -> Any:
        runs.append(1)
        txn.tx.query("SELECT COUNT(*) FROM effects")  # the read snapshot starts here
        if len(runs) == 1:  # another client writes meanwhile
            other = threading.Thread(target=lambda: Sessions(db).open("o").submit("q2", 2))
            other.start()
            other.join(30)
        txn.tx.execute("INSERT INTO effects VALUES (?)", (r.id,))
        return "ok"

    assert Server(db, "q", handler).process_one()
    assert len(runs) == (2 if db.dialect == "sqlite" else 1)
    record = Sessions(db).lookup(request.id)
    assert (record.state, record.reply, record.attempts) == ("replied", "ok", 1)
    with db.store.transaction(write=False) as tx:
        assert tx.query("SELECT request_id FROM effects") == [(request.id,)]
