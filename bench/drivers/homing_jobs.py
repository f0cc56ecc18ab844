"""homing through its public job API: insert / insert_many, grab_many, complete / complete_many.

The consumer loop here is what a minimal worker does (used while ``homing.worker`` does not
exist; ``homing_worker.py`` drives the real worker runtime once it lands): grab up to
``batch`` jobs, run the no-op handler, complete them (one transaction per job when
``batch == 1``, one ``complete_many`` otherwise). Idle PostgreSQL consumers wait on
LISTEN/NOTIFY (``Database.wait_for_jobs``); idle SQLite consumers poll every 2 ms.

The ``-joined`` systems run the loop docs/jobs.md recommends for a consumer of one's own
("A loop of your own"): after the first grab, each completion and the next grab share
one transaction (``tx.complete`` / ``tx.complete_many`` then ``tx.grab_many`` in
``db.transaction()``): one commit a turn instead of two, the grab made durable with the
completion.
"""

from __future__ import annotations

import time
from typing import Any

import homing
from bench.common import JOB_TYPE, PG_URL, Tally, payload, reset_postgres
from bench.drivers import Driver

LOCK_FOR = 60.0


class _Producer:
    def __init__(self, db: Any, batch: int) -> None:
        self.db = db
        self.batch = batch

    def send(self, seqs: list[int]) -> None:
        if self.batch == 1 and len(seqs) == 1:
            self.db.insert(JOB_TYPE, payload(seqs[0]))
        else:
            self.db.insert_many([(JOB_TYPE, payload(i)) for i in seqs])

    def close(self) -> None:
        self.db.close()


class _Homing(Driver):
    batch_ok = True
    durable = True
    joined = False  # complete and grab the next jobs in one transaction
    startup_s = 0.3

    def url(self) -> str:
        raise NotImplementedError

    def connect(self) -> Any:
        return homing.connect(self.url(), durable=self.durable, migrate=False, pool_size=2)

    def open_producer(self) -> _Producer:
        return _Producer(self.connect(), self.batch)

    def consume(self, slot: int) -> None:
        if self.joined:
            return self._consume_joined()
        db = self.connect()
        pg = db.dialect == "postgres"
        batch = self.batch
        while True:
            jobs = db.grab_many([JOB_TYPE], lock_for=LOCK_FOR, limit=batch)
            if not jobs:
                _idle(db, pg)
                continue
            for job in jobs:
                Tally.started(job.args)  # the no-op handler
            if len(jobs) == 1:
                db.complete(jobs[0])
            else:
                db.complete_many(jobs)
            Tally.done(len(jobs))

    def _consume_joined(self) -> None:
        db = self.connect()
        pg = db.dialect == "postgres"
        batch = self.batch
        jobs: list[Any] = []
        while True:
            if jobs:  # the jobs run last turn: completed in the commit of the next grab
                with db.transaction() as tx:
                    if len(jobs) == 1:
                        tx.complete(jobs[0])
                    else:
                        tx.complete_many(jobs)
                    done = len(jobs)
                    jobs = tx.grab_many([JOB_TYPE], lock_for=LOCK_FOR, limit=batch)
                Tally.done(done)
            else:
                jobs = db.grab_many([JOB_TYPE], lock_for=LOCK_FOR, limit=batch)
            if not jobs:
                _idle(db, pg)
                continue
            for job in jobs:
                Tally.started(job.args)  # the no-op handler


def _idle(db: Any, pg: bool) -> None:
    """An idle consumer's wait: LISTEN/NOTIFY on PostgreSQL, a 2 ms poll on SQLite."""
    if pg:
        db.wait_for_jobs(0.1)
    else:
        time.sleep(0.002)


class HomingSQLite(_Homing):
    name = "homing-sqlite"
    family = "sqlite"
    durability = "SQLite WAL, synchronous=FULL: fsync on every commit"

    def url(self) -> str:
        return f"sqlite:///{self.workdir / 'homing.db'}"

    def reset(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            (self.workdir / f"homing.db{suffix}").unlink(missing_ok=True)
        with homing.connect(self.url(), durable=self.durable) as db:
            db.migrate()

    def settings(self) -> dict[str, Any]:
        import sqlite3

        with homing.connect(self.url(), durable=self.durable, migrate=False) as db:
            with db.transaction() as tx:
                sync = tx.connection.execute("PRAGMA synchronous").fetchone()[0]
                mode = tx.connection.execute("PRAGMA journal_mode").fetchone()[0]
        names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        return {
            "sqlite_version": sqlite3.sqlite_version,
            "synchronous": names.get(sync, sync),
            "journal_mode": mode,
            "batch": self.batch,
        }


class HomingSQLiteNonDurable(HomingSQLite):
    name = "homing-sqlite-nd"
    durable = False
    durability = "homing.connect(durable=False): SQLite synchronous=OFF (no fsync)"


class HomingPostgres(_Homing):
    name = "homing-pg"
    family = "postgres"
    durability = "PostgreSQL synchronous_commit=on: WAL flushed before each commit returns"

    def url(self) -> str:
        return PG_URL

    def reset(self) -> None:
        reset_postgres(PG_URL)
        with homing.connect(self.url(), durable=self.durable) as db:
            db.migrate()

    def settings(self) -> dict[str, Any]:
        with homing.connect(self.url(), durable=self.durable, migrate=False) as db:
            with db.transaction() as tx:
                sc = tx.connection.execute("SHOW synchronous_commit").fetchone()[0]
        return {"synchronous_commit (session)": sc, "batch": self.batch, "notify": "LISTEN/NOTIFY"}


class HomingSQLiteJoined(HomingSQLite):
    name = "homing-sqlite-joined"
    joined = True


class HomingPostgresJoined(HomingPostgres):
    name = "homing-pg-joined"
    joined = True


class HomingPostgresNonDurable(HomingPostgres):
    name = "homing-pg-nd"
    durable = False
    durability = "homing.connect(durable=False): synchronous_commit=off (last ~0.6 s at risk)"
