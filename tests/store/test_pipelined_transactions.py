"""Pipelined transactions (``Store.transaction(pipelined=True)``, ``Tx.defer``) on both
backends: the same outcome as an ordinary transaction, in fewer round trips on PostgreSQL.

The round trips are counted the way a user would notice them: through a proxy that
delays every packet (``bench/latency_proxy.py``), a round trip costs ~50 ms, so elapsed
time divided by it says how many there were."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import psycopg
import pytest
from bench.latency_proxy import LatencyProxy, round_trip_s

import homing
from homing.errors import StoreUnavailable
from homing.sessions import Server, Sessions
from homing.store import open_store, postgres
from homing.store.postgres import _Replanner
from homing.store.protocol import Store, Tx
from tests.store.conftest import rows

INTEGRITY = (psycopg.errors.UniqueViolation, sqlite3.IntegrityError)


def _one(cur: object) -> object:
    row = cur.fetchone()  # type: ignore[attr-defined]
    return None if row is None else row[0]


def _changed(cur: object) -> int:
    return int(cur.rowcount)  # type: ignore[attr-defined]


def test_deferred_results_arrive_and_the_writes_commit_together(store: Store) -> None:
    with store.transaction(pipelined=True) as tx:
        inserted = tx.defer("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("a", 1), _changed)
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("b", 2))
        total = tx.defer("SELECT sum(v) FROM contract_t", (), _one)
        missing = tx.defer("SELECT v FROM contract_t WHERE k = ?", ("zz",), _one)
        assert inserted.get() == 1
        assert total.get() == 3  # sees the writes sent before it, in order
        assert missing.get() is None
        assert tx.rowcount("UPDATE contract_t SET v = v + 10 WHERE k = ?", ("a",)) == 1
        assert tx.query_one("SELECT v FROM contract_t WHERE k = ?", ("a",)) == (11,)
    assert rows(store) == {"a": 11, "b": 2}


def test_a_failed_check_rolls_back_what_was_sent_after_the_checked_statement(
    store: Store,
) -> None:
    class CheckFailed(Exception):
        pass

    with pytest.raises(CheckFailed):
        with store.transaction(pipelined=True) as tx:
            count = tx.defer("SELECT count(*) FROM contract_t", (), _one)
            tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("late", 1))
            if count.get() == 0:
                raise CheckFailed()
    assert rows(store) == {}
    with store.transaction(pipelined=True) as tx:  # the connection is clean again
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("next", 1))
    assert rows(store) == {"next": 1}


@pytest.mark.parametrize("read_after", [True, False], ids=["at-the-next-read", "at-the-commit"])
def test_a_statement_error_is_raised_and_nothing_commits(store: Store, read_after: bool) -> None:
    """A failed statement's error comes with the next read, or with the COMMIT when no
    read follows it."""
    with store.transaction() as tx:
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("dup", 1))
    with pytest.raises(INTEGRITY):
        with store.transaction(pipelined=True) as tx:
            tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("new", 1))
            tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("dup", 2))
            if read_after:
                tx.defer("SELECT count(*) FROM contract_t", (), _one).get()
    assert rows(store) == {"dup": 1}
    assert store.in_transaction() is None


def test_without_pipeline_mode_a_pipelined_transaction_is_an_ordinary_one(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A psycopg on a libpq older than 14 has no pipeline mode: the same code still works."""
    monkeypatch.setattr(postgres, "PIPELINE_MODE", False)
    with store.transaction(pipelined=True) as tx:
        assert tx._pipe is None
        inserted = tx.defer("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("a", 1), _changed)
        assert inserted.get() == 1
        tx.end_pipeline()
    assert rows(store) == {"a": 1}


def test_after_end_pipeline_statements_wait_for_their_results(store: Store) -> None:
    with store.transaction(pipelined=True) as tx:
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("a", 1))
        tx.end_pipeline()
        cur = tx.execute("UPDATE contract_t SET v = 5 WHERE k = ?", ("a",))
        assert cur.rowcount == 1  # a handler's own statements behave as usual
        tx.connection.execute(tx._sql("INSERT INTO contract_t (k, v) VALUES (?, ?)"), ("b", 2))
    assert rows(store) == {"a": 5, "b": 2}


