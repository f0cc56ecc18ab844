"""PostgreSQL backend: psycopg 3 with its pool, SKIP LOCKED grabs, LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import quote, urlencode

from homing._json import stored_loads
from homing.clock import Clock, SystemClock
from homing.errors import ConfigurationError, StoreUnavailable, StoreUnreachable
from homing.store._common import TxSlot, parse_bool, split_url
from homing.store.postgres_sql import (
    GATED_CHANNELS,
    LISTENER_REFRESH_S,
    REGISTER_LISTENER,
    UNREGISTER_LISTENER,
    PostgresSql,
)
from homing.store.protocol import Capabilities, Dialect, Tx, Wakeup
from homing.store.wakeup import NotifyWakeup

try:
    import psycopg
    from psycopg import sql as pgsql
    from psycopg.types.json import set_json_loads
    from psycopg.types.string import TextLoader
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the PostgreSQL backend needs psycopg 3: pip install 'homing[postgres]'"
    ) from exc

from homing.store import postgres_upkeep as upkeep  # needs psycopg: after the check above

_log = logging.getLogger("homing.store")
_OPEN_TX = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)
# Pipeline mode needs libpq 14 or later: psycopg[binary] brings its own, a psycopg built
# on an older system libpq does not have it, and a pipelined transaction is then ordinary.
PIPELINE_MODE = psycopg.capabilities.has_pipeline()

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_HOMING_OPTIONS = ("schema", "pool_size", "durable", "connect_timeout_s")


def parse_postgres_url(url: str) -> tuple[str, dict[str, str]]:
    """Split homing's own options (``schema``, ``pool_size``, ``durable``) off a libpq URL."""
    scheme, rest, options = split_url(url)
    if scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(f"not a PostgreSQL URL: {url!r}")
    own = {k: v for k, v in options.items() if k in _HOMING_OPTIONS}
    libpq = {k: v for k, v in options.items() if k not in _HOMING_OPTIONS}
    # quote (%20), not urlencode's default quote_plus (+): libpq does not decode '+' as a
    # space, so "options=-c statement_timeout=5000" would reach the server mangled.
    conninfo = rest + ("?" + urlencode(libpq, quote_via=quote) if libpq else "")
    schema = own.get("schema")
    if schema is not None and not _IDENT.match(schema):
        raise ConfigurationError(
            f"schema={schema!r} is not a plain identifier (letters, digits, _)"
        )
    return conninfo, own


class _Listener:
    """One LISTEN connection per store and channel. A notification wakes every waiter
    without a key; a waiter with a key (``keyed``) wakes only for a notification whose
    payload is that key, or is empty (an announcement for all), or for a ``poke``."""

    def __init__(self, conninfo: str, channel: str, *, register: bool) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._registers = register  # a channel whose announcements ask who listens
        self._cond = threading.Condition()
        self._generation = 0  # every notification and poke: waiters without a key
        self._broadcast = 0  # notifications without a payload, and pokes: every waiter
        self._keys: dict[str, list[int]] = {}  # key -> [notifications, waiters]
        self._seen = threading.local()
        self._stop = False
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"homing-listen-{channel}", daemon=True
        )
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        while not self._stop:
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self._channel)))
                    due = self._register(conn) if self._registers else float("inf")
                    self._ready.set()
                    while not self._stop:
                        for note in conn.notifies(timeout=0.5, stop_after=1):
                            self._deliver(note.payload)
                        if time.monotonic() >= due:
                            due = self._register(conn)
                    if self._registers:
                        conn.execute(UNREGISTER_LISTENER, (self._channel,))
            except psycopg.Error:
                self._ready.set()
                time.sleep(0.5)  # the server went away: poll instead, reconnect soon

    def _register(self, conn: Any) -> float:
        """Record this session as a listener of the channel (inserts skip their NOTIFY
        when nobody listens); returns when to refresh it. A registration refused (the store
        is not migrated yet, a role that may not write) is tried again within a second;
        listening goes on meanwhile. A lost connection is the caller's (reconnect)."""
        try:
            conn.execute(REGISTER_LISTENER, (self._channel,))
        except psycopg.Error:
            if conn.broken:
                raise
            return time.monotonic() + 1.0
        return time.monotonic() + LISTENER_REFRESH_S

    def wait(self, timeout: float) -> bool:
        """Wait for a notification. A thread that waits again also wakes at once for one
        that arrived since its previous wait returned (while it was checking for work), so
        a loop of "look for work, then wait" never sleeps through an announcement."""
        seen: int | None = getattr(self._seen, "generation", None)
        with self._cond:
            if seen is not None and self._generation != seen:
                self._seen.generation = self._generation
                return True
            start = self._generation
            self._cond.wait_for(lambda: self._generation != start, timeout=timeout)
            self._seen.generation = self._generation
            return self._generation != start

    def _deliver(self, payload: str) -> None:
        with self._cond:
            self._generation += 1
            if not payload:
                self._broadcast += 1
            else:
                key = self._keys.get(payload)
                if key is not None:
                    key[0] += 1
            self._cond.notify_all()

    def poke(self) -> None:
        """Wake this process's waiters as if a notification had come."""
        self._deliver("")

    def keyed(self, key: str) -> NotifyWakeup:
        """A wake-up for ``key``'s notifications, registered until it is closed: one that
        arrives between two of its waits (while its caller looks for work) is not missed."""
        with self._cond:
            entry = self._keys.setdefault(key, [0, 0])
            entry[1] += 1
            seen = [self._broadcast + entry[0]]

        def count() -> int:
            return self._broadcast + entry[0]

        def wait(timeout: float) -> bool:
            with self._cond:
                if count() == seen[0]:
                    self._cond.wait_for(lambda: count() != seen[0], timeout=timeout)
                woke = count() != seen[0]
                seen[0] = count()
                return woke

        def close() -> None:
            with self._cond:
                entry[1] -= 1
                if entry[1] == 0 and self._keys.get(key) is entry:
                    del self._keys[key]

        return NotifyWakeup(wait, self.poke, close)

    def stop(self) -> None:
        self._stop = True


