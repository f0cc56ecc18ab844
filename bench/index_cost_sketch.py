"""What one of homing_jobs' B-trees costs the batched job path on PostgreSQL: a sketch to
decide a schema change before building it, as ``bench/narrow_row_sketch.py`` is.

    .venv/bin/python bench/index_cost_sketch.py [--rounds 3] [--cycles 400]

Each variant is a fresh schema migrated by homing, then altered in SQL only:

- ``as-is``: homing's schema.
- ``no-seq-key``: without the primary key on ``seq`` (every insert and every non-HOT
  update writes an entry into it, three a job), nothing in its place: the most it saves.
- ``seq-brin``: the same with a BRIN index on ``seq`` instead, what Spark's range reads
  (``seq > lo AND seq <= hi``) would need at the least.
- ``finished-brin``: the B-tree on ``finished_at`` (one entry a job, at completion)
  replaced by a BRIN index.

A subprocess per run loops insert_many(100), grab_many(100), complete_many on one
connection (after a warm-up) and reports its own CPU a job, the CPU of every PostgreSQL
process on the machine a job (so: an otherwise idle server) and the rate; the variants
alternate ``--rounds`` times. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

VARIANTS: dict[str, tuple[str, ...]] = {
    "as-is": (),
    "no-seq-key": ("ALTER TABLE homing_jobs DROP CONSTRAINT homing_jobs_pkey",),
    "seq-brin": (
        "ALTER TABLE homing_jobs DROP CONSTRAINT homing_jobs_pkey",
        "CREATE INDEX homing_jobs_seq_brin ON homing_jobs USING brin (seq)",
    ),
    "finished-brin": (
        "DROP INDEX homing_jobs_finished",
        "CREATE INDEX homing_jobs_finished_brin ON homing_jobs USING brin (finished_at)",
    ),
}

_RUN = r"""
import json, os, sys, time
import homing
url, cycles, ddl = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
schema = f"index_cost_{os.getpid()}"
db = homing.connect(f"{url}?schema={schema}")
db.migrate()
with db.store.transaction() as tx:
    for statement in ddl:
        tx.execute(statement)

def server_cpu():
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                if not f.read().startswith("postgres"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")

def cycle():
    db.insert_many([("t", {"i": i, "p": "x" * 80}) for i in range(100)])
    db.complete_many(db.grab_many(["t"], lock_for=60, limit=100))

for _ in range(5):
    cycle()
server, wall, cpu = server_cpu(), time.perf_counter(), time.process_time()
for _ in range(cycles):
    cycle()
wall, cpu, server = time.perf_counter() - wall, time.process_time() - cpu, server_cpu() - server
with db.store.transaction() as tx:
    tx.execute(f"DROP SCHEMA {schema} CASCADE")
db.close()
jobs = cycles * 100
print(json.dumps({"client_us": cpu / jobs * 1e6, "server_us": server / jobs * 1e6,
                  "jobs_per_s": jobs / wall}))
"""


def run(variant: str, cycles: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _RUN, PG, str(cycles), json.dumps(VARIANTS[variant])],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    args = parser.parse_args()
    print(
        f"# bench/index_cost_sketch.py --rounds {args.rounds} --cycles {args.cycles}  "
        f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load "
        f"{os.getloadavg()[0]:.2f})",
        flush=True,
    )
    results: dict[str, list[dict[str, float]]] = {v: [] for v in args.variants}
    for k in range(args.rounds):
        for variant in args.variants:
            r = run(variant, args.cycles)
            results[variant].append(r)
            print(
                f"round {k + 1} {variant:14} {r['jobs_per_s']:8,.0f} jobs/s  client "
                f"{r['client_us']:5.1f} us/job  server {r['server_us']:5.1f} us/job",
                flush=True,
            )
    base = results[args.variants[0]]
    for variant in args.variants:
        rate = statistics.median(r["jobs_per_s"] for r in results[variant])
        server = statistics.median(r["server_us"] for r in results[variant])
        print(
            f"median {variant:14} {rate:8,.0f} jobs/s ({rate / statistics.median(r['jobs_per_s'] for r in base):.2f}x)"
            f"  server {server:5.1f} us/job"
            f" ({server / statistics.median(r['server_us'] for r in base):.2f}x)"
        )


if __name__ == "__main__":
    main()