# -- round trips, PostgreSQL through a proxy that delays every packet ----------------------
DELAY_S = 0.025  # each way: a round trip of ~50 ms, far above the statements' own time


@pytest.fixture
def far(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, float]]:
    """The store's URL through the delaying proxy, and a round trip's time there (the
    tests that use it run on PostgreSQL only: SQLite runs in process, no round trips).

    The store's re-planning (``postgres._Replanner``: DEALLOCATE ALL at 0.25, 0.75, 1.75 s
    ... of a connection's life, then psycopg prepares each statement again at its 5th run,
    one round trip each outside a pipeline) is switched off here, and the tests warm up
    with five runs of what they time, so that the count is the path's own."""
    monkeypatch.setattr(_Replanner, "check", lambda self, conn: None)
    proxy = LatencyProxy.before(store_url, DELAY_S)
    proxy.start()
    url = proxy.url(store_url)
    yield url, round_trip_s(url)
    proxy.close()


def _five_statements(tx: Tx, k: str) -> None:
    count = tx.defer("SELECT count(*) FROM contract_t", (), _one)
    tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", (k, 1))
    changed = tx.defer("UPDATE contract_t SET v = v + 1 WHERE k = ?", (k,), _changed)
    tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", (k + "2", 1))
    value = tx.defer("SELECT v FROM contract_t WHERE k = ?", (k,), _one)
    assert count.get() is not None and changed.get() == 1 and value.get() == 2


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_pipelined_transaction_of_five_statements_takes_two_round_trips(
    store: Store, far: tuple[str, float]
) -> None:
    url, rtt = far
    remote = open_store(url)

    def round_trips(pipelined: bool, k: str, tries: int = 3) -> float:
        """The fewest round trips of ``tries`` (a thread of the proxy late now and then)."""
        best = float("inf")
        for n in range(tries):
            t0 = time.perf_counter()
            with remote.transaction(pipelined=pipelined) as tx:
                _five_statements(tx, f"{k}{n}")
            best = min(best, (time.perf_counter() - t0) / rtt)
        return best

    try:
        round_trips(False, "warm", tries=5)  # pool connections, prepared statements
        round_trips(True, "warm-p", tries=5)
        plain = round_trips(False, "plain")
        piped = round_trips(True, "piped")
    finally:
        remote.close()
    # BEGIN, five statements and COMMIT: seven round trips, or two (BEGIN to the first
    # read, then the COMMIT)
    assert plain >= 6.5, plain
    assert piped <= 2.6, piped
    assert rows(store)["piped0"] == 2


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_sessions_submit_and_take_are_two_round_trips_a_transaction(
    store_url: str, far: tuple[str, float]
) -> None:
    url, rtt = far
    homing.connect(store_url).close()  # the schema, migrated without the delay
    db = homing.connect(url, migrate=False, pool_size=4)
    submits: list[float] = []
    serves: list[float] = []
    takes: list[float] = []
    try:
        session = Sessions(db).open("far-client")
        server = Server(db, "far", lambda request, txn: request.body)
        for n in range(8):  # five to warm up (statements prepared at their 5th run), three timed
            t0 = time.perf_counter()
            request = session.submit("far", {"n": n})  # Transactions 0 and 1
            submit = (time.perf_counter() - t0) / rtt
            t0 = time.perf_counter()
            assert server.process_one()  # the take, then Transaction 2
            serve = (time.perf_counter() - t0) / rtt
            t0 = time.perf_counter()
            reply = session.take_reply(request_id=request.id, timeout=5)  # a read, then T3
            take = (time.perf_counter() - t0) / rtt
            assert reply is not None and reply.body == {"n": n}
            if n >= 5:
                submits.append(submit)
                serves.append(serve)
                takes.append(take)
        polls = []  # a server's look at an empty queue (idle, or after each request)
        for _ in range(3):
            t0 = time.perf_counter()
            assert not server.process_one()
            polls.append((time.perf_counter() - t0) / rtt)
    finally:
        db.close()
    # were 7 + 7, 1 + 4 and 1 + 7 round trips (a statement each, BEGIN and COMMIT apart);
    # the server's is the take, then the BEGIN with the reply's UPDATE (a handler that
    # runs no statement), then the announcement with the COMMIT; its empty poll was the
    # take and a read for a dead request, now one statement
    assert min(submits) <= 4.6, submits
    assert min(serves) <= 3.6, serves
    assert min(takes) <= 3.6, takes
    assert min(polls) <= 1.6, polls


