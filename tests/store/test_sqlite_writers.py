"""SQLite's one write lock between processes, with ``lock_wait=poll``: a writer waiting
for another process's transaction gets in within a few milliseconds of its commit, not
after one of SQLite's busy-handler sleeps (which grow to 25-100 ms a try). Two
``SQLiteStore`` objects on one file stand for two processes: each has its own in-process
writer queue."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from homing.errors import ConfigurationError
from homing.store.sqlite import BUSY_TIMEOUT_MS, SQLiteStore


def lateness(url: str) -> list[float]:
    """How long after the other 'process' committed a waiting writer got in (3 tries, the
    other holding the lock 0.24 s: SQLite's own handler sleeps 100 ms from 0.228 s)."""
    first, second = SQLiteStore(url), SQLiteStore(url)
    first.migrate()
    holding = threading.Event()
    released_at: list[float] = []

    def hold(seconds: float) -> None:
        with first.transaction() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            holding.set()
            time.sleep(seconds)
        released_at.append(time.monotonic())

    late = []
    for _ in range(3):
        holding.clear()
        released_at.clear()
        other = threading.Thread(target=hold, args=(0.24,))
        other.start()
        holding.wait(5)
        with second.transaction() as tx:
            got_in = time.monotonic()
            tx.execute("INSERT INTO t VALUES (1)")
        other.join()
        late.append(got_in - released_at[0])
    with second.transaction(write=False) as tx:
        assert tx.query("SELECT COUNT(*) FROM t") == [(3,)]
        # the poll's own busy timeout is put back for everything else
        assert tx.query("PRAGMA busy_timeout") == [(BUSY_TIMEOUT_MS,)]
    first.close()
    second.close()
    return late


def test_a_polling_writer_gets_in_soon_after_the_other_process_commits(tmp_path: Path) -> None:
    late = lateness(f"sqlite:///{tmp_path / 'w.db'}?lock_wait=poll")
    assert min(late) < 0.03, late


def test_the_default_waits_in_sqlites_busy_handler(tmp_path: Path) -> None:
    late = lateness(f"sqlite:///{tmp_path / 'w.db'}")
    assert max(late) > 0.03, late  # its 100 ms sleep: the lock sat idle meanwhile


def test_an_unknown_lock_wait_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="lock_wait must be sleep"):
        SQLiteStore(f"sqlite:///{tmp_path / 'w.db'}?lock_wait=spin")


def test_an_empty_grab_leaves_the_write_lock_to_others(tmp_path: Path) -> None:
    """A grab that finds nothing does not take the write lock (a read comes first): an
    idle poller on SQLite does not hold back the producer it waits for. While another
    'process' holds the lock, an empty grab returns at once; one that has a job to take
    waits for the lock, and gets the job."""
    import homing

    url = f"sqlite:///{tmp_path / 'probe.db'}"
    db = homing.connect(url)
    other = sqlite3.connect(tmp_path / "probe.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert db.grab_many("t", lock_for=5, limit=5) == []
        assert time.monotonic() - started < 0.5
    finally:
        other.execute("ROLLBACK")
    db.insert("t", {"n": 1})
    other.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.3, lambda: other.execute("ROLLBACK"))
    releaser.start()
    started = time.monotonic()
    jobs = db.grab_many("t", lock_for=5, limit=5)
    assert time.monotonic() - started >= 0.25  # it waited for the lock: a write was needed
    assert [j.args for j in jobs] == [{"n": 1}]
    releaser.join()
    db.close()
