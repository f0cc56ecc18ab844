"""Shards that behave like one store: placement, transactions, adding shards, dead shards.

Sharding is a PostgreSQL feature; fresh schemas of the test server stand for databases
(``?schema=``), a closed port (127.0.0.1:1) for a database that is down from the start,
and a TCP proxy that the test cuts for one that goes away while in use.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import homing
from homing import CrossShardWrite, StoreUnavailable, StoreUnreachable
from homing.sharding import owner
from tests.conftest import StoreFactory, postgres_url
from tests.tcp_proxy import TcpProxy

DEAD = "postgresql://postgres@127.0.0.1:1/test?schema=gone"
APPS = str(Path(__file__).with_name("test_worker_apps.py"))
EFFECTS_DDL = "CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER)"


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[StoreFactory]:
    f = StoreFactory("postgres", tmp_path)
    yield f
    f.cleanup()


def sharded(urls: list[str], **kw: object) -> homing.ShardedDatabase:
    db = homing.connect(urls, **kw)  # type: ignore[arg-type]
    assert isinstance(db, homing.ShardedDatabase)
    return db


def wait_for(cond, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


# -- placement ------------------------------------------------------------------------------
def test_adding_a_shard_moves_keys_only_to_the_new_shard() -> None:
    keys = [f"order-{i}" for i in range(3000)]
    moved = 0
    for k in keys:
        before, after = owner(k, 2), owner(k, 3)
        assert after in (before, 2)  # never from one old shard to another
        moved += after != before
    assert 0.25 < moved / len(keys) < 0.42  # about 1/3 move to the third shard
    assert Counter(owner(k, 3) for k in keys).keys() == {0, 1, 2}


def test_a_unique_key_is_one_job_inside_and_outside_transactions(factory: StoreFactory) -> None:
    with sharded([factory.url("a"), factory.url("b")]) as db:
        for i in range(20):
            key = f"k{i}"
            plain = db.insert("t", i, unique_key=key)
            assert plain.split(":")[0] == str(db.shard_for_key(key))
            with db.transaction(unique_key=key) as tx:
                assert tx.insert("t", i, unique_key=key) == plain
                assert tx.shard == db.shard_for_key(key)
            with db.transaction(shard_key=key) as tx:
                assert tx.insert_many([homing.JobSpec("t", i, unique_key=key)]) == [plain]
        # the other order: first inside a transaction, then plain
        with db.transaction(unique_key="late") as tx:
            first = tx.insert("t", None, unique_key="late")
        assert db.insert("t", None, unique_key="late") == first
        assert sum(r["ready"] for r in db.stats()) == 21


def test_writes_for_another_shard_are_refused_in_a_transaction(factory: StoreFactory) -> None:
    with sharded([factory.url("a"), factory.url("b")]) as db:
        key = "order-1"
        other = 1 - db.shard_for_key(key)
        with pytest.raises(CrossShardWrite, match=rf"transaction\(unique_key='{key}'\)"):
            with db.transaction(shard=other) as tx:
                tx.insert("t", "mine", unique_key=None)
                tx.insert("t", "keyed", unique_key=key)
        assert db.stats() == []  # the transaction rolled back: nothing anywhere
        h = db.insert("t", None, unique_key=key)
        job = db.grab("t", lock_for=30)
        assert job is not None and job.handle == h
        with pytest.raises(CrossShardWrite, match=f"lives on shard {1 - other}"):
            with db.transaction(shard=other) as tx:
                tx.complete(job)
        with pytest.raises(CrossShardWrite):  # a replace's children stay on the parent's shard
            db.replace(job, [homing.JobSpec("c", None, unique_key=_key_on(other))])
        assert db.details(h).state == "running"
        with pytest.raises(homing.InvalidArgument, match="at most one"):
            db.transaction(shard=0, unique_key=key)


def test_transactional_enqueue_and_complete_with_own_writes(factory: StoreFactory) -> None:
    """test_jobs' transaction tests, on two shards: your rows, the keyed job and the
    completion commit or roll back together on the key's shard."""
    with sharded([factory.url("a"), factory.url("b")]) as db:
        for shard in range(2):
            with db.transaction(shard=shard) as tx:
                tx.connection.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        for key in ("order-1", "order-2", "order-3"):
            with db.transaction(unique_key=key) as tx:
                tx.connection.execute("INSERT INTO orders (id) VALUES (%s)", (key,))
                tx.insert("receipt", {"order": key}, unique_key=key)
        with pytest.raises(RuntimeError), db.transaction(unique_key="order-9") as tx:
            tx.connection.execute("INSERT INTO orders (id) VALUES ('order-9')")
            lost = tx.insert("receipt", {"order": 9}, unique_key="order-9")
            raise RuntimeError("the caller fails: both writes must vanish")
        with pytest.raises(homing.JobNotFound):
            db.details(lost)
        rows = {}
        for shard in range(2):
            with db.transaction(shard=shard) as tx:
                rows[shard] = {r[0] for r in tx.connection.execute("SELECT id FROM orders")}
        assert rows == {
            s: {k for k in ("order-1", "order-2", "order-3") if db.shard_for_key(k) == s}
            for s in range(2)
        }
        job = db.grab("receipt", lock_for=30)
        assert job is not None
        mine = int(job.handle.split(":")[0])
        with pytest.raises(ZeroDivisionError), db.transaction(shard=mine) as tx:
            tx.complete(job)
            1 / 0  # noqa: B018
        assert db.details(job.handle).state == "running"
        with db.transaction(shard=mine) as tx:
            tx.complete(job)
            assert db.details(job.handle).state == "done"  # a call inside joins the transaction


