"""Round trips per job of homing's worker on PostgreSQL, counted at the driver.

    .venv/bin/python -m bench.worker_roundtrips [--jobs 2000] [--rates 200 1000 0]

One worker (``homing.worker.App``, its defaults, a no-op handler) runs in this process
while a producer thread inserts ``--jobs`` jobs one at a time, paced at each of
``--rates`` jobs/s (0: a backlog inserted first, then drained). psycopg's
``Cursor.execute``/``executemany`` and ``Connection.transaction`` are wrapped to count
the worker's statements and transactions (the producer's are left out); a round trip is
a statement, plus a BEGIN and a COMMIT for each explicit transaction. Printed per job:
statements by kind, transactions and round trips.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import threading
import time
from typing import Any

import psycopg

import homing

PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
PRODUCER = "roundtrips-producer"
counts: collections.Counter[str] = collections.Counter()


def _counting(method: Any, label: Any) -> Any:
    """``method`` that first counts its call under ``label(args)``, in the worker's threads."""

    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        if threading.current_thread().name != PRODUCER:
            counts[label(args)] += 1
        return method(self, *args, **kw)

    return counted


def _install() -> None:
    """Count the worker's statements and transactions (the producer's are not)."""

    def statement(args: Any) -> str:
        return " ".join(str(args[0]).split())[:48]

    cursor, connection = psycopg.Cursor, psycopg.Connection
    cursor.execute = _counting(cursor.execute, statement)  # type: ignore[method-assign]
    cursor.executemany = _counting(cursor.executemany, statement)  # type: ignore[method-assign]
    connection.transaction = _counting(  # type: ignore[method-assign]
        connection.transaction, lambda args: "<transaction>"
    )


def run(jobs: int, rate: float) -> tuple[float, collections.Counter[str]]:
    """Jobs/s and the worker's counts for ``jobs`` jobs produced at ``rate`` (0: backlog)."""
    from homing.worker import App

    url = f"{PG}?schema=roundtrips_{os.getpid()}_{int(rate)}"
    db = homing.connect(url, pool_size=10)
    assert isinstance(db, homing.Database)
    app = App(db)
    done = threading.Event()
    handled = [0]

    @app.job("bench")
    def noop(job: Any, ctx: Any) -> None:
        handled[0] += 1
        if handled[0] >= jobs:
            done.set()

    def produce() -> None:
        producer = homing.connect(url, pool_size=2)
        start = time.perf_counter()
        for i in range(jobs):
            if rate:  # on a schedule: the i-th job at i / rate seconds
                time.sleep(max(0.0, start + i / rate - time.perf_counter()))
            producer.insert("bench", {"i": i})
        producer.close()

    if not rate:
        produce()
    worker = app.worker()
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    time.sleep(0 if not rate else 1.0)  # the worker idle and listening before the first job
    counts.clear()
    started = time.perf_counter()
    producer = threading.Thread(target=produce, name=PRODUCER) if rate else None
    if producer is not None:
        producer.start()
    if not done.wait(300):
        raise RuntimeError(f"only {handled[0]} of {jobs} jobs ran in 300 s")
    elapsed = time.perf_counter() - started
    time.sleep(0.5)  # the last completions' commit
    got = collections.Counter(counts)
    worker.stop()
    runner.join(30)
    if producer is not None:
        producer.join()
    with db.store.transaction() as tx:
        tx.execute(f"DROP SCHEMA roundtrips_{os.getpid()}_{int(rate)} CASCADE")
    db.close()
    return jobs / elapsed, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rates", type=float, nargs="+", default=[200, 1000, 0])
    args = ap.parse_args()
    logging.getLogger("homing").setLevel(logging.ERROR)
    _install()
    print(
        f"# python -m bench.worker_roundtrips --jobs {args.jobs} --rates "
        f"{' '.join(f'{r:g}' for r in args.rates)}  "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f})"
    )
    for rate in args.rates:
        speed, got = run(args.jobs, rate)
        tx = got.pop("<transaction>", 0)
        statements = sum(got.values())
        label = f"paced at {rate:g}/s" if rate else "backlog drained"
        print(
            f"{label}: {speed:,.0f} jobs/s; per job {statements / args.jobs:.3f} statements, "
            f"{tx / args.jobs:.3f} transactions, "
            f"{(statements + 2 * tx) / args.jobs:.3f} round trips"
        )
        for query, n in got.most_common(6):
            print(f"    {n / args.jobs:7.3f}  {query}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
