"""Server cost of each statement of the job path on PostgreSQL: insert, grab, completion.

    .venv/bin/python bench/statements.py [--batch 100] [--rounds 40] [--src DIR ...] [--raw]

The statements are the ones the job API sends (captured from ``jobs_queries``, not
copied), run over one connection of their own, prepared, with the server's default plan
choice, on a fresh schema each; per statement it reports the wall time of the round trip
and the CPU time of the server process that ran it (from /proc, 10 ms ticks summed over
the rounds). The completion is ``complete_each``'s (one lease). With several ``--src``
trees (e.g. a ``git archive`` of an older commit and ``src``) each round runs every tree
in turn, so that the machine's drift hits them alike; ``--raw`` adds the raw loop's
statements (bench/drivers/raw_sql.py) to each round. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

# What both children (homing's statements and the raw loop's) time a statement with: the
# wall time of its round trip and the CPU time of the server process ``pid`` that ran it.
# ``conn`` and ``pid`` are the child's own, bound before the first call; put before
# each child's text when it starts (``one_round``).
_TIMED = r"""
import json, os, sys, time
from bench.common import proc_stat


def timed(sql, params, totals, key):
    c0, t0 = proc_stat(pid)[1], time.perf_counter()
    cur = conn.execute(sql, params, prepare=True)
    rows = cur.fetchall() if cur.description else [None] * max(cur.rowcount, 0)
    totals[key][0] += time.perf_counter() - t0
    totals[key][1] += proc_stat(pid)[1] - c0
    return rows
"""

# One round of one tree, run in a child process whose PYTHONPATH is that tree's src.
_CHILD = r"""
import homing, psycopg
from homing.store import jobs_queries as q
from bench.grab_cost import _Capture as Capture

schema, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def captured(db, fn):
    with db.store.transaction() as tx:
        cap = Capture(tx)
        fn(cap)
    return cap.statements[0]


db = homing.connect(f"{sys.argv[4]}?schema={schema}")
conn = psycopg.connect(sys.argv[4], autocommit=True, options=f"-c search_path={schema}")
pid = conn.info.backend_pid


def lease_of(token, until, host, worker_pid, worker):
    # the holder registry (jobs schema 9), or in older trees the holder in the lease itself
    if "holder" not in q.Lease.__dataclass_fields__:
        return q.Lease(token, until, host, worker_pid, worker)
    from homing.store import holders_queries as hq

    with db.store.transaction() as tx:
        return q.Lease(token, until, hq.register_holder(tx, host, worker_pid, worker, now=time.time()))


args = {"seq": 1, "payload": "x" * 64}
totals = {k: [0.0, 0.0] for k in ("insert", "grab", "complete")}
for r in range(rounds):
    new = db._ops.new_jobs([("bench", args)] * batch)
    sql, params = captured(db, lambda c: q.insert_jobs(c, new))
    timed(sql, params, totals, "insert")
    lease = lease_of(homing.uuid7(), time.time() + 60, "host.example.org", 12345, "worker")
    sql, params = captured(
        db, lambda c: q.grab_jobs(c, ["bench"], now=time.time(), lease=lease, limit=batch, where=None)
    )
    rows = timed(sql, params, totals, "grab")
    assert len(rows) == batch, (len(rows), batch)
    pairs = [(j.id, lease.token) for j in new]
    sql, params = captured(db, lambda c: q.finish_leased(c, pairs, now=time.time()))
    done = timed(sql, params, totals, "complete")
    assert len(done) == batch, (len(done), batch)
db.close()
print(json.dumps(totals))
"""


# The raw loop's statements (bench/drivers/raw_sql.py: its DDL, grab and insert, and its
# completion), measured the same way; with ``--raw``, a pass runs them after the trees.
_RAW_CHILD = r"""
import psycopg
from bench.drivers.raw_sql import _PG_DDL, _PG_GRAB

schema, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
admin = psycopg.connect(sys.argv[4], autocommit=True)
admin.execute(f"CREATE SCHEMA {schema}")
conn = psycopg.connect(sys.argv[4], autocommit=True, options=f"-c search_path={schema}")
for ddl in _PG_DDL:
    conn.execute(ddl)
pid = conn.info.backend_pid

payloads = [json.dumps({"seq": i, "payload": "x" * 64}) for i in range(batch)]
totals = {k: [0.0, 0.0] for k in ("insert", "grab", "complete")}
for r in range(rounds):
    timed("INSERT INTO raw_jobs (payload) SELECT unnest(%s::text[])", (payloads,), totals, "insert")
    rows = timed(_PG_GRAB, (batch,), totals, "grab")
    assert len(rows) == batch, (len(rows), batch)
    timed("UPDATE raw_jobs SET state = 2 WHERE id = ANY(%s)", ([x[0] for x in rows],), totals, "complete")
print(json.dumps(totals))
"""
RAW = "raw loop"


def one_round(src: Path, schema: str, batch: int, rounds: int) -> dict[str, list[float]]:
    child = _RAW_CHILD if str(src) == RAW else _CHILD
    if str(src) == RAW:
        src = ROOT / "src"
    out = subprocess.run(
        [sys.executable, "-c", _TIMED + child, schema, str(batch), str(rounds), PG],
        env={**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"},
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, list[float]] = json.loads(out.stdout)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=40, help="statements of each kind a pass")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--src", type=Path, nargs="*", default=[ROOT / "src"])
    ap.add_argument("--raw", action="store_true", help="the raw loop's statements too")
    args = ap.parse_args()
    if args.raw:
        args.src = [*args.src, Path(RAW)]
    import psycopg

    print(
        f"# {' '.join(sys.argv)}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {os.getloadavg()[0]:.2f})"
    )
    totals: dict[str, dict[str, list[float]]] = {
        str(s): {k: [0.0, 0.0] for k in ("insert", "grab", "complete")} for s in args.src
    }
    tag = f"stm_{int(time.time())}"
    try:
        for p in range(args.passes):
            for i, src in enumerate(args.src):
                got = one_round(src, f"{tag}_{p}_{i}", args.batch, args.rounds)
                for k, (wall, cpu) in got.items():
                    totals[str(src)][k][0] += wall
                    totals[str(src)][k][1] += cpu
    finally:
        with psycopg.connect(PG, autocommit=True) as admin:
            for p in range(args.passes):
                for i in range(len(args.src)):
                    admin.execute(f"DROP SCHEMA IF EXISTS {tag}_{p}_{i} CASCADE")
    n = args.passes * args.rounds
    print(f"per statement of {args.batch} jobs, {n} of each: wall ms / server CPU ms")
    for src, kinds in totals.items():
        cells = "  ".join(
            f"{k} {w / n * 1e3:5.2f} / {c / n * 1e3:5.2f}" for k, (w, c) in kinds.items()
        )
        total_cpu = sum(c for _, c in kinds.values()) / n * 1e3
        print(f"{src}: {cells}  (server CPU {total_cpu:5.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
