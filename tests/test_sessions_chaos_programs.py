"""The programs that tests/test_sessions_chaos.py runs in child processes (no tests here).

Kept apart from the test module so that a child starts without importing pytest:
``python tests/test_sessions_chaos_programs.py client URL CLIENT_ID N_ITEMS INCARNATION``
or ``... server URL STOP_FILE`` or ``... poison-server URL STOP_FILE LEASE MAX_ATTEMPTS`` (a
server that SIGKILLs itself whenever it sees a request whose body has ``"poison": true``),
or ``... fighter URL CLIENT_ID NAME GO_FILE STOP_FILE`` (a client that opens the session and
acts until it is fenced). ``HOMING_FAILPOINTS`` in the environment sets the crashes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import homing
from homing.sessions import Reply, Request, Server, SessionFenced, Sessions
from homing.sessions.sharded import ShardedServer, ShardedSessions

QUEUE = "work"


def client_program(url: str, client_id: str, n_items: int, incarnation: int) -> int:
    """A client that recovers its session, acts on each state, then finishes its items."""
    db = homing.connect(url.split(","), migrate=False)  # the parent migrated the store
    if isinstance(db, homing.ShardedDatabase):  # the session and these tables: on one shard
        sharded = ShardedSessions(db, keep_replies=5)
        session, home = sharded.open(client_id), sharded.database_for(client_id)
    else:
        session, home = Sessions(db, keep_replies=5).open(client_id), db
    rec = session.recover()
    with home.store.transaction() as tx:
        for st in rec.requests:
            tx.execute(
                "INSERT INTO decisions (client_id, incarnation, request_id, state, is_last) "
                "VALUES (?, ?, ?, ?, ?)",
                (client_id, incarnation, st.request_id, st.state, int(st == rec.last)),
            )
        done = {
            int(r[0])
            for r in tx.query(
                "SELECT item FROM effects WHERE client_id = ? AND kind = 'reply'", (client_id,)
            )
        }
    known = set(done)
    for st in rec.requests:
        known.add(int(st.body["item"]))
        if st.state == "A":
            session.resubmit()  # never submitted: submit it now (B next)
    # D: this client's own store (effects) has a durable record of them; let the QM forget.
    session.confirm([st.request_id for st in rec.requests if st.state == "D"])

    def record(reply: Reply, txn: homing.Transaction) -> None:
        txn.tx.execute(
            "INSERT INTO effects (client_id, item, request_id, kind) VALUES (?, ?, ?, 'reply')",
            (client_id, reply.request["item"], reply.request_id),
        )

    pending = [i for i in range(n_items) if i not in known]
    unconfirmed: list[str] = []
    deadline = time.monotonic() + 60
    while len(done) < n_items:
        if time.monotonic() > deadline:
            print(f"client gave up: done {sorted(done)}", file=sys.stderr)
            return 2
        if pending:
            session.submit(QUEUE, {"item": pending.pop(0)})
        reply = session.take_reply(record, timeout=0 if pending else 0.05)
        if reply is not None:
            done.add(int(reply.request["item"]))
            unconfirmed.append(reply.request_id)
            if len(unconfirmed) >= 7:
                session.confirm(unconfirmed)
                unconfirmed.clear()
    db.close()
    return 0


def process(request: Request, txn: homing.Transaction) -> Any:
    txn.tx.execute(
        "INSERT INTO effects (client_id, item, request_id, kind) VALUES (?, ?, ?, 'processed')",
        (request.body.get("client"), request.body["item"], request.id),
    )
    return {"item": request.body["item"], "processed": True}


def server_program(url: str, stop_file: str) -> int:
    db = homing.connect(url.split(","), migrate=False)  # the parent migrated the store
    stop = threading.Event()

    def watch() -> None:
        while not os.path.exists(stop_file):
            time.sleep(0.02)
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    if isinstance(db, homing.ShardedDatabase):
        ShardedServer(db, QUEUE, process).run(stop, idle_wait=0.05)
    else:
        Server(db, QUEUE, process).run(stop, idle_wait=0.05)
    db.close()
    return 0


def _stop_event(stop_file: str) -> threading.Event:
    stop = threading.Event()

    def watch() -> None:
        while not os.path.exists(stop_file):
            time.sleep(0.02)
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop


def poison_server_program(url: str, stop_file: str, lease: float, max_attempts: int) -> int:
    """A server whose handler kills its own process (SIGKILL: no finally, no rollback
    message, like an OOM kill or a segfault) each time it sees the poison request."""

    def handle(request: Request, txn: homing.Transaction) -> Any:
        if request.body.get("poison"):
            os.kill(os.getpid(), signal.SIGKILL)
        return process(request, txn)

    db = homing.connect(url, migrate=False)
    assert isinstance(db, homing.Database)
    server = Server(db, QUEUE, handle, lease=lease, max_attempts=max_attempts, retry_in=0)
    server.run(_stop_event(stop_file), idle_wait=0.05)
    db.close()
    return 0


FENCED = 3


def fighter_program(url: str, client_id: str, name: str, go_file: str, stop_file: str) -> int:
    """Open the client's session, then submit requests (each also writes an ``acts`` row
    in its own transaction) until fenced (exit 3) or told to stop (exit 0)."""
    db = homing.connect(url, migrate=False)
    assert isinstance(db, homing.Database)
    while not os.path.exists(go_file):
        time.sleep(0.005)
    session = Sessions(db).open(client_id)
    n = 0
    while not os.path.exists(stop_file):
        try:
            with db.transaction() as txn:
                request = session.submit(QUEUE, {"item": n, "by": name}, remember=False)
                txn.tx.execute(
                    "INSERT INTO acts (name, epoch, request_id) VALUES (?, ?, ?)",
                    (name, session.epoch, request.id),
                )
        except SessionFenced as exc:
            print(f"{name} fenced after {n} acts: {exc}", file=sys.stderr)
            db.close()
            return FENCED
        n += 1
        time.sleep(0.002)
    db.close()
    return 0


if __name__ == "__main__":
    role, *argv = sys.argv[1:]
    if role == "client":
        sys.exit(client_program(argv[0], argv[1], int(argv[2]), int(argv[3])))
    if role == "poison-server":
        sys.exit(poison_server_program(argv[0], argv[1], float(argv[2]), int(argv[3])))
    if role == "fighter":
        sys.exit(fighter_program(*argv[:5]))
    sys.exit(server_program(argv[0], argv[1]))
