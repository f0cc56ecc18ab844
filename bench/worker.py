"""Benchmark of the worker runtime through real ``homing worker`` processes.

    .venv/bin/python bench/worker.py [--jobs 3000] [--backends sqlite,postgres]
                                     [--concurrency 1,4,16] [--not-durable]

For each backend, handler (``noop``; ``effect``: one row written through ``ctx.connection``
in the job's transaction) and concurrency: a fresh store, one worker process started and
ready, then ``--jobs`` jobs inserted in one transaction; jobs/s = jobs / (time from that
commit until the last job is done). Then the insert-to-start latency: an idle worker
(concurrency 4), 200 jobs inserted one by one 20 ms apart; latency = handler start minus
the job's ``created_at`` (p50, p99). Prints a table; writes bench/results/worker.json.

This file is also the app the worker processes run (``--app bench/worker.py:app``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import homing
from homing.worker import App, JobContext

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results" / "worker.json"
PG_BASE = os.environ.get("HOMING_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

app = App(lock_for=30)

EFFECTS_DDL = "CREATE TABLE effects (job_id TEXT NOT NULL, started REAL NOT NULL)"
INSERT_EFFECT = {
    "sqlite": "INSERT INTO effects (job_id, started) VALUES (?, ?)",
    "postgres": "INSERT INTO effects (job_id, started) VALUES (%s, %s)",
}


@app.job("noop")
def noop(job: homing.Job, ctx: JobContext) -> None:
    return None


@app.job("effect")
def effect(job: homing.Job, ctx: JobContext) -> None:
    ctx.connection.execute(INSERT_EFFECT[ctx.dialect], (job.id, time.time()))


@app.job("latency")
def latency(job: homing.Job, ctx: JobContext) -> None:
    started = time.time()
    ctx.connection.execute(INSERT_EFFECT[ctx.dialect], (job.id, started - job.created_at))


# -- the harness ---------------------------------------------------------------------------
class Store:
    """A fresh store of one backend, dropped afterwards."""

    def __init__(self, backend: str, durable: bool, tmp: Path) -> None:
        self.backend = backend
        self.schema = None
        if backend == "sqlite":
            self.url = f"sqlite:///{tmp / (uuid.uuid4().hex[:8] + '.db')}"
        else:
            self.schema = f"bench_worker_{uuid.uuid4().hex[:8]}"
            sep = "&" if "?" in PG_BASE else "?"
            self.url = f"{PG_BASE}{sep}schema={self.schema}"
        if not durable:
            self.url += ("&" if "?" in self.url else "?") + "durable=false"
        db = homing.connect(self.url)
        assert isinstance(db, homing.Database)
        self.db = db
        with db.transaction() as tx:
            tx.connection.execute(EFFECTS_DDL)

    def close(self) -> None:
        self.db.close()
        if self.schema is not None:
            import psycopg

            with psycopg.connect(PG_BASE, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def start_worker(url: str, concurrency: int, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "homing",
            "--db",
            url,
            "worker",
            "--app",
            f"{HERE}:app",
            "--concurrency",
            str(concurrency),
            "--log-level",
            "warning",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    deadline = time.monotonic() + 60
    while b" ready: " not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{log.read_text()}")
        time.sleep(0.02)
    return proc


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def done_count(db: homing.Database, type_: str) -> int:
    return sum(r["done"] for r in db.stats(window=1) if r["type"] == type_)


def throughput(
    backend: str, handler: str, concurrency: int, jobs: int, durable: bool, tmp: Path
) -> dict[str, Any]:
    store = Store(backend, durable, tmp)
    proc = start_worker(store.url, concurrency, tmp / f"{backend}-{handler}-{concurrency}.log")
    try:
        store.db.insert_many([(handler, {"i": i}) for i in range(jobs)])
        t0 = time.perf_counter()
        deadline = t0 + 600
        while done_count(store.db, handler) < jobs:
            if time.perf_counter() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{backend}/{handler}/c={concurrency} did not finish")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
    finally:
        stop_worker(proc)
        store.close()
    return {
        "backend": backend,
        "handler": handler,
        "concurrency": concurrency,
        "jobs": jobs,
        "seconds": round(elapsed, 3),
        "jobs_per_s": round(jobs / elapsed, 1),
    }


def insert_to_start(backend: str, samples: int, durable: bool, tmp: Path) -> dict[str, Any]:
    store = Store(backend, durable, tmp)
    proc = start_worker(store.url, 4, tmp / f"{backend}-latency.log")
    try:
        time.sleep(1.0)  # let the worker settle into its idle wait
        for i in range(samples):
            store.db.insert("latency", {"i": i})
            time.sleep(0.02)
        deadline = time.monotonic() + 60
        while done_count(store.db, "latency") < samples and time.monotonic() < deadline:
            time.sleep(0.05)
        with store.db.transaction() as tx:
            values = sorted(float(r[1]) for r in tx.connection.execute("SELECT * FROM effects"))
    finally:
        stop_worker(proc)
        store.close()
    if len(values) < samples:
        raise RuntimeError(f"only {len(values)} of {samples} latency jobs ran on {backend}")
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "backend": backend,
        "samples": samples,
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "max_ms": round(values[-1] * 1000, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--handlers", default="noop,effect")
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument(
        "--not-durable",
        action="store_true",
        help="SQLite synchronous=OFF / PostgreSQL synchronous_commit=off",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    durable = not args.not_durable
    backends = [b for b in args.backends.split(",") if b]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    handlers = [h for h in args.handlers.split(",") if h]
    rows: list[dict[str, Any]] = []
    lat: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="homing-bench-worker-") as d:
        tmp = Path(d)
        for backend in backends:
            for handler in handlers:
                for c in levels:
                    row = throughput(backend, handler, c, args.jobs, durable, tmp)
                    rows.append(row)
                    print(
                        f"  {backend:8} {handler:6} c={c:<3} {row['jobs_per_s']:>8.1f} jobs/s",
                        flush=True,
                    )
            if args.latency_samples:
                lat.append(insert_to_start(backend, args.latency_samples, durable, tmp))
                print(
                    f"  {backend:8} latency p50={lat[-1]['p50_ms']} ms p99={lat[-1]['p99_ms']} ms",
                    flush=True,
                )
    print()
    print(f"{'backend':9}{'handler':8}" + "".join(f"{'c=' + str(c):>11}" for c in levels))
    for backend in backends:
        for handler in handlers:
            cells = [r for r in rows if r["backend"] == backend and r["handler"] == handler]
            print(f"{backend:9}{handler:8}" + "".join(f"{r['jobs_per_s']:>11.1f}" for r in cells))
    print(
        f"jobs/s through one `homing worker` process; durable={durable}; {args.jobs} jobs per cell"
    )
    for r in lat:
        print(
            f"insert-to-start on {r['backend']}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
            f"max {r['max_ms']} ms ({r['samples']} jobs, idle worker)"
        )
    load = os.getloadavg()
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_end": [round(x, 2) for x in load],
        },
        "durable": durable,
        "throughput": rows,
        "latency": lat,
        "note": "noisy shared machine: other processes were running; compare within a run",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} (load average {load[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
