"""Two costs of a grab that the harness does not isolate, REV against the working tree.

    .venv/bin/python -m bench.grab_cases --base REV [--batches 0 1000 5000]

1. **Drained staged batches.** Committed batches stay in the store for the retention (a
   Spark stream commits one per micro-batch). For each count: a fresh store, that many
   committed batches without jobs, and (PostgreSQL) one committed batch of 100,000 staged
   jobs waiting; the median time of ``grab_many(limit=10)`` (SQLite: an empty grab).
2. **Plans of a one-job grab** (PostgreSQL, working tree only): the grab's exact statement
   (captured from the job API), prepared and run 60 times on one session with the
   server's default ``plan_cache_mode`` and with ``force_generic_plan``; the median time
   and the custom/generic plan counts of ``pg_prepared_statements``.

Each side runs in a subprocess on its version's ``src`` (REV in a temporary git worktree).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench.common import revision_tree, script_json

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

_BATCHES = r"""
import json, os, statistics, sys, tempfile, time
import homing
from homing.store import jobs_queries as q
backend, drained, pg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
schema = f"bench_gc_{os.getpid()}"
url = f"{pg}?schema={schema}" if backend == "postgres" else f"sqlite:///{tempfile.mkdtemp()}/b.db"
db = homing.connect(url)
now = time.time()
with db.store.transaction() as tx:
    if backend == "postgres":
        q.open_batch(tx, "big", now=now)
        tx.execute(
            "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, created_at, "
            "batch_id) SELECT gen_random_uuid(), 'kid', '{}'::jsonb, 'ready', ?, ?, ?, "
            "'big' FROM generate_series(1, 100000)", (now, now, now))
        q.commit_batch(tx, "big", now=now)
    for i in range(drained):
        q.open_batch(tx, f"d{i}", now=now)
        q.commit_batch(tx, f"d{i}", now=now)
if backend == "postgres":
    with db.store.transaction() as tx:
        tx.execute("ANALYZE homing_jobs")
        tx.execute("ANALYZE homing_job_batches")
times = []
for _ in range(60):
    t = time.perf_counter()
    got = db.grab_many("kid", lock_for=60, limit=10)
    times.append(time.perf_counter() - t)
    if got:
        db.complete_many(got)
if backend == "postgres":
    with db.store.transaction() as tx:
        tx.execute(f"DROP SCHEMA {schema} CASCADE")
db.close()
print(json.dumps({"us": statistics.median(times[10:]) * 1e6}))
"""

_PLANS = r"""
import json, os, statistics, sys, time
import psycopg
import homing
from homing.store import jobs_queries as q
pg = sys.argv[1]
schema = f"bench_gp_{os.getpid()}"
db = homing.connect(f"{pg}?schema={schema}")
for _ in range(20):
    db.insert_many([("t", {"i": i}) for i in range(100)])
    db.complete_many(db.grab_many("t", lock_for=60, limit=100))

def lease_of(tx, token, until, host, pid, worker):
    # the holder registry (jobs schema 9), or in older trees the holder in the lease itself
    if "holder" not in q.Lease.__dataclass_fields__:
        return q.Lease(token, until, host, pid, worker)
    from homing.store import holders_queries as hq
    return q.Lease(token, until, hq.register_holder(tx, host, pid, worker, now=time.time()))

class Capture:
    def __init__(self, tx):
        self.real, self.sql, self.store, self.dialect = tx, tx.sql, tx.store, tx.dialect
        self.statements = []
    def query(self, sql, params=()):
        self.statements.append((self.real._sql(sql), list(params)))
        return []
    execute = query

with db.store.transaction() as tx:
    cap = Capture(tx)
    lease = lease_of(tx, homing.uuid7(), time.time() + 60, "h", 1, "w")
    q.grab_jobs(cap, ["t"], now=time.time(), lease=lease, limit=1, where=None)
sql, params = cap.statements[0]
out = {}
with psycopg.connect(pg, autocommit=True, options=f"-c search_path={schema}") as conn:
    for mode in ("auto", "force_generic_plan"):
        conn.execute(f"SET plan_cache_mode = {mode}")
        times = []
        for _ in range(60):
            t = time.perf_counter()
            conn.execute(sql, params, prepare=True).fetchall()
            times.append(time.perf_counter() - t)
        generic, custom = conn.execute(
            "SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements"
        ).fetchone()
        out[mode] = {"us": statistics.median(times[10:]) * 1e6, "generic": int(generic or 0),
                     "custom": int(custom or 0)}
        conn.execute("DEALLOCATE ALL")
        conn._prepared.clear()
    conn.execute(f"DROP SCHEMA {schema} CASCADE")
db.close()
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--batches", type=int, nargs="+", default=[0, 1000, 5000])
    args = ap.parse_args()
    print(
        f"# python -m bench.grab_cases --base {args.base} --batches "
        f"{' '.join(map(str, args.batches))}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    with revision_tree(args.base) as base:
        for backend in ("sqlite", "postgres"):
            what = "empty grab" if backend == "sqlite" else "grab of 10 from 100,000 staged"
            for n in args.batches:
                cells = {
                    side: script_json(tree / "src", _BATCHES, backend, str(n), PG, timeout=900)[
                        "us"
                    ]
                    for side, tree in (("base", base), ("head", ROOT))
                }
                print(
                    f"{backend:8} {what}, {n:>5} drained batches: {args.base} "
                    f"{cells['base']:8.0f} us, working tree {cells['head']:8.0f} us",
                    flush=True,
                )
    plans = script_json(ROOT / "src", _PLANS, PG, timeout=900)
    for mode, r in plans.items():
        print(
            f"postgres one-job empty grab, plan_cache_mode={mode}: {r['us']:.0f} us "
            f"({r['custom']} custom, {r['generic']} generic plans in 60 runs)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
