"""Client CPU per job of the job API in one process, two versions of the code alternated.

    .venv/bin/python -m bench.api_cpu --base REV [--backend sqlite|postgres] [--pairs 3]
                                      [--consumer api|worker]

Each run is a subprocess on one version's ``src`` (REV checked out in a temporary git
worktree, and the working tree): insert_many of 100 jobs, grab_many 100, complete_many,
``--rounds`` times after a warm-up, on a fresh durable store. It prints the process's CPU
time per job (the store's own work included on SQLite, which runs in process; on
PostgreSQL the server's share is not counted) and the rate. The multi-process harness
cells mix this with fsync and the server; this isolates the Python side.

``--consumer worker``: instead, ``--rounds`` x 100 no-op jobs inserted first, then drained
by one ``homing.worker`` in the process (concurrency 4, its defaults otherwise): the
worker's own CPU per job (fetcher, runners, completer), timed from its start to the last
job's handler.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench.common import revision_tree, script_json

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

_LOOP = r"""
import json, os, sys, tempfile, time
import homing
backend, rounds = sys.argv[1], int(sys.argv[2])
if backend == "sqlite":
    url = f"sqlite:///{tempfile.mkdtemp()}/cpu.db"
else:
    url = f"{sys.argv[3]}?schema=api_cpu_{os.getpid()}"
db = homing.connect(url)
def one_round():
    db.insert_many([("t", {"i": i, "p": "x" * 80}) for i in range(100)])
    db.complete_many(db.grab_many(["t"], lock_for=60, limit=100))
for _ in range(5):
    one_round()
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(rounds):
    one_round()
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
if backend != "sqlite":
    with db.store.transaction() as tx:
        tx.execute(f"DROP SCHEMA api_cpu_{os.getpid()} CASCADE")
db.close()
print(json.dumps({"cpu_us_per_job": cpu / rounds / 100 * 1e6, "jobs_per_s": rounds * 100 / wall}))
"""


_WORKER = r"""
import json, logging, os, sys, tempfile, threading, time
import homing
from homing.worker import App
backend, rounds = sys.argv[1], int(sys.argv[2])
if backend == "sqlite":
    url = f"sqlite:///{tempfile.mkdtemp()}/cpu.db"
else:
    url = f"{sys.argv[3]}?schema=api_cpu_{os.getpid()}"
n = rounds * 100
with homing.connect(url) as db:
    for start in range(0, n, 1000):
        db.insert_many([("t", {"i": i, "p": "x" * 80}) for i in range(start, start + 1000)])
logging.getLogger("homing").setLevel(logging.WARNING)
app = App(url)
ran = [0]
finished = threading.Event()
@app.job("t")
def noop(job, ctx):
    ran[0] += 1
    if ran[0] >= n:
        finished.set()
worker = app.worker(concurrency=4)
wall, cpu = time.perf_counter(), time.process_time()
worker.start()
finished.wait(600)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
worker.stop()
if backend != "sqlite":
    with homing.connect(url, migrate=False) as db, db.store.transaction() as tx:
        tx.execute(f"DROP SCHEMA api_cpu_{os.getpid()} CASCADE")
print(json.dumps({"cpu_us_per_job": cpu / n * 1e6, "jobs_per_s": n / wall}))
"""


def run(src: Path, backend: str, rounds: int, consumer: str = "api") -> dict[str, float]:
    script = _WORKER if consumer == "worker" else _LOOP
    return script_json(src, script, backend, str(rounds), PG)  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--consumer", choices=["api", "worker"], default="api")
    args = ap.parse_args()
    sides: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    with revision_tree(args.base) as base:
        for i in range(args.pairs):
            for side, tree in (("base", base), ("head", ROOT)):
                r = run(tree / "src", args.backend, args.rounds, args.consumer)
                sides[side].append(r)
                print(
                    f"pair {i + 1}/{args.pairs} {side}: {r['cpu_us_per_job']:6.1f} us CPU/job, "
                    f"{r['jobs_per_s']:8,.0f} jobs/s",
                    flush=True,
                )
    pairs = [
        h["cpu_us_per_job"] / b["cpu_us_per_job"]
        for b, h in zip(sides["base"], sides["head"], strict=True)
    ]
    med = {s: statistics.median(r["cpu_us_per_job"] for r in v) for s, v in sides.items()}
    print(
        f"{args.backend} ({args.consumer}): CPU per job {args.base} {med['base']:.1f} us, working tree "
        f"{med['head']:.1f} us; head/base median of pairs {statistics.median(pairs):.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