def _key_on(shard: int, n: int = 2) -> str:
    return next(k for i in range(1000) if owner(k := f"x{i}", n) == shard)


def test_adding_a_shard_with_previous_shards_keeps_every_key(factory: StoreFactory) -> None:
    urls = [factory.url("a"), factory.url("b"), factory.url("c")]
    keys = [f"order-{i}" for i in range(200)]
    with sharded(urls[:2]) as two:
        first = two.insert_many([homing.JobSpec("t", None, unique_key=k) for k in keys])
        first += [two.insert("t", None, unique_key=f"single-{i}") for i in range(50)]
    keys += [f"single-{i}" for i in range(50)]
    moved = sum(owner(k, 3) == 2 for k in keys)
    assert moved > 30
    with sharded(urls, previous_shards=2) as three:
        assert three.misplaced_keys() == {
            0: Counter(owner(k, 2) for k in keys if owner(k, 3) == 2)[0],
            1: Counter(owner(k, 2) for k in keys if owner(k, 3) == 2)[1],
            2: 0,
        }
        again = [three.insert("t", None, unique_key=k) for k in keys[:100]]
        again += three.insert_many([homing.JobSpec("t", None, unique_key=k) for k in keys[100:]])
        assert again == first  # every key still names its first job
        for k, h in zip(keys[:40], first[:40], strict=True):
            with three.transaction(unique_key=k) as tx:
                assert tx.insert("t", None, unique_key=k) == h
        assert sum(r["ready"] for r in three.stats()) == len(keys)
        # the old jobs finish and are collected: then the placement is settled
        while jobs := three.grab_many("t", lock_for=30, limit=100):
            three.complete_many(jobs)
        three.gc(older_than=0)
        assert three.misplaced_keys() == {0: 0, 1: 0, 2: 0}
    with sharded(urls) as settled:  # previous_shards dropped
        fresh = settled.insert("t", None, unique_key=keys[0])
        assert fresh.split(":")[0] == str(owner(keys[0], 3))


def test_without_the_migration_moved_keys_would_repeat(factory: StoreFactory) -> None:
    """Why docs/jobs.md's procedure matters: the moved keys make second jobs without it."""
    urls = [factory.url("a"), factory.url("b"), factory.url("c")]
    keys = [f"k{i}" for i in range(60)]
    with sharded(urls[:2]) as two:
        first = [two.insert("t", None, unique_key=k) for k in keys]
    with sharded(urls) as three:
        again = [three.insert("t", None, unique_key=k) for k in keys]
    differ = {k for k, a, b in zip(keys, first, again, strict=True) if a != b}
    assert differ == {k for k in keys if owner(k, 3) == 2}


def test_previous_shards_is_checked(factory: StoreFactory) -> None:
    with pytest.raises(homing.ConfigurationError, match="previous_shards must be between 1 and 1"):
        homing.connect([factory.url("a"), factory.url("b")], previous_shards=2)


# -- a shard that is down -------------------------------------------------------------------
def test_a_shard_down_at_start_is_skipped_quickly(factory: StoreFactory) -> None:
    t0 = time.monotonic()
    db = sharded([factory.url("live"), DEAD])
    try:
        assert time.monotonic() - t0 < 30  # the short connect timeout, not minutes
        assert [h.up for h in db.health] == [True, False]
        handles = [db.insert("t", i) for i in range(30)]
        assert {h.split(":")[0] for h in handles} == {"0"}  # every insert went to a live shard
        assert db.insert_many([("t", i) for i in range(4)])[0].startswith("0:")
        t1 = time.monotonic()
        grabbed = [db.grab("t", lock_for=30) for _ in range(6)]
        assert time.monotonic() - t1 < 10  # was 120 s: 60 s pool waits on the dead shard
        assert all(j is not None and j.handle.startswith("0:") for j in grabbed)
        # what needs the dead shard fails at once, with a homing error that says so
        t2 = time.monotonic()
        with pytest.raises(StoreUnreachable, match="shard 1 .* is down"):
            db.insert("t", None, unique_key=_key_on(1))
        with pytest.raises(StoreUnavailable):
            db.details("1:0190d3b4-0000-7000-8000-000000000000")
        with pytest.raises(StoreUnreachable):
            with db.transaction(shard=1):
                pass
        assert time.monotonic() - t2 < 5
        assert sum(r["ready"] for r in db.stats()) == 28  # the live shard's jobs
    finally:
        db.close()