# Every session of homing's runs without JIT compilation (unless the URL's own libpq options
# set jit). The server JIT-compiles a statement whose estimated cost passes jit_above_cost
# (100,000 by default) at every execution, even of a prepared plan. The grab is one cheap
# statement with a costly-looking estimate: once the statistics knew of a large backlog
# (100,000 ready jobs), its generic plan was costed at ~519,000, past the inlining and
# optimisation thresholds too, and each grab took 739-910 ms, compiling 106 functions
# (bench/results/jit-auto-explain.txt): a drain of 100,000 jobs with grabs of 100 made
# 1,745-1,829 jobs/s and then stalled, against 21,976 jobs/s with JIT off
# (bench/backlog_drain.py runs both). Test: tests/test_lease_durability.py
# ::test_no_grab_is_jit_compiled_however_big_the_backlog_looks.
NO_JIT = "-c jit=off"
_SETS_JIT = re.compile(r"(?:^|\s)(?:-c\s*|--)jit\s*=")

# The lease pool's sessions (they run only homing's grabs, lease extensions and outbox
# claims): no WAL flush of their own (see statement), and one generic plan per prepared
# statement. The grab is one large statement whose planning costs more than its run; for
# a grab of one job the server judged every custom plan cheaper than the generic one and
# planned it again at every call (478 us an empty grab, 110 us with the generic plan:
# bench/grab_cases.py).
# Generic plans follow the tables' growth through _Replanner.
_LEASE_SETTINGS = ("-c synchronous_commit=off", "-c plan_cache_mode=force_generic_plan")

# Job ids and lease tokens are native uuid columns on PostgreSQL (migrations/jobs.py,
# version 8) and text everywhere in homing's API: homing's sessions read a uuid as its text.
_ADAPTERS = psycopg.adapt.AdaptersMap(psycopg.adapters)
_ADAPTERS.register_loader("uuid", TextLoader)
# json/jsonb values (job args) decoded with the C scanner (homing._json.stored_loads)
set_json_loads(stored_loads, _ADAPTERS)


