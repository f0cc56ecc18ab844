"""SQLite backend: the embedded default. WAL, ``BEGIN IMMEDIATE`` for writes, FULL sync."""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from homing.clock import Clock, SystemClock
from homing.errors import ConfigurationError, StoreUnavailable
from homing.ids import job_uuid
from homing.store._common import TxSlot, parse_bool, split_url
from homing.store.protocol import Capabilities, Dialect, Tx, Wakeup
from homing.store.sqlite_sql import SqliteSql
from homing.store.sqlite_wake import store_wake
from homing.store.wakeup import PollingWakeup

BUSY_TIMEOUT_MS = 60_000


def parse_sqlite_url(url: str) -> tuple[Path, dict[str, str]]:
    """``sqlite:///rel.db`` is relative to the working directory, ``sqlite:////abs.db`` absolute."""
    scheme, rest, options = split_url(url)
    if scheme != "sqlite":
        raise ConfigurationError(f"not a SQLite URL: {url!r}")
    path = rest[len("sqlite:///") :] if rest.startswith("sqlite:///") else ""
    if not path:
        raise ConfigurationError(f"SQLite URL {url!r} has no file path; use sqlite:///homing.db")
    if path == ":memory:":
        raise ConfigurationError(
            "sqlite:///:memory: cannot be shared between homing's threads and processes; "
            "use a file, for example in a temporary directory"
        )
    return Path(path), options


def _job_uuid(text: str | None) -> str | None:
    return None if text is None else job_uuid(text)


