"""The store seam: the only way homing's parts reach a database.

A ``Store`` hands out transactions (``Tx``). Every SQL statement homing runs lives in the
``homing.store`` package (the ``*_queries`` modules and the migrations) and is executed
through a ``Tx``. SQL is written once with ``?`` placeholders; the PostgreSQL backend
translates them. Values always travel as bound parameters, never inside the SQL text.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from homing.clock import Clock

if TYPE_CHECKING:
    from homing.store.dialect import SqlDialect

Dialect = Literal["sqlite", "postgres"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, so that callers ask the store instead of naming a dialect.

    ``notifications``: other processes' commits can wake a waiter (LISTEN/NOTIFY) instead of
    it polling. ``skip_locked``: concurrent grabbers pass over each other's rows.
    ``concurrent_writers``: write transactions run in parallel (PostgreSQL), rather than one
    at a time per database (SQLite); long work inside a write transaction blocks everyone
    on a single-writer store.
    """

    notifications: bool
    skip_locked: bool
    concurrent_writers: bool


class Wakeup(Protocol):
    """A wait for "there may be new work on ``channel``", the same call on every backend.

    ``wait(timeout)`` returns True when woken by a notification, False when the timeout (or,
    on a polling backend, the current back-off step) passed: either way, look for work
    again. ``reset()`` after finding work makes a polling wait short again.
    """

    def wait(self, timeout: float) -> bool: ...

    def reset(self) -> None: ...

    def interrupt(self) -> None:
        """Wake a waiter of this process now (shutting down, or work found locally)."""
        ...

    def close(self) -> None:
        """Done waiting: let go of what the wake-up holds (a key's registration)."""
        ...


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """Turn a ``?``-placeholder statement into psycopg's ``%s`` form (constant SQL only)."""
    return sql.replace("%", "%%").replace("?", "%s")


_KEEP_AT_MOST = 32  # savepoints left set at the top of a transaction (see Tx.savepoint)

T = TypeVar("T")


class Pending(Generic[T]):
    """A statement sent with ``Tx.defer`` whose result is read later: ``get()`` waits for
    it (in a pipelined transaction, for everything queued so far, in one round trip)."""

    __slots__ = ("_convert", "_cursor", "_tx")

    def __init__(self, tx: Tx, cursor: Any, convert: Callable[[Any], T]) -> None:
        self._tx = tx
        self._cursor = cursor
        self._convert = convert

    def get(self) -> T:
        self._tx.flush()
        return self._convert(self._cursor)