def test_all_shards_down_is_a_clear_error() -> None:
    with pytest.raises(StoreUnreachable, match="no shard of the sharded store"):
        homing.connect([DEAD, DEAD.replace("gone", "gone2")])


def test_the_worker_serves_the_live_shard_while_another_is_down(factory: StoreFactory) -> None:
    live = factory.url("live")
    with sharded([live, DEAD]) as db:
        db.insert_many([("effect", {"i": i}) for i in range(30)])
        with db.transaction(shard=0) as tx:
            tx.connection.execute(EFFECTS_DDL)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "homing",
            "--db",
            f"{live},{DEAD}",
            "worker",
            "--app",
            f"{APPS}:app",
            "-c",
            "2",
            "--until-idle",
        ],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    one = homing.connect(live)
    try:
        with one.transaction() as tx:
            rows = tx.connection.execute("SELECT job_id FROM effects").fetchall()
        assert len(rows) == 30 and len({r[0] for r in rows}) == 30  # each job once
        assert {r["type"]: r["done"] for r in one.stats()} == {"effect": 30}
    finally:
        one.close()


def test_a_shard_that_goes_away_is_skipped_and_comes_back(factory: StoreFactory) -> None:
    base = postgres_url()
    parts = urlsplit(base)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    via_proxy = factory.url("far").replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}")
    db = sharded([factory.url("near"), via_proxy])
    db._prober._every = 0.2
    try:
        handles = db.insert_many([("t", i) for i in range(22)])
        assert Counter(h.split(":")[0] for h in handles) == {"0": 11, "1": 11}
        proxy.cut()
        got = []
        for _ in range(4):  # whichever shard a grab starts at, the near one answers
            got += db.grab_many("t", lock_for=30, limit=2)
        assert len(got) == 8 and {j.handle.split(":")[0] for j in got} == {"0"}
        assert not db.health[1].up
        db.complete_many(got)  # nothing leased on the near shard was stranded
        assert all(db.details(j.handle).state == "done" for j in got)
        proxy.restore()
        wait_for(lambda: db.health[1].up)
        rest = []
        while batch := db.grab_many("t", lock_for=30, limit=5):
            rest += batch
        assert Counter(j.handle.split(":")[0] for j in rest) == {"0": 3, "1": 11}
        db.complete_many(rest)
    finally:
        db.close()
        proxy.close()


# -- reliable HTTP and sessions place their rows by the same rule ------------------------------
def test_sharded_sender_keeps_each_message_on_its_id_shard(factory: StoreFactory) -> None:
    from homing.http.sharded import ShardedReceiver, ShardedSender

    with sharded([factory.url("a"), factory.url("b")]) as db:
        sender = ShardedSender(db, dispatch=False)
        pending = [sender.enqueue("send", "http://127.0.0.1:9/x", {"i": i}) for i in range(20)]
        assert {owner(p.id, 2) for p in pending} == {0, 1}  # spread over the shards
        for p in pending:
            assert p.sender is sender.senders[owner(p.id, 2)]
            assert sender.poll(p.id) == (False, None)  # found on its shard, not yet delivered
        for shard in range(2):
            with db.transaction(shard=shard) as tx:
                inside = sender.enqueue("send", "http://127.0.0.1:9/x", {"in": shard}, tx=tx)
            assert owner(inside.id, 2) == shard  # the transaction's shard owns the id
        one = db.shards[0]
        with pytest.raises(CrossShardWrite), one.transaction() as raw:
            sender.enqueue("send", "http://127.0.0.1:9/x", {}, tx=raw)
        receiver = ShardedReceiver(db, dispatch=False)
        for p in pending:  # a request naming the message reaches the shard of its id
            scope = {"path": "/x", "headers": [(b"homing-message-id", p.id.encode())]}
            assert receiver.shard_of(scope) == owner(p.id, 2)
            reply = {"path": "/_homing/reply", "headers": [(b"homing-in-reply-to", p.id.encode())]}
            assert receiver.shard_of(reply) == owner(p.id, 2)
            assert receiver.shard_of({"path": f"/_homing/inbox/{p.id}"}) == owner(p.id, 2)
        sender.close()


def test_a_session_lives_on_its_clients_shard(factory: StoreFactory) -> None:
    from homing.sessions.sharded import ShardedServer, ShardedSessions

    with sharded([factory.url("a"), factory.url("b")]) as db:
        sessions = ShardedSessions(db)
        clients = [f"client-{i}" for i in range(8)]
        assert {db.shard_for_key(c) for c in clients} == {0, 1}
        sent = {c: sessions.open(c).submit("q", {"c": c}).id for c in clients}
        server = ShardedServer(db, "q", lambda request, tx: {"echo": request.body["c"]})
        assert server.run(until_idle=True, idle_wait=0.01) == len(clients)
        for c in clients:
            session = sessions.attach(c)
            reply = session.take_reply(lambda r, tx: None, timeout=5)
            assert reply is not None and reply.body == {"echo": c}
            assert sessions.lookup(sent[c]).client_id == c
            assert sessions.info(c).client_id == c
            assert session.sessions.db is db.shards[db.shard_for_key(c)]
