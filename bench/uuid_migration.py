"""What the upgrade to native uuid job ids (schema jobs 8) costs a PostgreSQL store.

    .venv/bin/python bench/uuid_migration.py [--jobs 1000000]

Builds a store at jobs version 7 (text ids), fills it with ``--jobs`` jobs (a tenth ready,
the rest done, 80-byte args), VACUUM ANALYZE, then opens it with the current homing, which
applies version 8: ``ALTER TABLE ... TYPE uuid`` rewrites ``homing_jobs`` and its indexes
under an exclusive lock, so this time is how long inserts, grabs and completions wait.
Prints the time and the table's size (with indexes) before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import psycopg  # noqa: E402

import homing  # noqa: E402
from homing.store.migrations import jobs as job_schema  # noqa: E402

PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "bench_uuid_migration"
_FILL = (
    "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, created_at, "
    "finished_at) SELECT gen_random_uuid()::text, 't', jsonb_build_object('i', g, 'p', "
    "repeat('x', 80)), CASE WHEN g %% 10 = 0 THEN 'ready' ELSE 'done' END, 0, 0, 0, "
    "CASE WHEN g %% 10 = 0 THEN NULL ELSE 1 END FROM generate_series(1, %s) g"
)
_SIZE = "SELECT pg_total_relation_size('homing_jobs')"


def _session() -> psycopg.Connection:
    return psycopg.connect(PG, autocommit=True, options=f"-c search_path={SCHEMA}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    args = ap.parse_args()
    with psycopg.connect(PG, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    url = f"{PG}?schema={SCHEMA}"
    current = job_schema.MIGRATIONS
    job_schema.MIGRATIONS = current[:7]  # the schema before native uuids
    try:
        homing.connect(url).close()
    finally:
        job_schema.MIGRATIONS = current
    try:
        with _session() as conn:
            conn.execute(_FILL, (args.jobs,))
            conn.execute("VACUUM ANALYZE homing_jobs")
            before = conn.execute(_SIZE).fetchone()[0]  # type: ignore[index]
        started = time.perf_counter()
        db = homing.connect(url)  # applies jobs 8
        took = time.perf_counter() - started
        db.close()
        with _session() as conn:
            after = conn.execute(_SIZE).fetchone()[0]  # type: ignore[index]
            kind = conn.execute(
                "SELECT data_type FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = 'homing_jobs' AND column_name = 'id'",
                (SCHEMA,),
            ).fetchone()[0]  # type: ignore[index]
    finally:
        with psycopg.connect(PG, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    print(
        f"{args.jobs:,} jobs: upgrade to jobs 8 took {took:.1f} s (id is {kind} now); "
        f"homing_jobs with its indexes {before / 2**20:,.0f} MB before, {after / 2**20:,.0f} MB after"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
