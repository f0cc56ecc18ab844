"""Single-job inserts/s on PostgreSQL from 1 and N producer processes, two versions alternated.

    .venv/bin/python -m bench.producers --base REV [--procs 1 4 8] [--seconds 3] [--pairs 3]

Each cell is a subprocess per producer on one version's ``src`` (REV in a temporary git
worktree, and the working tree), all inserting ``db.insert(type, args)`` one job a call
(one commit each, synchronous_commit=on) into a fresh schema for ``--seconds``; nobody
consumes. Many producers show what serialises commits across sessions (a NOTIFY takes a
database-wide lock from its commit until the commit is flushed); one producer shows the
cost of a single insert. Prints inserts/s per cell and the median ratio of the pairs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import revision_tree

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

_PRODUCER = r"""
import sys, time
import homing
url, start, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
db = homing.connect(url, migrate=False)
db.insert("warm", None)
while time.time() < start:
    time.sleep(0.001)
n, end = 0, start + seconds
while time.time() < end:
    db.insert("t", {"i": n, "p": "x" * 80})
    n += 1
print(n)
"""

_SETUP = r"""
import sys, homing
db = homing.connect(sys.argv[1])
db.close()
"""


def cell(src: Path, procs: int, seconds: float) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    schema = f"bench_producers_{os.getpid()}_{time.monotonic_ns()}"
    url = f"{PG}?schema={schema}"
    subprocess.run([sys.executable, "-c", _SETUP, url], env=env, check=True, timeout=120)
    try:
        start = time.time() + 1.5  # every process connected and warm before the window
        running = [
            subprocess.Popen(
                [sys.executable, "-c", _PRODUCER, url, str(start), str(seconds)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(procs)
        ]
        total = sum(int(p.communicate(timeout=seconds + 120)[0].strip()) for p in running)
    finally:
        import psycopg

        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return total / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    print(
        f"# python -m bench.producers --base {args.base} --procs "
        f"{' '.join(map(str, args.procs))} --seconds {args.seconds:g} --pairs {args.pairs}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs",
        flush=True,
    )
    with revision_tree(args.base) as base:
        for procs in args.procs:
            rates: dict[str, list[float]] = {"base": [], "head": []}
            for i in range(args.pairs):
                for side, tree in (("base", base), ("head", ROOT)):
                    rate = cell(tree / "src", procs, args.seconds)
                    rates[side].append(rate)
                    print(
                        f"{procs} producers, pair {i + 1} {side}: {rate:8,.0f} inserts/s",
                        flush=True,
                    )
            ratio = statistics.median(
                h / b for b, h in zip(rates["base"], rates["head"], strict=True)
            )
            print(
                f"{procs} producers: {args.base} {statistics.median(rates['base']):,.0f}/s, working "
                f"tree {statistics.median(rates['head']):,.0f}/s; median of pairs {ratio:.2f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