class Tx:
    """One open database transaction.

    ``connection`` is the DB-API connection (``sqlite3.Connection`` or
    ``psycopg.Connection``) so callers can make their own writes in the same transaction:
    they commit or roll back together with homing's.
    """

    def __init__(self, connection: Any, sql: SqlDialect, store: Store) -> None:
        self._connection = connection
        self.sql = sql  # the statements that differ between backends
        self.dialect: Dialect = sql.name
        self.store = store
        self._after_commit: list[Any] = []
        self._savepoints = itertools.count(1)
        self._pending: list[str] = []  # savepoints entered, not yet set: no statement ran
        self._active = 0  # savepoint blocks open now
        self._kept = 0  # savepoints ended well and not released (see savepoint)
        self._first_kept = ""
        # PostgreSQL, a pipelined transaction (PostgresStore.transaction(pipelined=True)):
        # psycopg's pipeline while statements are sent without waiting for their results,
        # and whether some were sent since the last wait
        self._pipe: Any = None
        self._pipe_block: Any = None  # the ``conn.pipeline()`` block that made it
        self._queued = False
        self._handed_over = False  # code that is not homing's runs on it (handed_over)

    @property
    def connection(self) -> Any:
        """The DB-API connection. Taking it sets the savepoints still pending, so that a
        caller's own statements are undone with the block's if it fails; and, while the
        transaction is handed over, leaves pipeline mode first (see ``handed_over``)."""
        if self._handed_over and self._pipe is not None:
            self.end_pipeline()
        if self._pending:
            cur = self._connection.cursor()
            for name in self._pending:
                cur.execute(f"SAVEPOINT {name}")
            self._pending.clear()
        return self._connection

    def _sql(self, sql: str) -> str:
        return to_pyformat(sql) if self.sql.pyformat else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; returns the DB-API cursor. In a pipelined transaction the
        statement is only sent: its errors and row count come with the next wait."""
        cur = self.connection.cursor()
        cur.execute(self._sql(sql), tuple(params))
        if self._pipe is not None:
            self._queued = True
        return cur

    def defer(self, sql: str, params: Sequence[Any], convert: Callable[[Any], T]) -> Pending[T]:
        """Send a statement and read its result later, through ``convert(cursor)`` once
        ``get()`` is called. In a pipelined PostgreSQL transaction the statements deferred
        one after another (and the BEGIN before them) travel in one round trip; elsewhere
        the statement runs at once. Either way they run in the order sent, so checks made
        on the results after later statements were sent hold as if made in between, as
        long as a failed check raises (the transaction then rolls all of them back)."""
        return Pending(self, self.execute(sql, params), convert)

    def flush(self) -> None:
        """Wait for the statements sent without waiting (a pipelined transaction): one
        round trip, which raises the first error among them. Else nothing to do."""
        if self._queued:  # only ever set in pipeline mode
            self._queued = False
            self._pipe.sync()

    def enter_pipeline(self, block: AbstractContextManager[Any]) -> None:
        """Send statements without waiting from here on (the store's ``conn.pipeline()``)."""
        self._pipe = block.__enter__()
        self._pipe_block = block

    def end_pipeline(self, exc: BaseException | None = None) -> None:
        """Wait for what was sent and leave pipeline mode: from here on every statement
        waits for its result as usual (call it before code that is not homing's, such as a
        handler given this transaction). With ``exc`` (the transaction failed), errors of
        what was sent are logged by psycopg rather than raised over it."""
        block, self._pipe, self._pipe_block = self._pipe_block, None, None
        self._queued = False
        if block is not None:
            block.__exit__(None if exc is None else type(exc), exc, None)

    @contextmanager
    def handed_over(self) -> Iterator[None]:
        """Run code that is not homing's (a handler given this transaction) in the block.
        A pipelined transaction stays pipelined until that code's first statement, which
        leaves pipeline mode before it runs, so its statements behave as usual; code that
        runs none leaves the BEGIN to travel with homing's next statement after the block."""
        self._handed_over = True
        try:
            yield
        finally:
            self._handed_over = False

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        cur = self.connection.cursor()
        cur.executemany(self._sql(sql), [tuple(r) for r in rows])
        if self._pipe is not None:
            self._queued = True

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        """``execute``, then its results in hand (in pipeline mode rows and the row count
        arrive only with a wait)."""
        cur = self.execute(sql, params)
        if self._queued:
            self.flush()
        return cur

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._run(sql, params).fetchall())

    def query_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self._run(sql, params).fetchone()
        return tuple(row) if row is not None else None

    def rowcount(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._run(sql, params).rowcount)

    def call_after_commit(self, fn: Any) -> None:
        """Run ``fn()`` once this transaction has committed (never if it rolls back)."""
        self._after_commit.append(fn)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested unit of this transaction: if the block raises, its statements are undone
        (the exception propagates) and the transaction stays usable, on PostgreSQL too.

        One rule for ``call_after_commit``: a callback registered inside a savepoint that is
        rolled back is dropped with the statements it belonged to; one registered inside a
        savepoint that is released runs when the whole transaction commits. Savepoints nest.

        Each SAVEPOINT and RELEASE is a round trip on PostgreSQL, and a receiver runs a
        block per message: so the SAVEPOINT is set only before the block's first statement
        (a block that runs none has nothing to undo), and an outermost block that ended
        well is not released (the commit releases it; ``_KEEP_AT_MOST`` of them, then one
        RELEASE ends them all, which keeps the server's stack of subtransactions short).
        """
        name = f"homing_sp_{next(self._savepoints)}"
        mark = len(self._after_commit)
        self._pending.append(name)
        self._active += 1
        try:
            yield
        except BaseException:
            self._active -= 1
            if self._pending and self._pending[-1] == name:
                self._pending.pop()  # no statement ran in the block: nothing to undo
            else:
                cur = self._connection.cursor()
                cur.execute(f"ROLLBACK TO SAVEPOINT {name}")
                cur.execute(f"RELEASE SAVEPOINT {name}")
            del self._after_commit[mark:]
            raise
        self._active -= 1
        if self._pending and self._pending[-1] == name:
            self._pending.pop()
        elif self._active:  # inside another block: release it, as that one may roll back
            self._connection.cursor().execute(f"RELEASE SAVEPOINT {name}")
        else:
            self._kept += 1
            if self._kept >= _KEEP_AT_MOST:  # releases the kept ones after it too
                self._connection.cursor().execute(f"RELEASE SAVEPOINT {self._first_kept}")
                self._kept = 0
            elif self._kept == 1:
                self._first_kept = name

    def run_after_commit(self) -> None:
        """Called by the store once the transaction committed."""
        callbacks, self._after_commit = self._after_commit, []
        for fn in callbacks:
            fn()


@runtime_checkable
class Store(Protocol):
    """A database homing keeps its state in: one SQLite file or one PostgreSQL database."""

    dialect: Dialect
    capabilities: Capabilities
    url: str
    clock: Clock
    durable: bool

    def transaction(
        self, *, write: bool = True, pipelined: bool = False
    ) -> AbstractContextManager[Tx]:
        """Open a transaction, or join the one this thread/task already has open.

        ``pipelined``: on PostgreSQL, statements are sent without waiting for their
        results until one is read (``Tx.defer``, ``Tx.query``...), the BEGIN with the first
        of them and the COMMIT with the last: a transaction of a few writes and checks in
        two round trips instead of one a statement plus two. Only for homing's own
        transactions whose statements' errors may surface at the next read (``rowcount``
        waits); ``Tx.end_pipeline()`` before handing the transaction to other code.
        Elsewhere (SQLite, in process) the same as an ordinary transaction."""
        ...

    def statement(self, *, durable: bool = True) -> AbstractContextManager[Tx]:
        """For single-statement work: autocommit where that saves round trips (PostgreSQL),
        else a transaction. Joins the open transaction, if any.

        ``durable=False`` is for leases (a grab, a lease extension): the commit does not
        wait for the disk. It becomes durable with the next durable commit of the store
        (the log is one sequence), and a power loss before that forgets it, which is the
        same as the lease expiring: the job is ready again. A process crash loses nothing."""
        ...

    def read(self) -> AbstractContextManager[Tx]:
        """For a read of one statement that needs no transaction: PostgreSQL runs it in
        autocommit (one round trip instead of BEGIN, the query and COMMIT); SQLite, in
        process, in a deferred read transaction. Joins the open transaction, if any."""
        ...

    def in_transaction(self) -> Tx | None:
        """The transaction open in the current thread or task, if any."""
        ...

    def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the names applied."""
        ...

    def ensure_stream_index(self) -> None:
        """Build the index a Spark stream reads a job type's rows through, if it is not
        there (the first stream over a store does; every job written after pays for it,
        so a store no stream reads does without). Cheap once done in this process."""
        ...

    def warn_if_never_vacuumed(self) -> bool:
        """Log a warning when dead index entries of finished jobs are never cleaned up
        (PostgreSQL with autovacuum off); True then. A worker asks at start."""
        ...

    def vacuum_if_due(self, every: float) -> list[str]:
        """Where the server will not (PostgreSQL with autovacuum off), VACUUM (ANALYZE)
        homing's tables that have dead rows and were not vacuumed in the last ``every``
        seconds, one process at a time; return the tables vacuumed. Elsewhere: []."""
        ...

    def close(self) -> None: ...

    def wait_for_notification(self, channel: str, timeout: float) -> bool:
        """Block until ``channel`` is notified or ``timeout`` passes; True if notified.

        PostgreSQL uses LISTEN/NOTIFY; SQLite has no notifications and just sleeps.
        """
        ...

    def wakeup(
        self,
        channel: str,
        *,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        key: str | None = None,
    ) -> Wakeup:
        """A waiter for new work on ``channel``: LISTEN/NOTIFY on PostgreSQL, a back-off poll
        (``min_poll`` doubling up to ``max_poll``) cut short by announcements on SQLite. Use it instead of a loop of
        your own, so that no part of homing needs to know which backend it runs on.

        ``key``: wake only for announcements made with that key (and those made without
        one), not for every announcement on the channel: a client waiting for its own
        reply among many. Registered from now until ``close()``."""
        ...

    def notify(self, tx: Tx, channel: str, key: str = "") -> None:
        """Announce new work on ``channel`` when ``tx`` commits (NOTIFY on PostgreSQL; on
        SQLite this process's waiters directly and other processes' by datagram, see
        ``sqlite_wake``); ``key``: for the waiters of that key only (see ``wakeup``)."""
        ...
