"""The store seam itself (``Store`` / ``Tx``), run on both backends: what every part of
homing relies on when it opens a transaction, so that a new backend, or a change to one,
is caught here rather than in a face's chaos test."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import homing
from homing.errors import StoreUnavailable
from homing.ids import uuid7
from homing.store import open_store
from homing.store.postgres import _Replanner
from homing.store.protocol import Capabilities, Store
from tests.conftest import StoreFactory
from tests.store.conftest import rows


def put(tx, k: str, v: int) -> None:  # type: ignore[no-untyped-def]
    tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", (k, v))


def test_the_store_says_what_it_is(store: Store) -> None:
    assert isinstance(store, Store)
    assert isinstance(store.capabilities, Capabilities)
    assert store.dialect in ("sqlite", "postgres")
    with store.transaction() as tx:
        assert tx.store is store and tx.dialect == store.dialect and tx.sql.name == store.dialect


def test_a_transaction_commits_or_rolls_back_as_a_whole(store: Store) -> None:
    with store.transaction() as tx:
        put(tx, "a", 1)
        put(tx, "b", 2)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        put(tx, "c", 3)
        raise RuntimeError("boom")
    assert rows(store) == {"a": 1, "b": 2}


def test_inner_calls_join_the_open_transaction(store: Store) -> None:
    assert store.in_transaction() is None
    with pytest.raises(RuntimeError), store.transaction() as outer:
        assert store.in_transaction() is outer
        with store.transaction() as inner, store.statement() as stmt:
            assert inner is outer and stmt is outer
            put(inner, "x", 1)
        raise RuntimeError("the outer block fails: the inner write goes too")
    assert store.in_transaction() is None
    assert rows(store) == {}


def test_a_statement_commits_by_itself(store: Store) -> None:
    with store.statement() as tx:
        put(tx, "s", 1)
    assert rows(store) == {"s": 1}


def test_a_read_needs_no_transaction_and_joins_an_open_one(store: Store) -> None:
    """``read()``: on PostgreSQL the query runs in autocommit (one round trip, no BEGIN and
    COMMIT around it); on SQLite in a read transaction; inside an open transaction it is
    that transaction (it sees the transaction's own uncommitted rows)."""
    with store.statement() as tx:
        put(tx, "r", 1)
    with store.read() as tx:
        assert tx.query("SELECT v FROM contract_t WHERE k = ?", ("r",)) == [(1,)]
        if store.dialect == "postgres":
            assert tx.connection.autocommit
            assert tx.connection.info.transaction_status.name == "IDLE"
    with store.transaction() as outer:
        put(outer, "uncommitted", 2)
        with store.read() as tx:
            assert tx is outer
            assert tx.query("SELECT v FROM contract_t WHERE k = ?", ("uncommitted",)) == [(2,)]


def test_after_commit_callbacks_run_once_after_the_commit_and_never_after_a_rollback(
    store: Store,
) -> None:
    seen: list[str] = []
    with store.transaction() as tx:
        put(tx, "a", 1)
        tx.call_after_commit(lambda: seen.append(f"committed {rows(store)}"))
        assert seen == []
    assert seen == ["committed {'a': 1}"]
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.call_after_commit(lambda: seen.append("rolled back"))
        raise RuntimeError("no")
    with store.statement() as tx:
        tx.call_after_commit(lambda: seen.append("statement"))
    assert seen == ["committed {'a': 1}", "statement"]


def test_savepoints_undo_only_their_own_work_and_their_callbacks(store: Store) -> None:
    seen: list[str] = []
    with store.transaction() as tx:
        put(tx, "kept", 1)
        tx.call_after_commit(lambda: seen.append("outer"))
        with pytest.raises(ValueError), tx.savepoint():
            put(tx, "undone", 2)
            tx.call_after_commit(lambda: seen.append("undone"))
            raise ValueError("this unit fails")
        with tx.savepoint():
            put(tx, "released", 3)
            tx.call_after_commit(lambda: seen.append("released"))
            with pytest.raises(KeyError), tx.savepoint():  # nested
                put(tx, "inner", 4)
                tx.call_after_commit(lambda: seen.append("inner"))
                raise KeyError("inner fails")
        put(tx, "after", 5)  # the transaction is still usable, on PostgreSQL too
    assert rows(store) == {"kept": 1, "released": 3, "after": 5}
    assert seen == ["outer", "released"]


def test_a_failed_statement_inside_a_savepoint_leaves_the_transaction_usable(
    store: Store,
) -> None:
    with store.transaction() as tx:
        put(tx, "a", 1)
        with pytest.raises(Exception), tx.savepoint():  # noqa: B017 - the driver's own error
            put(tx, "a", 2)  # primary key violation
        put(tx, "b", 2)
    assert rows(store) == {"a": 1, "b": 2}


class _Counting:
    """Wraps a DB-API connection; counts the SAVEPOINT / RELEASE / ROLLBACK TO it runs."""

    def __init__(self, conn: Any, seen: list[str]) -> None:
        self._conn, self._seen = conn, seen

    def cursor(self) -> Any:
        cur, seen = self._conn.cursor(), self._seen

        class _Cursor:
            def execute(self, sql: str, params: Any = ()) -> Any:
                word = sql.split()[0].upper()
                if word in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
                    seen.append(" ".join(sql.split()[:2]).upper())
                return cur.execute(sql, params)

            def __getattr__(self, name: str) -> Any:
                return getattr(cur, name)

        return _Cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_a_savepoint_costs_nothing_until_a_statement_runs_in_it(store: Store) -> None:
    """The receiver runs every message's handler in a savepoint: one that runs no
    statement sets none; one that ends well is left to the commit to release."""
    seen: list[str] = []
    with store.transaction() as tx:
        tx._connection = _Counting(tx._connection, seen)
        with tx.savepoint():
            pass
        with pytest.raises(ValueError), tx.savepoint():
            raise ValueError("nothing ran: nothing to undo")
        assert seen == []
        with tx.savepoint():
            put(tx, "a", 1)
        assert seen == ["SAVEPOINT HOMING_SP_3"]  # not released: the commit does
        with tx.savepoint():
            with tx.savepoint():  # nested, ended well: released, its outer block may fail
                put(tx, "b", 2)
        assert seen[1:] == ["SAVEPOINT HOMING_SP_4", "SAVEPOINT HOMING_SP_5", "RELEASE SAVEPOINT"]
        with pytest.raises(KeyError), tx.savepoint():
            put(tx, "c", 3)
            raise KeyError("undone")
        assert seen[4:] == ["SAVEPOINT HOMING_SP_6", "ROLLBACK TO", "RELEASE SAVEPOINT"]
        with pytest.raises(KeyError), tx.savepoint():
            assert tx.connection is not None  # a caller's own statements: the savepoint is set
            raise KeyError("undone")
        assert seen[7:] == ["SAVEPOINT HOMING_SP_7", "ROLLBACK TO", "RELEASE SAVEPOINT"]
    assert rows(store) == {"a": 1, "b": 2}


def test_many_savepoints_in_one_transaction_are_released_in_groups(store: Store) -> None:
    """Savepoints left set pile up in the server; every 32nd ends them all at once."""
    seen: list[str] = []
    with store.transaction() as tx:
        tx._connection = _Counting(tx._connection, seen)
        for i in range(100):
            with tx.savepoint():
                put(tx, f"k{i}", i)
            if i % 10 == 3:  # a failing one among them undoes only itself
                with pytest.raises(ValueError), tx.savepoint():
                    put(tx, f"x{i}", i)
                    raise ValueError
        outer_fail = pytest.raises(RuntimeError)
        with outer_fail, tx.savepoint():  # a kept one inside a failing block: undone too
            put(tx, "outer", 1)
            with tx.savepoint():
                put(tx, "inner", 2)
            raise RuntimeError
    assert rows(store) == {f"k{i}": i for i in range(100)}
    assert seen.count("RELEASE SAVEPOINT") == 3 + 10 + 2  # groups, failed ones, inner+outer


def test_placeholders_and_percent_signs_travel_safely(store: Store) -> None:
    hostile = "50% off'; DROP TABLE contract_t; --"
    with store.transaction() as tx:
        put(tx, hostile, 1)
        clause, params = tx.sql.in_list("k", [hostile, "nope"])
        found = tx.query(f"SELECT k FROM contract_t WHERE {clause} AND k LIKE '%off%'", params)
    assert found == [(hostile,)]


def test_concurrent_writers_lose_no_update(store_url: str, store: Store) -> None:
    """Read-modify-write in transactions from two threads with stores of their own (two
    processes' worth of connections): every increment lands."""
    with store.transaction() as tx:
        put(tx, "n", 0)
    lock = tx.sql.lock_rows
    other = open_store(store_url)

    def bump(s: Store) -> None:
        for _ in range(50):
            with s.transaction() as t:
                (v,) = t.query_one(f"SELECT v FROM contract_t WHERE k = ?{lock}", ("n",)) or (0,)
                t.execute("UPDATE contract_t SET v = ? WHERE k = ?", (v + 1, "n"))

    threads = [threading.Thread(target=bump, args=(s,)) for s in (store, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    other.close()
    assert rows(store) == {"n": 100}


def test_wakeup_reaches_another_store_or_polls(stores: StoreFactory) -> None:
    url = stores.url("wake")
    a, b = open_store(url), open_store(url)
    try:
        waiter = a.wakeup("contract_chan", min_poll=0.01, max_poll=0.05)
        started = time.monotonic()
        if a.capabilities.notifications:
            assert waiter.wait(0.05) is False  # nothing announced yet
            threading.Timer(0.2, lambda: _announce(b)).start()
            assert waiter.wait(10) is True
            assert time.monotonic() - started < 5
        else:
            waiter.wait(10)  # a poll step, not the whole timeout
            assert time.monotonic() - started < 1
        threading.Timer(0.1, waiter.interrupt).start()
        t0 = time.monotonic()
        waiter.wait(5)
        assert time.monotonic() - t0 < 2.5  # interrupt wakes it early
    finally:
        a.close()
        b.close()


def _announce(store: Store) -> None:
    with store.transaction() as tx:
        store.notify(tx, "contract_chan")


def _registered_keys(store: Any, channel: str) -> set[str | None]:
    if store.capabilities.notifications:
        return set(store._listeners[store.notify_channel(channel)]._keys)
    return {w.key for w in store._wake.local._waiters.get(channel, ())}


def _announce_key(store: Store, channel: str, key: str) -> None:
    with store.transaction() as tx:
        store.notify(tx, channel, key)


def test_a_keyed_wakeup_wakes_for_its_key_and_for_all_only(stores: StoreFactory) -> None:
    """``wakeup(key=...)``: an announcement for another key does not wake it, one for its
    key or for all does, and one made after it was made but before its wait is not
    missed. On PostgreSQL from another connection (NOTIFY's payload); on SQLite from
    another handle of the same file in this process (no notifications between
    processes: those waiters poll). The long poll step makes a SQLite poll return
    False, so True means woken."""
    url = stores.url("keys")
    a, b = open_store(url), open_store(url)
    chan = "contract_keys"
    try:
        wa = a.wakeup(chan, min_poll=30, max_poll=30, key="A")
        wb = a.wakeup(chan, min_poll=30, max_poll=30, key="B")
        _announce_key(b, chan, "A")
        started = time.monotonic()
        assert wa.wait(30) is True
        assert time.monotonic() - started < 10
        assert wb.wait(0.5) is False  # A's announcement is not B's
        _announce_key(b, chan, "")  # for all
        assert wa.wait(30) is True and wb.wait(30) is True
        wc = a.wakeup(chan, min_poll=30, max_poll=30, key="C")
        _announce_key(b, chan, "C")  # before C's first wait: kept for it
        time.sleep(0.3)  # PostgreSQL: the notification has arrived before the wait
        assert wc.wait(30) is True
        assert _registered_keys(a, chan) == {"A", "B", "C"}
        for w in (wa, wb, wc):
            w.close()
            w.close()  # twice is harmless
        assert _registered_keys(a, chan) == set()  # nothing kept for keys nobody waits on
        _announce_key(b, chan, "A")  # nobody waits for it any more: dropped
    finally:
        a.close()
        b.close()


_WAITER = """
import sys, time
from homing.store import open_store
store = open_store(sys.argv[1])
w = store.wakeup("contract_procs", min_poll=30, max_poll=30, key="mine")
print("ready", flush=True)
t0 = time.monotonic()
woke = w.wait(30)
print(woke, round(time.monotonic() - t0, 3), flush=True)
w.close()
store.close()
"""


def test_an_announcement_wakes_a_waiter_in_another_process(stores: StoreFactory) -> None:
    """Another process's waiter is woken by a commit's announcement, well before its poll
    step: NOTIFY on PostgreSQL, a datagram to its socket on SQLite (``sqlite_wake``). An
    announcement for another key does not wake it."""
    url = stores.url("procs")
    store = open_store(url)
    store.migrate()
    child = subprocess.Popen(
        [sys.executable, "-c", _WAITER, url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the child is in its wait
        _announce_key(store, "contract_procs", "theirs")  # not its key
        time.sleep(0.5)
        assert child.poll() is None  # still waiting
        _announce_key(store, "contract_procs", "mine")
        woke, seconds = child.stdout.readline().split()
        assert woke == "True"
        assert float(seconds) < 10  # its poll step is 30 s
        assert child.wait(30) == 0
    finally:
        child.kill()
        store.close()


@pytest.mark.parametrize("backend", ["postgres"])  # the backend with notifications
def test_a_notification_is_sent_only_on_commit(stores: StoreFactory) -> None:
    url = stores.url("wake")
    a, b = open_store(url), open_store(url)
    try:
        assert a.capabilities.notifications
        waiter = a.wakeup("contract_chan")
        with pytest.raises(RuntimeError), b.transaction() as tx:
            b.notify(tx, "contract_chan")
            raise RuntimeError("rolled back: nobody may be woken")
        assert waiter.wait(0.5) is False
    finally:
        a.close()
        b.close()


def test_a_closed_store_refuses_work_clearly(store_url: str) -> None:
    s = open_store(store_url)
    s.close()
    with pytest.raises(StoreUnavailable, match="closed"), s.transaction() as tx:
        tx.query("SELECT 1")


def test_migrations_apply_once(store: Store) -> None:
    assert store.migrate() == []


@pytest.mark.parametrize("backend", ["postgres"])  # libpq options are PostgreSQL's
def test_libpq_options_in_the_url_reach_the_server(store_url: str) -> None:
    """A space in ``options`` must travel as %20: libpq does not decode '+' as a space."""
    s = open_store(store_url + "&options=-c%20statement_timeout%3D4321")
    try:
        with s.transaction() as tx:
            assert tx.query_one("SHOW statement_timeout") == ("4321ms",)
    finally:
        s.close()


def _seq_rows_read(tx: Any) -> int:
    """Rows this database's sequential scans of homing_jobs have read (flushed stats)."""
    tx.query("SELECT pg_stat_clear_snapshot()")
    row = tx.query_one(
        "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 'homing_jobs'::regclass"
    )
    return int(row[0]) if row else 0


@pytest.mark.parametrize("backend", ["postgres"])  # prepared statements are PostgreSQL's
def test_plans_made_on_an_empty_table_do_not_outlive_its_growth(store_url: str) -> None:
    """A worker that starts on a new store must not keep the plans made for an empty table
    (sequential scans of every job) once the table has grown: grabs stay index reads."""
    db = homing.connect(store_url, pool_size=1)
    try:
        for _ in range(12):  # prepared on the 5th run, a generic plan soon after
            db.grab_many(["contract_t"], lock_for=30, limit=8)
        db.insert_many([("contract_filler", {"i": i}) for i in range(5000)])
        time.sleep(_Replanner.FIRST_STEP + 0.2)
        for _ in range(12):  # re-prepared with the table as it is now
            db.grab_many(["contract_t"], lock_for=30, limit=8)
        with db.store.transaction() as tx:
            tx.query("SELECT pg_stat_force_next_flush()")
        with db.store.transaction() as tx:
            before = _seq_rows_read(tx)
            tx.query("SELECT pg_stat_force_next_flush()")
        for _ in range(20):
            db.grab_many(["contract_t"], lock_for=30, limit=8)
        with db.store.transaction() as tx:
            tx.query("SELECT pg_stat_force_next_flush()")
        with db.store.transaction() as tx:
            read = _seq_rows_read(tx) - before
        assert read < 5000, f"20 grabs read {read} rows by sequential scans of homing_jobs"
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_replanning_never_leaves_psycopg_with_statements_the_server_dropped(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statements dropped on every checkout, prepared again in between, batched too: every
    call still finds its statement (a repeated DEALLOCATE ALL went unseen by psycopg's cache,
    and the next call failed with 'prepared statement "_pg3_0" does not exist')."""
    monkeypatch.setattr(_Replanner, "FIRST_STEP", 0.0)
    monkeypatch.setattr(_Replanner, "MAX_STEP", 0.0)
    db = homing.connect(store_url, pool_size=1)
    try:
        for i in range(30):
            for _ in range(7):  # prepared from the 5th run on
                db.grab_many(["contract_r"], lock_for=5, limit=3)
            db.insert_many([("contract_r", {"i": i}) for _ in range(3)])
            db.complete_many(db.grab_many(["contract_r"], lock_for=5, limit=10))
            db.insert("contract_r", {"i": i})
            for job in db.grab_many(["contract_r"], lock_for=5, limit=1):
                db.complete(job)
        assert db.stats()[0]["done"] == 120
    finally:
        db.close()


def _pages_read(db: homing.Database, counter: str, name: str) -> int:
    """Pages read so far (from shared buffers or disk) of relation ``name``, by the
    statement ``counter`` (its ``?`` is the relation), stats flushed."""
    with db.store.transaction() as tx:
        tx.query("SELECT pg_stat_force_next_flush()")
    with db.store.transaction() as tx:
        tx.query("SELECT pg_stat_clear_snapshot()")
        row = tx.query_one(counter, (name,))
    return int(row[0]) if row else 0


def _index_pages_read(db: homing.Database, index: str) -> int:
    return _pages_read(
        db,
        "SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes "
        "WHERE indexrelid = ?::regclass",
        index,
    )


@pytest.mark.parametrize("backend", ["postgres"])  # MVCC: dead index entries are PostgreSQL's
def test_completions_do_not_read_the_index_of_running_jobs(store_url: str) -> None:
    """homing_jobs_leases keeps an entry for every job that ran since the last VACUUM. A
    completion finds its job by id; with statistics that say few jobs run, PostgreSQL read
    that whole index instead (every page of it per call, after 5,000 jobs)."""
    db = homing.connect(store_url, pool_size=1)
    try:
        with db.store.transaction() as tx:  # no VACUUM or ANALYZE behind the test's back
            tx.execute("ALTER TABLE homing_jobs SET (autovacuum_enabled = false)")
        db.insert_many([("contract_l", {"i": i}) for i in range(20)])
        db.complete_many(db.grab_many(["contract_l"], lock_for=60, limit=20))
        with db.store.transaction() as tx:
            tx.execute("ANALYZE homing_jobs")  # statistics: no job runs
        for _ in range(50):
            db.insert_many([("contract_l", {"i": i}) for i in range(100)])
            db.complete_many(db.grab_many(["contract_l"], lock_for=60, limit=100))
        db.insert_many([("contract_l", {"i": i}) for i in range(120)])
        jobs = db.grab_many(["contract_l"], lock_for=60, limit=120)
        before = _index_pages_read(db, "homing_jobs_leases")
        db.complete_many(jobs[:100])  # the job API's batch
        for job in jobs[100:110]:
            db.complete(job)  # one job
        for job in jobs[110:]:
            assert db.complete_each([job]) == []  # the worker's completion
        read = _index_pages_read(db, "homing_jobs_leases") - before
        assert read < 3, f"21 completions read {read} pages of the running-jobs index"
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["postgres"])  # MVCC: dead index entries are PostgreSQL's
def test_grabs_that_fill_their_limit_do_not_walk_finished_leases(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search for expired leases starts from a mark (ExpiryMarks) so that it does not
    walk the entries finished jobs left in homing_jobs_leases. A grab that took as many
    jobs as it asked for kept no mark, so in a batched cycle (insert 100, grab 100,
    complete 100) every grab walked them all from the start. Measured on the statement the
    next grab sends (EXPLAIN, rolled back): the grabs run on the lease sessions, whose
    statistics reach pg_statio only a second or more later."""
    from homing.store import holders_queries as hq
    from homing.store import jobs_queries as q

    # no periodic full search (every 10 s of real time) may fall on the grab measured
    monkeypatch.setattr(q.ExpiryMarks, "full_every", 3600.0)
    clock = homing.ManualClock(start=1_800_000_000.0)
    db = homing.connect(store_url, pool_size=1, clock=clock)
    try:
        with db.store.transaction() as tx:  # no VACUUM behind the test's back
            tx.execute("ALTER TABLE homing_jobs SET (autovacuum_enabled = false)")
        for _ in range(150):  # a batch every 10 s, each leased for 60 s and completed
            db.insert_many([("contract_m", {"i": i}) for i in range(50)])
            jobs = db.grab_many(["contract_m"], lock_for=60, limit=50)
            assert len(jobs) == 50  # each grab fills its limit
            db.complete_many(jobs)
            clock.advance(10)
        db.insert_many([("contract_m", {"i": i}) for i in range(50)])
        with db.store.transaction() as tx:
            holder = hq.register_holder(tx, "h", 1, "w", now=db.clock.now())
            capture = _Capture(tx)
            lease = q.Lease(uuid7(), db.clock.now() + 60, holder)
            q.grab_jobs(
                capture, ["contract_m"], now=db.clock.now(), lease=lease, limit=50, where=None
            )  # type: ignore[arg-type]
            ((sql, params),) = capture.statements
            tx.execute("SAVEPOINT explain")
            (plan,) = tx.query_one("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)  # type: ignore[misc]
            tx.execute("ROLLBACK TO SAVEPOINT explain")
        read = _index_blocks(plan[0]["Plan"], "homing_jobs_leases")
        # The statement's index scan: its index pages and the table pages of the entries it
        # has not seen dead yet. From the mark, one batch's entries: 9-11 pages after 30,
        # 80 or 150 batches; from the start, all of them: 16, 27, 46 pages.
        assert read <= 20, f"a grab read {read} pages of the running-jobs index"
    finally:
        db.close()


class _Capture:
    """Records the statements of a grab instead of running them (for EXPLAIN)."""

    def __init__(self, tx: Any) -> None:
        self.real, self.sql, self.store, self.dialect = tx, tx.sql, tx.store, tx.dialect
        self.statements: list[tuple[str, list[Any]]] = []

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        self.statements.append((sql, list(params)))
        return []


def _index_blocks(node: dict[str, Any], index: str) -> int:
    own = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    here = own if node.get("Index Name") == index else 0
    return here + sum(_index_blocks(c, index) for c in node.get("Plans", []))


def _table_pages_read(db: homing.Database) -> int:
    return _pages_read(
        db,
        "SELECT heap_blks_hit + heap_blks_read FROM pg_statio_user_tables "
        "WHERE relid = ?::regclass",
        "homing_jobs",
    )


def _stage(db: homing.Database, batch: str, n: int, priority: int = 0) -> None:
    from homing.store import jobs_queries as q
    from homing.store import spark_queries as sq

    now = db.clock.now()
    with db.store.transaction() as tx:
        q.open_batch(tx, batch, now=now)
        jobs = [
            sq.StagedJob(homing.uuid7(), "contract_s", json.dumps({"i": i}), priority, now, None)
            for i in range(n)
        ]
        sq.stage_jobs(tx, batch, jobs, now=now)
        q.commit_batch(tx, batch, now=now)


def test_a_grab_from_committed_batches_reads_only_what_it_takes(store_url: str) -> None:
    """Jobs of committed staged batches are grabbed in priority order across batches, a
    few at a time; on PostgreSQL a grab reads a few pages whatever the batches hold (it
    read and sorted every job of every committed batch: 4 s a grab with 2,000,000)."""
    db = homing.connect(store_url)
    try:
        _stage(db, "big", 20000)
        _stage(db, "urgent", 3, priority=5)
        first = db.grab_many(["contract_s"], lock_for=60, limit=5)
        assert [j.priority for j in first] == [5, 5, 5, 0, 0]
        if db.store.dialect == "postgres":
            before = _table_pages_read(db)
            for _ in range(5):
                got = db.grab_many(["contract_s"], lock_for=60, limit=10)
                assert len(got) == 10
            read = _table_pages_read(db) - before
            # ~75 a grab (the 10 rows it leases, their new versions, index entries of jobs
            # grabbed before); reading the batch was 4,000 and more
            assert read < 600, f"5 grabs of 10 staged jobs read {read} pages of homing_jobs"
        taken = len(first) + (50 if db.store.dialect == "postgres" else 0)
        rest = db.grab_many(["contract_s"], lock_for=60, limit=30000)
        assert len(rest) == 20003 - taken  # every staged job once
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["postgres"])  # SQLite has no autovacuum to miss
def test_a_server_without_autovacuum_is_named_in_a_warning(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """This machine's PostgreSQL runs with autovacuum = off: the store says so when asked
    (a worker asks at start), and says nothing when it is on."""
    db = homing.connect(store_url)
    try:
        with db.store.transaction(write=False) as tx:
            row = tx.query_one("SELECT current_setting('autovacuum')")
        caplog.clear()
        with caplog.at_level("WARNING", logger="homing.store"):
            off = db.store.warn_if_never_vacuumed()
        assert off == (row is not None and row[0] == "off")
        assert ("autovacuum is off" in caplog.text) == off
    finally:
        db.close()
