"""Job API throughput: insert-only and full cycle (insert, grab, complete), durable.

One job per transaction and batched, on SQLite and PostgreSQL, in one process, each store
fresh. Prints a table and writes bench/results/jobs.json. Run: `python bench/jobs.py`
(`--n 2000 --batch 100`). Absolute numbers follow the disk's fsync rate (noisy here);
compare rows from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import homing

PG = os.environ.get("HOMING_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
PAYLOAD = {"body": "x" * 88}  # about 100 bytes of JSON


def fresh_url(backend: str, tmp: Path) -> tuple[str, Any]:
    if backend == "sqlite":
        return f"sqlite:///{tmp / (uuid.uuid4().hex + '.db')}", None
    schema = "bench_" + uuid.uuid4().hex[:10]

    def drop() -> None:
        import psycopg

        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    return f"{PG}?schema={schema}", drop


def run_case(url: str, n: int, batch: int, durable: bool) -> dict[str, float]:
    db = homing.connect(url, durable=durable)
    assert isinstance(db, homing.Database)
    try:
        t0 = time.perf_counter()
        if batch == 1:
            for _ in range(n):
                db.insert("bench", PAYLOAD)
        else:
            for _ in range(0, n, batch):
                db.insert_many([("bench", PAYLOAD)] * batch)
        t1 = time.perf_counter()
        done = 0
        while done < n:
            if batch == 1:
                job = db.grab("bench", lock_for=60)
                assert job is not None
                db.complete(job)
                done += 1
            else:
                jobs = db.grab_many("bench", lock_for=60, limit=batch)
                db.complete_many(jobs)
                done += len(jobs)
        t2 = time.perf_counter()
        # full cycle: a fresh insert->grab->complete per job (or per batch)
        t3 = time.perf_counter()
        cycled = 0
        while cycled < n:
            if batch == 1:
                db.insert("cycle", PAYLOAD)
                job = db.grab("cycle", lock_for=60)
                assert job is not None
                db.complete(job)
                cycled += 1
            else:
                db.insert_many([("cycle", PAYLOAD)] * batch)
                jobs = db.grab_many("cycle", lock_for=60, limit=batch)
                db.complete_many(jobs)
                cycled += len(jobs)
        t4 = time.perf_counter()
        return {
            "insert_per_s": n / (t1 - t0),
            "drain_per_s": n / (t2 - t1),
            "full_cycle_per_s": n / (t4 - t3),
        }
    finally:
        db.close()


def fsync_rate(directory: Path, seconds: float = 1.0) -> float:
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    count, end = 0, time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            os.write(fd, b"x")
            os.fdatasync(fd)
            count += 1
    finally:
        os.close(fd)
        path.unlink()
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="jobs per case")
    parser.add_argument("--batch", type=int, default=100, help="batch size for the batched cases")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "jobs.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="homing-bench-"))
    rows = []
    for backend in args.backends.split(","):
        for durable in (True, False):
            for batch in (1, args.batch):
                url, drop = fresh_url(backend, tmp)
                probe = fsync_rate(tmp, 0.5)
                try:
                    result = run_case(url, args.n, batch, durable)
                finally:
                    if drop:
                        drop()
                rows.append(
                    {
                        "backend": backend,
                        "durable": durable,
                        "batch": batch,
                        "n": args.n,
                        "fsync_per_s": round(probe),
                        **{k: round(v) for k, v in result.items()},
                    }
                )
                r = rows[-1]
                print(
                    f"{backend:8} durable={durable!s:5} batch={batch:<4} insert {r['insert_per_s']:>7}/s  "
                    f"drain {r['drain_per_s']:>7}/s  full cycle {r['full_cycle_per_s']:>7}/s  "
                    f"(fsync probe {r['fsync_per_s']}/s)",
                    flush=True,
                )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "rows": rows,
            },
            indent=2,
        )
    )
    print(
        "\n| backend | durable | batch | insert/s | drain/s | full cycle/s | fsync/s |\n|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['backend']} | {r['durable']} | {r['batch']} | {r['insert_per_s']} | {r['drain_per_s']} | "
            f"{r['full_cycle_per_s']} | {r['fsync_per_s']} |"
        )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