class SQLiteStore:
    """A store in one SQLite file, shared safely by threads (a connection each) and processes."""

    dialect: Dialect = "sqlite"
    capabilities = Capabilities(notifications=False, skip_locked=False, concurrent_writers=False)
    sql = SqliteSql()

    def __init__(
        self, url: str, *, clock: Clock | None = None, durable: bool | None = None
    ) -> None:
        self.url = url
        self.path, options = parse_sqlite_url(url)
        if durable is None:
            durable = parse_bool("durable", options.get("durable", "true"))
        self.durable = durable
        self.lock_wait = options.get("lock_wait", "sleep")
        if self.lock_wait not in ("sleep", "poll"):
            raise ConfigurationError(
                f"lock_wait must be sleep (SQLite's busy handler, the default) or poll, "
                f"got {self.lock_wait!r} in {url!r}"
            )
        self.clock: Clock = clock or SystemClock()
        self._local = threading.local()
        self._slot = TxSlot(f"homing-sqlite-tx-{id(self)}")
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._write_lock = threading.Lock()
        self._stream_index = False  # ensure_stream_index ran in this process
        parent = self.path.parent
        if str(parent) and not parent.exists():
            raise ConfigurationError(
                f"directory {parent} for SQLite file {self.path} does not exist"
            )
        self._wake = store_wake(str(self.path.resolve()))
        self._wake.attach()

    # -- connections -------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreUnavailable(f"store {self.url} was closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        try:
            conn = sqlite3.connect(
                str(self.path),
                isolation_level=None,
                timeout=BUSY_TIMEOUT_MS / 1000,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._switch_to_wal(conn)
            conn.execute("PRAGMA synchronous = " + ("FULL" if self.durable else "OFF"))
            conn.execute("PRAGMA foreign_keys = ON")
            # for the migration of job ids to UUIDs (migrations/jobs.py, version 8)
            conn.create_function("homing_job_uuid", 1, _job_uuid, deterministic=True)
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(
                f"cannot open SQLite database {self.path}: {exc}; check the path and its permissions"
            ) from exc
        self._local.conn = conn
        self._local.pid = os.getpid()
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _switch_to_wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode, waiting out other processes that open it at once.

        Changing the journal mode needs an exclusive lock, and SQLite does not always call
        the busy handler for it (a new file's first openers, a WAL recovery in progress):
        the pragma fails with "database is locked" or answers with the old mode. Both are
        retried, with a growing sleep, for as long as the busy timeout.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        pause = 0.001
        while True:
            try:
                mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                mode = f"locked ({exc})"
            if mode == "wal":
                return
            if time.monotonic() >= deadline:
                raise StoreUnavailable(f"could not switch {self.path} to WAL mode (got {mode})")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    # -- transactions ------------------------------------------------------------------
    def in_transaction(self) -> Tx | None:
        return self._slot.get()

    @contextmanager
    def transaction(self, *, write: bool = True, pipelined: bool = False) -> Iterator[Tx]:
        current = self._slot.get()
        if current is not None:
            yield current
            return
        conn = self._connection()
        # SQLite has one writer. Threads of this process queue on a lock instead of
        # SQLite's busy handler, which sleeps up to 100 ms a try under contention.
        if write and not self._write_lock.acquire(timeout=BUSY_TIMEOUT_MS / 1000):
            raise StoreUnavailable(
                f"no write transaction on {self.path} within {BUSY_TIMEOUT_MS / 1000:g}s: another "
                "thread of this process holds one (a transaction left open, or a deadlock)"
            )
        try:
            try:
                if write and self.lock_wait == "poll":
                    self._begin_polling(conn)
                else:
                    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable(
                    f"could not begin a transaction on {self.path}: {exc}"
                ) from exc
            tx = Tx(conn, self.sql, self)
            try:
                with self._slot.bind(tx):
                    yield tx
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._commit(conn)
        finally:
            if write:
                self._write_lock.release()
        tx.run_after_commit()

    def _begin_polling(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE for ``lock_wait=poll``: while another process holds the write
        lock, try again every 0.1-2 ms instead of in SQLite's busy handler, whose sleeps
        grow to 25-100 ms a try and leave the lock idle while its waiters sleep. For several
        busy writer processes with work waiting (the pipeline's delivery workers: make run
        850, 763 -> 948, 950 deliveries/s); it costs a producer and a worker that trade
        jobs one by one the batching the long sleeps give them (cycle-1-worker-sqlite
        0.44x; bench/results/ab-3fb804f-sqlite-begin-poll.md), hence not the default."""
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
            pause = 0.0001
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    busy = "locked" in str(exc) or "busy" in str(exc)
                    if not busy or time.monotonic() > deadline:
                        raise
                time.sleep(pause)
                pause = min(pause * 1.5, 0.002)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    def statement(self, *, durable: bool = True) -> AbstractContextManager[Tx]:
        """SQLite runs in process: a statement is an ordinary write transaction; one that
        need not be durable (a lease) commits with ``synchronous = NORMAL``, without an
        fsync of its own (the next FULL commit's fsync of the WAL covers it)."""
        if durable or not self.durable or self._slot.get() is not None:
            return self.transaction()
        return self._unsynced_transaction()

    def read(self) -> AbstractContextManager[Tx]:
        return self.transaction(write=False)

    @contextmanager
    def _unsynced_transaction(self) -> Iterator[Tx]:
        conn = self._connection()
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            with self.transaction() as tx:
                yield tx
        finally:
            conn.execute("PRAGMA synchronous = FULL")

    def _commit(self, conn: sqlite3.Connection) -> None:
        # COMMIT can meet SQLITE_BUSY when a reader holds the WAL; retry within the timeout.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                conn.execute("COMMIT")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise StoreUnavailable(f"commit failed on {self.path}: {exc}") from exc
                time.sleep(0.005)

    def migrate(self) -> list[str]:
        from homing.store.migrations import apply_migrations

        return apply_migrations(self)

    def ensure_stream_index(self) -> None:
        if self._stream_index:
            return
        from homing.store.migrations.spark import STREAM_INDEX_SQLITE

        with self.transaction() as tx:  # one writer: the build holds others back briefly
            tx.execute(STREAM_INDEX_SQLITE.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS"))
        self._stream_index = True

    def warn_if_never_vacuumed(self) -> bool:
        return False  # SQLite reuses freed pages itself; its indexes hold no dead entries

    def vacuum_if_due(self, every: float) -> list[str]:
        return []  # nothing to collect: see warn_if_never_vacuumed

    def wait_for_notification(self, channel: str, timeout: float) -> bool:
        time.sleep(max(0.0, timeout))
        return False

    def wakeup(
        self,
        channel: str,
        *,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        key: str | None = None,
    ) -> Wakeup:
        self._wake.listen()  # other processes' announcements, from now on
        return self._wake.local.register(channel, PollingWakeup(min_poll, max_poll, key))

    def notify(self, tx: Tx, channel: str, key: str = "") -> None:
        """SQLite has no notifications: once ``tx`` commits, this process's waiters are
        woken directly and other processes' by a datagram (``sqlite_wake``); waiters
        still poll, for anything a datagram misses."""
        tx.call_after_commit(functools.partial(self._wake.announce, channel, key))

    @property
    def write_lock(self) -> threading.Lock:
        """The lock that orders this process's write transactions on the file (one writer)."""
        return self._write_lock

    def close(self) -> None:
        if not self._closed:
            self._wake.detach()  # the last handle closed stops listening for other processes
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.ProgrammingError:
                pass  # created in another thread that still uses it; it closes on exit