def test_a_handed_over_transaction_runs_the_callers_statements_as_usual(store: Store) -> None:
    """Code given a pipelined transaction (a sessions handler) sees each statement's
    result and error at the statement, as in an ordinary one; homing's statements after
    the block are pipelined again only if that code ran none."""
    with store.transaction(pipelined=True) as tx:
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("a", 1))
        with tx.handed_over():
            conn = tx.connection  # leaves pipeline mode: what was sent is waited for
            assert tx._pipe is None
            cur = conn.cursor()
            cur.execute(tx._sql("UPDATE contract_t SET v = 7 WHERE k = ?"), ("a",))
            assert cur.rowcount == 1
            with pytest.raises(INTEGRITY), tx.savepoint():
                tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("a", 2))
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("b", 3))
    assert rows(store) == {"a": 7, "b": 3}
    with store.transaction(pipelined=True) as tx:
        with tx.handed_over():
            pass  # no statement: still pipelined after the block
        assert tx._pipe is not None or store.dialect == "sqlite" or not postgres.PIPELINE_MODE
        changed = tx.defer("UPDATE contract_t SET v = 8 WHERE k = ?", ("b",), _changed)
        assert changed.get() == 1
    assert rows(store) == {"a": 7, "b": 8}


def test_a_sessions_handler_catches_its_own_statement_errors(store_url: str) -> None:
    """The server's Transaction 2 is pipelined on PostgreSQL; a handler's statements
    still raise where they run, so a handler can catch one (in a savepoint) and answer."""
    db = homing.connect(store_url, pool_size=4)
    try:
        with db.store.transaction() as tx:
            tx.execute("CREATE TABLE handler_t (k TEXT PRIMARY KEY)")
            tx.execute("INSERT INTO handler_t (k) VALUES ('taken')")

        def handler(request: object, txn: homing.Transaction) -> str:
            try:
                with txn.tx.savepoint():
                    txn.tx.execute("INSERT INTO handler_t (k) VALUES (?)", ("taken",))
            except INTEGRITY:
                txn.tx.execute("INSERT INTO handler_t (k) VALUES (?)", ("instead",))
                return "caught"
            return "not raised"

        session = Sessions(db).open("catching-client")
        request = session.submit("catching", {})
        assert Server(db, "catching", handler).process_one()
        reply = session.take_reply(request_id=request.id, timeout=5)
        assert reply is not None and reply.body == "caught" and reply.error is None
        with db.store.transaction() as tx:
            assert sorted(r[0] for r in tx.query("SELECT k FROM handler_t")) == [
                "instead",
                "taken",
            ]
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_connection_lost_in_a_pipelined_transaction_is_store_unavailable(
    store: Store, store_url: str
) -> None:
    """The server ends the session between two round trips: the caller gets homing's
    error (the outcome unknown, nothing of it committed), and the store goes on."""
    with pytest.raises(StoreUnavailable):
        with store.transaction(pipelined=True) as tx:
            tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("lost", 1))
            pid = tx.defer("SELECT pg_backend_pid()", (), _one).get()
            with psycopg.connect(store_url.split("?")[0], autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            tx.defer("SELECT count(*) FROM contract_t", (), _one).get()
    assert rows(store) == {}
    with store.transaction(pipelined=True) as tx:
        tx.execute("INSERT INTO contract_t (k, v) VALUES (?, ?)", ("after", 1))
    assert rows(store) == {"after": 1}
