"""Draining a large backlog through the job API on PostgreSQL, as the server's statistics
see it: how the rate holds up from the first job to the last.

    .venv/bin/python bench/backlog_drain.py [--jobs 100000] [--batch 100] [--limit-s 40]
        [--jit default on] [--consumer api worker] [--out FILE]

The harness's cells run on fresh tables whose statistics say they are nearly empty. A
store in production has statistics from autovacuum's ANALYZE, and with a large backlog the
planner's estimates for the grab grow with it. Here ``--jobs`` jobs are inserted, the
table is ANALYZEd (as autovacuum would), and a single consumer drains them, stopping after
``--limit-s`` seconds: this process through the job API (``grab_many(limit=--batch)`` +
``complete_many``; ``--consumer api``) or one homing worker process (``worker``).
Reported per tenth of the backlog: the rate, and the buffers that the ready-job index scan
of an empty-handed probe reads (the dead entries of the jobs already drained, until
VACUUM). ``--jit on`` runs the same with the URL option ``-c jit=on``, which homing keeps
(its sessions otherwise run with jit off, see ``store/postgres.py``): the server's default.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import homing  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432/test"
PROBE = (
    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT ctid FROM homing_jobs WHERE type = 't' "
    "AND state = 'ready' AND batch_id IS NULL AND run_at <= extract(epoch FROM now()) "
    "ORDER BY priority DESC, run_at, seq LIMIT 1"
)


def _run_worker(url: str, counter: Any) -> None:
    """A homing worker process (``App.run()`` defaults) counting the jobs it ran."""
    import logging

    from homing.worker import App

    logging.getLogger("homing").setLevel(logging.ERROR)
    app = App(homing.connect(url, migrate=False))

    @app.job("t")
    def noop(job: Any, ctx: Any) -> None:
        with counter.get_lock():
            counter.value += 1

    app.run()


class _ApiConsumer:
    """The job API in this process: grab_many(limit=batch) + complete_many, one at a time."""

    def __init__(self, db: homing.Database, batch: int) -> None:
        self.db, self.batch, self.done = db, batch, 0

    def step(self) -> bool:
        taken = self.db.grab_many("t", lock_for=60, limit=self.batch)
        if taken:
            self.db.complete_many(taken)
            self.done += len(taken)
        return bool(taken)

    def stop(self) -> None:
        pass


class _WorkerConsumer:
    """One homing worker process; this process polls its count every 10 ms."""

    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("fork")
        self.counter = ctx.Value("q", 0)
        self.proc = ctx.Process(target=_run_worker, args=(url, self.counter), daemon=True)
        self.proc.start()

    @property
    def done(self) -> int:
        return int(self.counter.value)

    def step(self) -> bool:
        time.sleep(0.01)
        return self.proc.is_alive()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join(5)


def drain(jobs: int, batch: int, limit_s: float, jit: str, consumer: str) -> dict[str, Any]:
    schema = f"backlog_{jit}_{int(time.time())}"
    url = f"{PG}?schema={schema}" + ("&options=-c%20jit%3Don" if jit == "on" else "")
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    slices: list[dict[str, Any]] = []
    try:
        with psycopg.connect(PG, autocommit=True, options=f"-c search_path={schema}") as conn:
            for start in range(0, jobs, 5000):
                db.insert_many([("t", {"i": start + i}) for i in range(min(5000, jobs - start))])
            conn.execute("ANALYZE homing_jobs")
            step = max(batch, jobs // 10)
            runner: _ApiConsumer | _WorkerConsumer = (
                _ApiConsumer(db, batch) if consumer == "api" else _WorkerConsumer(url)
            )
            started = time.perf_counter()
            mark, mark_at = 0, started
            try:
                while time.perf_counter() - started < limit_s and runner.done < jobs:
                    if not runner.step():
                        break
                    if runner.done - mark >= step or runner.done >= jobs:
                        now = time.perf_counter()
                        slices.append(
                            {
                                "drained": runner.done,
                                "rate": (runner.done - mark) / (now - mark_at),
                                "probe_buffers": _probe_buffers(conn),
                            }
                        )
                        mark, mark_at = runner.done, time.perf_counter()
                elapsed = time.perf_counter() - started
                done = runner.done
            finally:
                runner.stop()
    finally:
        db.close()
        with psycopg.connect(PG, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return {
        "jit": jit,
        "consumer": consumer,
        "drained": done,
        "elapsed_s": elapsed,
        "rate": done / elapsed,
        "slices": slices,
    }


def _probe_buffers(conn: psycopg.Connection) -> int:
    top = conn.execute(PROBE).fetchone()[0][0]["Plan"]  # type: ignore[index]
    return int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--limit-s", type=float, default=40.0)
    ap.add_argument("--jit", nargs="+", default=["default", "on"], choices=["default", "on"])
    ap.add_argument("--consumer", nargs="+", default=["api"], choices=["api", "worker"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    runs = []
    for consumer in args.consumer:
        for jit in args.jit:
            runs.append(_report(drain(args.jobs, args.batch, args.limit_s, jit, consumer), args))
    if args.out:
        doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "jobs": args.jobs, "runs": runs}
        args.out.write_text(json.dumps(doc, indent=2))
    return 0


def _report(r: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    label = "homing's sessions (jit off)" if r["jit"] == "default" else "URL option -c jit=on"
    how = f"grabs of {args.batch}" if r["consumer"] == "api" else "one worker process"
    print(
        f"{label}, {how}: {r['drained']:,} of {args.jobs:,} jobs in {r['elapsed_s']:.1f} s, "
        f"{r['rate']:,.0f} jobs/s",
        flush=True,
    )
    for s in r["slices"]:
        print(
            f"  up to {s['drained']:>7,}: {s['rate']:>8,.0f} jobs/s, ready-index probe "
            f"{s['probe_buffers']:>4} buffers",
            flush=True,
        )
    return r


if __name__ == "__main__":
    raise SystemExit(main())
