"""The store seam: the only way homing's parts reach a database.

A ``Store`` hands out transactions (``Tx``). Every SQL statement homing runs lives in the
``homing.store`` package (the ``*_queries`` modules and the migrations) and is executed
through a ``Tx``. SQL is written once with ``?`` placeholders; the PostgreSQL backend
translates them. Values always travel as bound parameters, never inside the SQL text.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal, Protocol, runtime_checkable

from homing.clock import Clock

Dialect = Literal["sqlite", "postgres"]


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """Turn a ``?``-placeholder statement into psycopg's ``%s`` form (constant SQL only)."""
    return sql.replace("%", "%%").replace("?", "%s")


class Tx:
    """One open database transaction.

    ``connection`` is the DB-API connection (``sqlite3.Connection`` or
    ``psycopg.Connection``) so callers can make their own writes in the same transaction:
    they commit or roll back together with homing's.
    """

    def __init__(self, connection: Any, dialect: Dialect, store: Store) -> None:
        self.connection = connection
        self.dialect: Dialect = dialect
        self.store = store
        self._after_commit: list[Any] = []

    def _sql(self, sql: str) -> str:
        return to_pyformat(sql) if self.dialect == "postgres" else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; returns the DB-API cursor."""
        cur = self.connection.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        cur = self.connection.cursor()
        cur.executemany(self._sql(sql), [tuple(r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self.execute(sql, params).fetchall())

    def query_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self.execute(sql, params).fetchone()
        return tuple(row) if row is not None else None

    def rowcount(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self.execute(sql, params).rowcount)

    def call_after_commit(self, fn: Any) -> None:
        """Run ``fn()`` once this transaction has committed (never if it rolls back)."""
        self._after_commit.append(fn)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested unit of this transaction: if the block raises, its statements are undone
        (the exception propagates) and the transaction stays usable, on PostgreSQL too.
        Callbacks registered inside with ``call_after_commit`` still run on commit."""
        self.execute("SAVEPOINT homing_unit")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK TO SAVEPOINT homing_unit")
            self.execute("RELEASE SAVEPOINT homing_unit")
            raise
        self.execute("RELEASE SAVEPOINT homing_unit")


@runtime_checkable
class Store(Protocol):
    """A database homing keeps its state in: one SQLite file or one PostgreSQL database."""

    dialect: Dialect
    url: str
    clock: Clock
    durable: bool

    def transaction(self, *, write: bool = True) -> AbstractContextManager[Tx]:
        """Open a transaction, or join the one this thread/task already has open."""
        ...

    def statement(self) -> AbstractContextManager[Tx]:
        """For single-statement work: autocommit where that saves round trips (PostgreSQL),
        else a transaction. Joins the open transaction, if any."""
        ...

    def in_transaction(self) -> Tx | None:
        """The transaction open in the current thread or task, if any."""
        ...

    def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the names applied."""
        ...

    def close(self) -> None: ...

    def wait_for_notification(self, channel: str, timeout: float) -> bool:
        """Block until ``channel`` is notified or ``timeout`` passes; True if notified.

        PostgreSQL uses LISTEN/NOTIFY; SQLite has no notifications and just sleeps.
        """
        ...
