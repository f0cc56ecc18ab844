"""The client's CPU for one committed one-job insert on PostgreSQL, and where it goes.

    .venv/bin/python -m bench.insert_cpu [--n 3000] [--rounds 2]

The one-job full cycles of the harness (cycle-1) are paced by their single producer,
which commits one insert at a time: this prints, per insert, the producer process's CPU
time and the wall time of four loops, alternated ``--rounds`` times in one process:

- ``Database.insert``: homing's job API (a uuid7, the args encoded, a pooled connection,
  the insert with its wake-up in one statement);
- the same statement on a bare psycopg connection (captured from ``jobs_queries``), so
  that the difference is homing's Python around it;
- the raw loop's insert (``bench/drivers/raw_sql.py``: one text column, a bigserial);
- ``SELECT 1``: psycopg's own cost of a prepared statement's round trip.

Each in autocommit mode (a durable commit per insert, as the harness's producers do).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg

import homing
from bench.grab_cost import _Capture
from homing.store import jobs_queries as q

PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
ARGS = {"i": 1, "p": "x" * 80}


def timed(n: int, fn: Callable[[], Any]) -> tuple[float, float]:
    """CPU and wall microseconds per call, after a warm-up of 200 calls."""
    for _ in range(200):
        fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000, help="inserts per loop and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    schema = f"insert_cpu_{os.getpid()}"
    db = homing.connect(f"{PG}?schema={schema}")
    assert isinstance(db, homing.Database)
    conn = psycopg.connect(PG, autocommit=True, options=f"-c search_path={schema}")
    conn.execute(
        "CREATE TABLE raw_jobs (id BIGSERIAL PRIMARY KEY, state SMALLINT NOT NULL DEFAULT 0, "
        "payload TEXT NOT NULL)"
    )
    conn.execute("CREATE INDEX raw_jobs_ready ON raw_jobs (id) WHERE state = 0")
    with db.store.transaction() as tx:
        capture = _Capture(tx)
        q.insert_jobs(capture, db._ops.new_jobs([("bench", ARGS)]))  # type: ignore[arg-type]
    sql, params = capture.statements[0]
    payload = json.dumps(ARGS)
    loops: dict[str, Callable[[], Any]] = {
        "Database.insert": lambda: db.insert("bench", ARGS),
        "same statement, bare connection": lambda: conn.execute(
            sql, [str(homing.uuid7()), *params[1:]], prepare=True
        ),
        "raw loop's insert": lambda: conn.execute(
            "INSERT INTO raw_jobs (payload) VALUES (%s)", (payload,), prepare=True
        ),
        "SELECT 1": lambda: conn.execute("SELECT 1", prepare=True),
    }
    print(
        f"# bench/insert_cpu.py --n {args.n} --rounds {args.rounds}  "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {os.getloadavg()[0]:.2f})\nper insert: client CPU us / wall us"
    )
    try:
        for r in range(args.rounds):
            for name, fn in loops.items():
                cpu, wall = timed(args.n, fn)
                print(f"round {r + 1}  {name:33s} {cpu:6.1f} / {wall:6.1f}", flush=True)
    finally:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()
        db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
