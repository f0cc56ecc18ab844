"""What an empty grab costs on PostgreSQL as finished jobs pile up before VACUUM.

``python bench/grab_cost.py [--points 0 10000 50000] [--out bench/results/grab_cost.json]``

For each point K: a fresh schema with autovacuum off; K jobs inserted, grabbed and
completed (so their old row versions and index entries are dead but not vacuumed); then
the grab of an empty queue is run through ``EXPLAIN (ANALYZE, BUFFERS)`` (the exact
statements homing sends, captured from the job API) and timed from the client, next to
the raw SKIP LOCKED loop of ``bench/drivers/raw_sql.py`` on a table that went through the
same K jobs. Reported: shared buffers touched and EXPLAIN ANALYZE's execution time per
empty grab, the server process's CPU per empty grab (from /proc, 3,000 prepared
executions; homing's in a session of its lease pool, as its grabs run, with one generic
plan; the raw loop's as it runs, planned at every call by the server's default, and again
with one generic plan), and client round-trip time (median of 200). The server CPU ratio
homing / raw is the target's; both raw figures are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import homing  # noqa: E402
from bench.common import proc_stat  # noqa: E402
from homing.store import holders_queries as hq  # noqa: E402
from homing.store import jobs_queries as q  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432/test"
RAW_DDL = (
    "CREATE TABLE raw_jobs (id BIGSERIAL PRIMARY KEY, state SMALLINT NOT NULL DEFAULT 0, "
    "payload TEXT NOT NULL) WITH (autovacuum_enabled = false)",
    "CREATE INDEX raw_jobs_ready ON raw_jobs (id) WHERE state = 0",
)
RAW_GRAB = (
    "UPDATE raw_jobs SET state = 1 WHERE id IN (SELECT id FROM raw_jobs WHERE state = 0 "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload"
)


def explain(conn: psycopg.Connection, sql: str, params: Any) -> tuple[int, float]:
    """(shared buffers hit+read, execution ms) of one statement, rolled back; the median of
    5 runs, taken after the timed runs (so dead index entries are already marked killed, as
    they are for a grabber that polls)."""
    runs = []
    for _ in range(5):
        with conn.transaction(force_rollback=True):
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
        top = plan[0][0]  # type: ignore[index]
        runs.append((_buffers(top["Plan"]), float(top["Execution Time"])))
    return int(statistics.median(r[0] for r in runs)), statistics.median(r[1] for r in runs)


def _buffers(node: dict[str, Any]) -> int:
    own = int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
    return max([own] + [_buffers(c) for c in node.get("Plans", [])])


class _Capture:
    """A stand-in transaction that records the grab's statements instead of running them."""

    def __init__(self, tx: Any) -> None:
        self.real = tx
        self.statements: list[tuple[str, list[Any]]] = []
        self.sql = getattr(tx, "sql", None)  # (absent before the dialect objects)
        self.store = tx.store
        self.dialect = tx.dialect

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        self.statements.append((self.real._sql(sql), list(params)))
        return []

    execute = query

    def rowcount(self, sql: str, params: Any = ()) -> int:
        self.query(sql, params)
        return 0


def homing_point(k: int, schema: str) -> dict[str, Any]:
    url = f"{PG}?schema={schema}"
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    with db.store.transaction() as tx:
        tx.execute("ALTER TABLE homing_jobs SET (autovacuum_enabled = false)")
    for start in range(0, k, 1000):
        n = min(1000, k - start)
        db.insert_many([("t", {"i": start + i}) for i in range(n)])
        db.complete_many(db.grab_many("t", lock_for=60, limit=n))
    # the statements of one empty grab, captured from the job API
    with db.store.transaction() as tx:
        holder = hq.register_holder(tx, "h", 1, "w", now=time.time())
        cap = _Capture(tx)
        lease = q.Lease(homing.uuid7(), time.time() + 60, holder)
        q.grab_jobs(cap, ["t"], now=time.time(), lease=lease, limit=1, where=None)  # type: ignore[arg-type]
    times = []
    for _ in range(200):
        t = time.perf_counter()
        assert db.grab_many("t", lock_for=60, limit=1) == []
        times.append(time.perf_counter() - t)
    # in a session of homing's lease pool, where its grabs run (generic plan, no JIT)
    with db.store.statement(durable=False) as tx:
        cpu_us = sum(server_cpu_us(tx.connection, sql, params) for sql, params in cap.statements)
    db.close()
    with psycopg.connect(PG, autocommit=True, options=f"-c search_path={schema}") as conn:
        plans = [explain(conn, sql, params) for sql, params in cap.statements]
    return {
        "statements": len(plans),
        "buffers": sum(p[0] for p in plans),
        "server_ms": sum(p[1] for p in plans),
        "server_cpu_us": cpu_us,
        "client_us": statistics.median(times) * 1e6,
    }