class _Replanner:
    """Drop a connection's prepared statements now and then, so their plans follow the tables.

    psycopg prepares a statement on its 5th run; from then on the server may use one generic
    plan, made with the table sizes of that moment, until something invalidates it (DDL, or
    an ANALYZE, which autovacuum runs only after a minute or more). A worker that starts on a
    new, nearly empty store therefore keeps plans made for an empty table (sequential scans
    of ``homing_jobs``) while the table grows: every grab and completion then reads every row.
    Dropping the statements at 0.25, 0.75, 1.75, 3.75 ... seconds of a connection's life (at
    most every ``MAX_STEP`` s) re-plans them with the current sizes, for one extra statement
    each time. The first step is short because a batched cycle on a new store otherwise
    spends its first second on those plans (a hash join over a sequential scan in the
    completion). Tests: ``tests/store/test_contract.py::test_plans_made_on_an_empty_table_
    do_not_outlive_its_growth`` and ``::test_replanning_never_leaves_psycopg_with_
    statements_the_server_dropped``.

    Every thread that checks a connection out of the pool calls ``check``, so the schedule
    is kept under a lock (a WeakKeyDictionary is not safe to change from several threads).
    """

    FIRST_STEP = 0.25
    MAX_STEP = 300.0

    def __init__(self) -> None:
        self._due: weakref.WeakKeyDictionary[Any, tuple[float, float]] = weakref.WeakKeyDictionary()
        self._count = 0
        self._lock = threading.Lock()

    def check(self, conn: Any) -> None:
        """Called with ``conn`` checked out (so no other thread uses it): drop its
        prepared statements if they are due."""
        now = time.monotonic()
        with self._lock:
            due = self._due.get(conn)
            if due is None:
                self._due[conn] = (now + self.FIRST_STEP, self.FIRST_STEP)
                return
            at, step = due
            if now < at or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                return
            step = min(step * 2, self.MAX_STEP)
            self._due[conn] = (now + step, step)
            self._count += 1
            count = self._count
        # psycopg sees the command tag DEALLOCATE ALL and forgets its prepared names; the
        # text differs each time so that psycopg treats it as a statement it has not seen
        # (it checks the tag only of statements new to its cache). Outside the lock: the
        # round trip must not hold up other threads' checkouts.
        conn.execute(f"DEALLOCATE ALL -- replan {count}", prepare=False)


