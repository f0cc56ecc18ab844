"""The physical limits: the smallest correct grab/complete loops, straight on the drivers.

PostgreSQL: ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING``
to grab, ``UPDATE ... WHERE id = ANY(...)`` to complete, each its own durable transaction
(synchronous_commit=on). SQLite: the same two steps in ``BEGIN IMMEDIATE`` transactions,
WAL, synchronous=FULL. No lease token, no holder, no history: only what a queue must do.

SQLite writers wait for each other through the busy handler, which sleeps 1, 2, 5, 10 ...
up to 100 ms between tries: a producer that commits in a loop takes the lock again
before a sleeping consumer wakes, and the consumers starve. The raw loop therefore takes
an ``flock`` on a side file around each write transaction: the kernel wakes a waiter the
moment the lock is free. (``HOMING_BENCH_RAW_FLOCK=0`` turns it off, to show the effect.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from bench.common import PG_URL, Tally, payload, reset_postgres
from bench.drivers import Driver

_PG_DDL = (
    "CREATE TABLE raw_jobs (id BIGSERIAL PRIMARY KEY, state SMALLINT NOT NULL DEFAULT 0, "
    "payload TEXT NOT NULL)",
    "CREATE INDEX raw_jobs_ready ON raw_jobs (id) WHERE state = 0",
)
_PG_GRAB = (
    "UPDATE raw_jobs SET state = 1 WHERE id IN (SELECT id FROM raw_jobs WHERE state = 0 "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload"
)


class _PgProducer:
    def __init__(self, batch: int) -> None:
        import psycopg

        self.conn = psycopg.connect(PG_URL, autocommit=True)
        self.batch = batch

    def send(self, seqs: list[int]) -> None:
        if len(seqs) == 1:
            self.conn.execute(
                "INSERT INTO raw_jobs (payload) VALUES (%s)", (json.dumps(payload(seqs[0])),)
            )
        else:
            self.conn.execute(
                "INSERT INTO raw_jobs (payload) SELECT unnest(%s::text[])",
                ([json.dumps(payload(i)) for i in seqs],),
            )

    def close(self) -> None:
        self.conn.close()


class RawPostgres(Driver):
    name = "raw-pg"
    family = "postgres"
    batch_ok = True
    durability = "synchronous_commit=on (every grab and complete is a flushed commit)"

    def reset(self) -> None:
        import psycopg

        reset_postgres(PG_URL)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for ddl in _PG_DDL:
                conn.execute(ddl)

    def settings(self) -> dict[str, Any]:
        return {"batch": self.batch, "grab": "SKIP LOCKED", "idle": "poll 2 ms"}

    def open_producer(self) -> _PgProducer:
        return _PgProducer(self.batch)

    def consume(self, slot: int) -> None:
        import psycopg

        conn = psycopg.connect(PG_URL, autocommit=True)
        n = self.batch
        while True:
            rows = conn.execute(_PG_GRAB, (n,)).fetchall()
            if not rows:
                time.sleep(0.002)
                continue
            for _, data in rows:
                Tally.started(data)
            conn.execute(
                "UPDATE raw_jobs SET state = 2 WHERE id = ANY(%s)", ([r[0] for r in rows],)
            )
            Tally.done(len(rows))


FLOCK = os.environ.get("HOMING_BENCH_RAW_FLOCK", "1") != "0"


class _Writer:
    """One SQLite connection and the side lock file that orders its write transactions."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=60)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("PRAGMA busy_timeout = 60000")
        self.lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600) if FLOCK else -1

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        if self.lock_fd >= 0:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
        finally:
            if self.lock_fd >= 0:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.conn.close()
        if self.lock_fd >= 0:
            os.close(self.lock_fd)


class RawSQLite(Driver):
    name = "raw-sqlite"
    family = "sqlite"
    batch_ok = True
    durability = "WAL, synchronous=FULL (fsync on every commit)"

    @property
    def path(self) -> str:
        return str(self.workdir / "raw.db")

    def reset(self) -> None:
        for suffix in ("", "-wal", "-shm", ".lock"):
            (self.workdir / f"raw.db{suffix}").unlink(missing_ok=True)
        conn = _Writer(self.path).conn
        conn.execute(
            "CREATE TABLE raw_jobs (id INTEGER PRIMARY KEY, state INTEGER NOT NULL DEFAULT 0, "
            "payload TEXT NOT NULL)"
        )
        conn.execute("CREATE INDEX raw_jobs_ready ON raw_jobs (id) WHERE state = 0")
        conn.close()

    def settings(self) -> dict[str, Any]:
        return {
            "sqlite_version": sqlite3.sqlite_version,
            "synchronous": "FULL",
            "journal_mode": "wal",
            "batch": self.batch,
            "idle": "poll 2 ms",
            "writers ordered by": "flock on a side file" if FLOCK else "SQLite busy handler",
        }

    def open_producer(self) -> _SqliteProducer:
        return _SqliteProducer(_Writer(self.path))

    def consume(self, slot: int) -> None:
        w = _Writer(self.path)
        n = self.batch
        while True:
            with w.write() as conn:
                rows = conn.execute(
                    "UPDATE raw_jobs SET state = 1 WHERE id IN (SELECT id FROM raw_jobs "
                    "WHERE state = 0 ORDER BY id LIMIT ?) RETURNING id, payload",
                    (n,),
                ).fetchall()
            if not rows:
                time.sleep(0.002)
                continue
            for _, data in rows:
                Tally.started(data)
            marks = ",".join("?" for _ in rows)
            with w.write() as conn:
                conn.execute(
                    f"UPDATE raw_jobs SET state = 2 WHERE id IN ({marks})",  # noqa: S608
                    [r[0] for r in rows],
                )
            Tally.done(len(rows))


class _SqliteProducer:
    def __init__(self, writer: _Writer) -> None:
        self.w = writer

    def send(self, seqs: list[int]) -> None:
        rows = [(json.dumps(payload(i)),) for i in seqs]
        with self.w.write() as conn:
            conn.executemany("INSERT INTO raw_jobs (payload) VALUES (?)", rows)

    def close(self) -> None:
        self.w.close()