def server_cpu_us(conn: Any, sql: str, params: Any, runs: int = 3000) -> float:
    """The CPU time of the server process (from /proc: user + system) per execution of one
    statement, prepared, over ``runs`` executions after a warm-up: what the statement costs
    the server, parse-free, without EXPLAIN ANALYZE's per-node timing (which weighs on a
    plan of many nodes more than on one of a few). Linux, and a server on this machine."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    for _ in range(20):
        conn.execute(sql, params, prepare=True).fetchall()
    before = proc_stat(pid)[1]
    for _ in range(runs):
        conn.execute(sql, params, prepare=True).fetchall()
    return (proc_stat(pid)[1] - before) / runs * 1e6


def raw_point(k: int, schema: str) -> dict[str, Any]:
    with psycopg.connect(PG, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    with psycopg.connect(PG, autocommit=True, options=f"-c search_path={schema}") as conn:
        for ddl in RAW_DDL:
            conn.execute(ddl)
        for start in range(0, k, 1000):
            n = min(1000, k - start)
            conn.execute(
                "INSERT INTO raw_jobs (payload) SELECT 'x' FROM generate_series(1, %s)", (n,)
            )
            ids = [r[0] for r in conn.execute(RAW_GRAB, (n,)).fetchall()]
            conn.execute("UPDATE raw_jobs SET state = 2 WHERE id = ANY(%s)", (ids,))
        times = []
        for _ in range(200):
            t = time.perf_counter()
            assert conn.execute(RAW_GRAB, (1,)).fetchall() == []
            times.append(time.perf_counter() - t)
        buffers, server_ms = explain(conn, RAW_GRAB, (1,))
        # as the raw loop runs (the server's default: it plans this statement at every call)
        cpu_us = server_cpu_us(conn, RAW_GRAB, (1,))
        # and with one generic plan, as homing's lease sessions keep for the grab
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("DEALLOCATE ALL", prepare=False)
        generic_cpu_us = server_cpu_us(conn, RAW_GRAB, (1,))
    return {
        "statements": 1,
        "buffers": buffers,
        "server_ms": server_ms,
        "server_cpu_us": cpu_us,
        "server_cpu_us_generic_plan": generic_cpu_us,
        "client_us": statistics.median(times) * 1e6,
    }


def _wal(conn: psycopg.Connection, sql: str, params: Any) -> int:
    """WAL bytes one statement writes (EXPLAIN ANALYZE executes it for real)."""
    plan = conn.execute("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + sql, params).fetchone()
    return int(plan[0][0]["Plan"].get("WAL Bytes", 0))  # type: ignore[index]


class _WalTx(_Capture):
    """Runs each statement of the job API under EXPLAIN (ANALYZE, WAL), summing its WAL."""

    def __init__(self, tx: Any, conn: psycopg.Connection) -> None:
        super().__init__(tx)
        self.conn = conn
        self.wal = 0

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        self.wal += _wal(self.conn, self.real._sql(sql), list(params))
        return []

    execute = query


def wal_per_job(jobs: int = 300) -> dict[str, float]:
    """WAL bytes per job of insert + grab + complete, one job per call, homing vs raw
    (statement WAL; each side also writes one commit record per statement)."""
    tag = f"wal_{int(time.time())}"
    out: dict[str, float] = {}
    try:
        db = homing.connect(f"{PG}?schema={tag}_h")
        assert isinstance(db, homing.Database)
        with psycopg.connect(PG, autocommit=True, options=f"-c search_path={tag}_h") as conn:
            with db.store.transaction() as tx:
                w = _WalTx(tx, conn)
                holder = hq.register_holder(tx, "host", 1, "worker", now=time.time())
            for _ in range(jobs):
                (new,) = db._ops.new_jobs([("t", {"i": 1, "p": "x" * 80})])
                q.insert_jobs(w, [new])  # type: ignore[arg-type]
                lease = q.Lease(homing.uuid7(), time.time() + 60, holder)
                q.grab_jobs(w, ["t"], now=time.time(), lease=lease, limit=1, where=None)  # type: ignore[arg-type]
                q.finish_leased(w, [(new.id, lease.token)], now=time.time())  # type: ignore[arg-type]
            (done,) = conn.execute(
                "SELECT count(*) FROM homing_jobs WHERE state = 'done'"
            ).fetchone()  # type: ignore[misc]
            assert done == jobs, done
            out["homing"] = w.wal / jobs
        db.close()
        with psycopg.connect(PG, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {tag}_r")
        with psycopg.connect(PG, autocommit=True, options=f"-c search_path={tag}_r") as conn:
            for ddl in RAW_DDL:
                conn.execute(ddl)
            total = 0
            for _ in range(jobs):
                total += _wal(
                    conn,
                    "INSERT INTO raw_jobs (payload) VALUES (%s)",
                    (json.dumps({"i": 1, "p": "x" * 80}),),
                )
                total += _wal(conn, RAW_GRAB, (1,))
                (last,) = conn.execute("SELECT max(id) FROM raw_jobs").fetchone()  # type: ignore[misc]
                total += _wal(conn, "UPDATE raw_jobs SET state = 2 WHERE id = ANY(%s)", ([last],))
            out["raw"] = total / jobs
    finally:
        with psycopg.connect(PG, autocommit=True) as admin:
            for kind in ("h", "r"):
                admin.execute(f"DROP SCHEMA IF EXISTS {tag}_{kind} CASCADE")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, nargs="*", default=[0, 10_000, 50_000])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "grab_cost.json")
    args = ap.parse_args()
    rows = []
    tag = f"{int(time.time())}"
    try:
        for k in args.points:
            h = homing_point(k, f"gc_h_{tag}_{k}")
            r = raw_point(k, f"gc_r_{tag}_{k}")
            rows.append({"finished_jobs": k, "homing": h, "raw": r})
            print(
                f"{k:>7} finished: homing {h['buffers']:>5} buffers, server CPU "
                f"{h['server_cpu_us']:>5.0f} us, EXPLAIN ANALYZE {h['server_ms'] * 1000:>5.0f} us, "
                f"client {h['client_us']:>5.0f} us | raw {r['buffers']:>5} buffers, server CPU "
                f"{r['server_cpu_us']:>5.0f} us ({r['server_cpu_us_generic_plan']:.0f} us with a "
                f"generic plan), EXPLAIN ANALYZE {r['server_ms'] * 1000:>5.0f} us, "
                f"client {r['client_us']:>5.0f} us | server CPU ratio "
                f"{h['server_cpu_us'] / max(r['server_cpu_us'], 1e-6):.2f}x",
                flush=True,
            )
    finally:
        with psycopg.connect(PG, autocommit=True) as admin:
            for k in args.points:
                for kind in ("h", "r"):
                    admin.execute(f"DROP SCHEMA IF EXISTS gc_{kind}_{tag}_{k} CASCADE")
    wal = wal_per_job()
    print(
        f"WAL per job (insert + grab + complete, statements): homing {wal['homing']:.0f} B, "
        f"raw {wal['raw']:.0f} B: {wal['homing'] / wal['raw']:.2f}x "
        f"({'PASS' if wal['homing'] <= 1.5 * wal['raw'] else 'FAIL'}, target <= 1.5x)"
    )
    last = rows[-1]
    ratio = last["homing"]["server_cpu_us"] / max(last["raw"]["server_cpu_us"], 1e-6)
    generic = last["homing"]["server_cpu_us"] / max(last["raw"]["server_cpu_us_generic_plan"], 1e-6)
    explained = last["homing"]["server_ms"] / max(last["raw"]["server_ms"], 1e-6)
    print(
        f"empty grab at {last['finished_jobs']} finished jobs: server CPU {ratio:.2f}x the raw "
        f"loop's ({'PASS' if ratio <= 2 else 'FAIL'}, target <= 2x); {generic:.2f}x the raw "
        f"loop's with a generic plan ({'PASS' if generic <= 2 else 'FAIL'}); EXPLAIN ANALYZE's "
        f"execution time (per-node timing, no planning) {explained:.2f}x; buffers "
        f"{last['homing']['buffers']} vs {last['raw']['buffers']}"
    )
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load": list(__import__("os").getloadavg()),
        "rows": rows,
        "wal_per_job": wal,
    }
    args.out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