class PostgresStore:
    """A store in one PostgreSQL database (optionally one schema of it)."""

    dialect: Dialect = "postgres"
    capabilities = Capabilities(notifications=True, skip_locked=True, concurrent_writers=True)
    sql = PostgresSql()

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        durable: bool | None = None,
        pool_size: int | None = None,
        connect_timeout: float | None = None,
        pool_timeout: float = 60.0,
        lazy: bool = False,
    ) -> None:
        """``connect_timeout``: seconds to wait for the server at open (and, when given, libpq's
        own ``connect_timeout`` for every new connection); the URL's ``connect_timeout_s``
        overrides it. ``pool_timeout``: seconds a caller waits for a pooled connection.
        ``lazy``: do not fail when the server is down now; the pool connects in the
        background and calls fail fast (``StoreUnreachable``) until it is back."""
        self.url = url
        self.conninfo, own = parse_postgres_url(url)
        if "connect_timeout_s" in own:
            connect_timeout = float(own["connect_timeout_s"])
        if connect_timeout is not None:
            params = psycopg.conninfo.conninfo_to_dict(self.conninfo)
            if "connect_timeout" not in params:  # libpq takes whole seconds, at least 2
                self.conninfo = psycopg.conninfo.make_conninfo(
                    self.conninfo, connect_timeout=str(max(2, round(connect_timeout)))
                )
        open_timeout = 10.0 if connect_timeout is None else connect_timeout
        self.pool_timeout = pool_timeout
        self.schema = own.get("schema")
        if durable is None:
            durable = parse_bool("durable", own.get("durable", "true"))
        self.durable = durable
        self.clock: Clock = clock or SystemClock()
        size = pool_size or int(own.get("pool_size", "10"))
        kwargs: dict[str, Any] = {"autocommit": True, "context": _ADAPTERS}
        given = psycopg.conninfo.conninfo_to_dict(self.conninfo).get("options")
        settings = [] if given and _SETS_JIT.search(str(given)) else [NO_JIT]
        if self.schema:
            settings.append(f"-c search_path={self.schema}")
        if not durable:
            settings.append("-c synchronous_commit=off")
        if settings:
            # keep the URL's own libpq options (a keyword argument would replace them)
            kwargs["options"] = " ".join([*([str(given)] if given else []), *settings])
        extra = {"options": kwargs["options"]} if "options" in kwargs else {}
        self._listen_conninfo = psycopg.conninfo.make_conninfo(self.conninfo, **extra)
        self._slot = TxSlot(f"homing-pg-tx-{id(self)}")
        self._listeners: dict[str, _Listener] = {}
        self._listeners_lock = threading.Lock()
        self.pool = ConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=max(1, size),
            kwargs=kwargs,
            open=False,
            name=f"homing-{id(self)}",
        )
        self._pool_kwargs = kwargs
        self._leases: ConnectionPool | None = None
        self._schema_ready = not self.schema
        self._schema_lock = threading.Lock()
        self._replanner = _Replanner()
        self._stream_index = False  # ensure_stream_index ran in this process
        if lazy:
            self.pool.open(wait=False)
            return
        try:
            self.pool.open(wait=True, timeout=open_timeout)
        except PoolTimeout as exc:
            self.pool.close()
            raise StoreUnreachable(
                f"cannot connect to PostgreSQL at {_redact(self.conninfo)} within {open_timeout:g}s; "
                "is the server running and the URL right? (pg_isready -h HOST -p PORT)"
            ) from exc
        with self._connection():
            pass  # creates the schema

    def _ensure_schema(self, conn: Any) -> None:
        with self._schema_lock:
            if self._schema_ready:
                return
            try:
                conn.execute(
                    pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                        pgsql.Identifier(self.schema or "")
                    )
                )
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema):
                pass  # another process created it at the same moment (IF NOT EXISTS races)
            self._schema_ready = True

    def in_transaction(self) -> Tx | None:
        return self._slot.get()

    @contextmanager
    def transaction(self, *, write: bool = True, pipelined: bool = False) -> Iterator[Tx]:
        current = self._slot.get()
        if current is not None:
            yield current
            return
        if pipelined and PIPELINE_MODE:
            with self._pipelined_transaction() as tx:
                yield tx
            tx.run_after_commit()
            return
        with self._connection() as conn, conn.transaction():
            tx = Tx(conn, self.sql, self)
            with self._slot.bind(tx):
                yield tx
        tx.run_after_commit()

    @contextmanager
    def _pipelined_transaction(self) -> Iterator[Tx]:
        """A transaction in psycopg's pipeline mode (see ``Store.transaction``). BEGIN and
        COMMIT are sent as statements, not through ``conn.transaction()``, which waits for
        its BEGIN in pipeline mode too (a round trip before the first statement)."""
        with self._connection() as conn:
            tx = Tx(conn, self.sql, self)
            tx.enter_pipeline(conn.pipeline())
            try:
                tx.execute("BEGIN")
                with self._slot.bind(tx):
                    yield tx
                tx.execute("COMMIT")
                tx.end_pipeline()  # the COMMIT's round trip; raises what failed before it
            except BaseException as exc:
                tx.end_pipeline(exc)  # waits for what was sent; its errors are the past's
                # a lost connection (UNKNOWN) is left to the pool, which discards it
                if conn.info.transaction_status in _OPEN_TX:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def statement(self, *, durable: bool = True) -> Iterator[Tx]:
        """A connection in autocommit mode for work that is one statement (or a few that need
        no atomicity together): each statement commits by itself, saving the BEGIN and
        COMMIT round trips. Joins the transaction open in this thread or task, if any.
        ``durable=False`` (leases) takes a connection of the lease pool, whose sessions run
        with ``synchronous_commit = off`` (no WAL flush of its own, and no SET per call) and
        generic plans (``_LEASE_SETTINGS``); on a non-durable store too, for the plans."""
        current = self._slot.get()
        if current is not None:
            yield current
            return
        pool = self.pool if durable else self._lease_pool()
        with self._connection(pool) as conn:
            tx = Tx(conn, self.sql, self)
            with self._slot.bind(tx):
                yield tx
        tx.run_after_commit()

    def read(self) -> AbstractContextManager[Tx]:
        return self.statement()

    def _lease_pool(self) -> Any:
        """The pool for commits that need not wait for the disk (made at the first lease)."""
        pool = self._leases
        if pool is None:
            with self._schema_lock:
                if self.pool.closed:
                    raise StoreUnavailable(f"store {_redact(self.conninfo)} was closed")
                if self._leases is None:
                    kwargs = dict(self._pool_kwargs)
                    kwargs["options"] = " ".join(
                        o for o in (kwargs.get("options"), *_LEASE_SETTINGS) if o
                    )
                    leases = ConnectionPool(
                        self.conninfo,
                        min_size=1,
                        max_size=self.pool.max_size,
                        kwargs=kwargs,
                        open=False,
                        name=f"homing-leases-{id(self)}",
                    )
                    leases.open(wait=False)
                    self._leases = leases
                pool = self._leases
        return pool

    @contextmanager
    def _connection(self, pool: Any = None) -> Iterator[Any]:
        """A pooled connection; an exhausted pool or a server that cannot be reached is
        ``StoreUnreachable`` (nothing was sent), a connection lost while in use is
        ``StoreUnavailable`` (the outcome of the statement is unknown): never a driver error."""
        try:
            with (pool or self.pool).connection(timeout=self.pool_timeout) as conn:
                try:
                    if not self._schema_ready:
                        self._ensure_schema(conn)
                    self._replanner.check(conn)
                    yield conn
                except psycopg.OperationalError as exc:
                    if not (conn.broken or _connection_lost(exc)):
                        raise
                    raise StoreUnavailable(
                        f"lost the connection to PostgreSQL at {_redact(self.conninfo)} "
                        f"({str(exc).strip() or type(exc).__name__}); the last statement may or "
                        "may not have committed"
                    ) from exc
        except PoolClosed as exc:
            raise StoreUnavailable(f"store {_redact(self.conninfo)} was closed") from exc
        except PoolTimeout as exc:
            raise StoreUnreachable(
                f"no PostgreSQL connection within {self.pool_timeout:g}s "
                f"({_redact(self.conninfo)}): the server is down or every connection is busy"
            ) from exc

    def migrate(self) -> list[str]:
        from homing.store.migrations import apply_migrations

        return apply_migrations(self)

    def ensure_stream_index(self) -> None:
        """Builds the stream index unless this process saw it valid (``postgres_upkeep``:
        CONCURRENTLY, one process at a time, a half-built one rebuilt)."""
        if self._stream_index:
            return
        if self._slot.get() is not None:
            raise ConfigurationError(
                "ensure_stream_index() inside a transaction: building the index waits for "
                "every open transaction, this one included"
            )
        with self._connection() as conn:  # autocommit: CONCURRENTLY is outside a transaction
            upkeep.build_stream_index(conn)
        self._stream_index = True

    def warn_if_never_vacuumed(self) -> bool:
        """Log a warning (a worker does at start) when the server runs without
        autovacuum: the indexes of ready, running and staged jobs then keep an entry for
        every job that passed through until someone runs VACUUM, and every grab walks them,
        slower and slower as jobs pass through. True if it is off."""
        off = self._autovacuum_off()
        if off:
            _log.warning(
                "autovacuum is off on this PostgreSQL server: homing's job indexes keep the "
                "entries of finished jobs until a VACUUM, and grabs slow down as jobs pass "
                "through. homing's workers VACUUM its tables themselves every --vacuum-every "
                "seconds (Worker(vacuum_every=...), default 60); turning autovacuum on is "
                "better."
            )
        return off

    def _autovacuum_off(self) -> bool:
        with self.transaction(write=False) as tx:
            row = tx.query_one("SELECT current_setting('autovacuum')")
        return row is not None and str(row[0]).lower() in ("off", "false", "0")

    def vacuum_if_due(self, every: float) -> list[str]:
        """``vacuum_tables(every)`` when the server has autovacuum off, else nothing."""
        return self.vacuum_tables(every) if self._autovacuum_off() else []

    def vacuum_tables(self, every: float) -> list[str]:
        """VACUUM (ANALYZE) homing's tables that hold at least ``upkeep.VACUUM_MIN_DEAD`` dead rows
        and had no VACUUM in ``every`` seconds (the server's own statistics say both, so
        the workers of a deployment share the schedule). An advisory lock per table lets
        one process at a time do it; the others skip. Returns the tables vacuumed."""
        with self.transaction(write=False) as tx:
            due = tx.query(upkeep.DUE_FOR_VACUUM, (upkeep.VACUUM_MIN_DEAD, every))
        done: list[str] = []
        for schema, table, relid in due:
            with self._connection() as conn:  # autocommit: VACUUM runs outside a transaction
                if upkeep.vacuum_table(conn, schema, table, relid):
                    done.append(table)
        return done

    def notify_channel(self, channel: str) -> str:
        return f"{self.schema}_{channel}" if self.schema else channel

    def wait_for_notification(self, channel: str, timeout: float) -> bool:
        full = self.notify_channel(channel)
        if not _IDENT.match(full):
            raise ConfigurationError(f"notification channel {full!r} is not a plain identifier")
        with self._listeners_lock:
            listener = self._listeners.get(full)
            if listener is None:
                listener = self._listeners[full] = _Listener(
                    self._listen_conninfo, full, register=channel in GATED_CHANNELS
                )
        return listener.wait(timeout)

    def wakeup(
        self,
        channel: str,
        *,
        min_poll: float = 0.002,
        max_poll: float = 0.1,
        key: str | None = None,
    ) -> Wakeup:
        self.wait_for_notification(channel, 0)  # start listening now, not at the first wait
        listener = self._listeners[self.notify_channel(channel)]
        if key is not None:
            return listener.keyed(key)
        return NotifyWakeup(
            lambda timeout: self.wait_for_notification(channel, timeout), listener.poke
        )

    def notify(self, tx: Tx, channel: str, key: str = "") -> None:
        self.sql.notify(tx, channel, key)

    def close(self) -> None:
        for listener in self._listeners.values():
            listener.stop()
        self.pool.close()
        with self._schema_lock:
            if self._leases is not None:
                self._leases.close()


def _connection_lost(exc: BaseException) -> bool:
    """Class 08 (connection exception) and 57P01-3 (the server shut down or restarted)."""
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _redact(conninfo: str) -> str:
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", conninfo)
