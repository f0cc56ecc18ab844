"""Where the job path's WAL goes on PostgreSQL: bytes and records per job, by record type.

    .venv/bin/python bench/wal_records.py [--jobs 300] [--batch 1] [--out FILE]

``bench/grab_cost.py`` gives one number (WAL per job, homing against the raw SKIP LOCKED
loop); this breaks both down by WAL record (``pg_walinspect``, shipped with PostgreSQL 15,
created here if missing): how many B-tree leaf insertions, heap inserts and updates,
row locks, commits and so on each job costs, and their bytes. Each side runs insert +
grab + complete through its own API (homing: ``insert_many`` / ``grab_many`` /
``complete_many``, one job a call by default) on a fresh schema, after a CHECKPOINT and a
warm-up, so that full-page images (reported apart) are mostly the pages new rows open.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import homing  # noqa: E402
from bench.grab_cost import PG, RAW_DDL, RAW_GRAB  # noqa: E402

PAYLOAD = {"i": 1, "p": "x" * 80}
# Only the records of the measured schema's relations, and the commits of the transactions
# that wrote them: the server's WAL is shared, and another session writing meanwhile (a
# test run beside this one) counted in its records too ({'raw': 148.4} B-tree leaf
# insertions a job once). {rels} is an alternation of the schema's file node numbers.
RECORDS = (
    "WITH r AS (SELECT * FROM pg_get_wal_records_info(%s, %s)), "
    "mine AS (SELECT * FROM r WHERE block_ref ~ 'rel [0-9]+/[0-9]+/({rels})\\M'), "
    "xids AS (SELECT DISTINCT xid FROM mine WHERE xid <> '0') "
    "SELECT resource_manager, record_type, count(*), sum(record_length), sum(fpi_length) "
    "FROM (SELECT * FROM mine UNION ALL SELECT * FROM r WHERE resource_manager = 'Transaction' "
    "AND xid IN (SELECT xid FROM xids)) w GROUP BY 1, 2 ORDER BY 4 DESC"
)
FILE_NODES = (
    "SELECT pg_relation_filenode(c.oid) FROM pg_class c WHERE c.relnamespace = %s::regnamespace "
    "AND pg_relation_filenode(c.oid) IS NOT NULL"
)


def _homing_round(db: homing.Database, batch: int) -> None:
    db.insert_many([("t", PAYLOAD) for _ in range(batch)])
    db.complete_many(db.grab_many("t", lock_for=60, limit=batch))


def _raw_round(conn: psycopg.Connection, batch: int) -> None:
    conn.execute(
        "INSERT INTO raw_jobs (payload) SELECT %s FROM generate_series(1, %s)",
        (json.dumps(PAYLOAD), batch),
    )
    ids = [r[0] for r in conn.execute(RAW_GRAB, (batch,)).fetchall()]
    conn.execute("UPDATE raw_jobs SET state = 2 WHERE id = ANY(%s)", (ids,))


@contextmanager
def scratch_schema(tag: str) -> Iterator[tuple[psycopg.Connection, psycopg.Connection, str]]:
    """(admin connection, connection on a fresh schema, the schema's name); the schema is
    dropped afterwards. pg_walinspect is created if missing."""
    schema = f"{tag}_{int(time.time())}"
    with psycopg.connect(PG, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            with psycopg.connect(PG, autocommit=True, options=f"-c search_path={schema}") as conn:
                yield admin, conn, schema
        finally:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def wal_of(
    admin: psycopg.Connection,
    run: Callable[[], None],
    rounds: int,
    jobs_per_round: int,
    schema: str,
) -> dict[str, Any]:
    """WAL records per job of ``rounds`` calls of ``run``, after a warm-up, a CHECKPOINT
    and three more calls (so that full-page images are mostly of the pages new rows open);
    only those of ``schema``'s relations and their transactions' commits (see RECORDS)."""
    for _ in range(max(3, 30 // jobs_per_round)):
        run()
    admin.execute("CHECKPOINT")
    for _ in range(3):
        run()
    start = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
    for _ in range(rounds):
        run()
    # homing's lease pool commits without waiting for the flush: wait until it is
    admin.execute("SELECT txid_current()")
    time.sleep(0.3)
    end = admin.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]  # type: ignore[index]
    nodes = [int(r[0]) for r in admin.execute(FILE_NODES, (schema,)).fetchall()]
    sql = RECORDS.replace("{rels}", "|".join(str(n) for n in nodes))  # integers only
    rows = admin.execute(sql, (start, end)).fetchall()  # type: ignore[call-overload]
    n = rounds * jobs_per_round
    records = [
        {
            "record": f"{r[0]} {r[1]}",
            "per_job": r[2] / n,
            "bytes_per_job": int(r[3]) / n,
            "fpi_bytes_per_job": int(r[4]) / n,
        }
        for r in rows
    ]
    return {
        "jobs": n,
        "bytes_per_job": sum(r["bytes_per_job"] for r in records),
        "records": records,
    }


def measure(side: str, jobs: int, batch: int) -> dict[str, Any]:
    """WAL records per job of ``jobs`` jobs through ``side`` ("homing" or "raw")."""
    rounds = max(1, jobs // batch)
    with scratch_schema(f"walrec_{side}") as (admin, conn, schema):
        if side == "raw":
            for ddl in RAW_DDL:
                conn.execute(ddl)
            return wal_of(admin, lambda: _raw_round(conn, batch), rounds, batch, schema)
        db = homing.connect(f"{PG}?schema={schema}")
        assert isinstance(db, homing.Database)
        try:
            return wal_of(admin, lambda: _homing_round(db, batch), rounds, batch, schema)
        finally:
            db.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    doc: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "batch": args.batch}
    for side in ("homing", "raw"):
        res = measure(side, args.jobs, args.batch)
        doc[side] = res
        print(
            f"{side}: {res['bytes_per_job']:.0f} B of WAL a job ({res['jobs']} jobs, batch {args.batch})"
        )
        for r in res["records"]:
            if r["bytes_per_job"] >= 1:
                fpi = (
                    f", of which full-page images {r['fpi_bytes_per_job']:.0f} B"
                    if r["fpi_bytes_per_job"] >= 1
                    else ""
                )
                print(
                    f"  {r['record']:<24} {r['per_job']:6.2f} a job {r['bytes_per_job']:7.1f} B{fpi}"
                )
    ratio = doc["homing"]["bytes_per_job"] / doc["raw"]["bytes_per_job"]
    print(f"homing / raw: {ratio:.2f}x")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
