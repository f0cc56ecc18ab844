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
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import homing  # noqa: E402
from bench.wal_records import PG, scratch_schema  # noqa: E402
from homing.store.migrations import jobs as job_schema  # noqa: E402

_FILL = (
    "INSERT INTO homing_jobs (id, type, args, state, run_at, available_at, created_at, "
    "finished_at) SELECT gen_random_uuid()::text, 't', jsonb_build_object('i', g, 'p', "
    "repeat('x', 80)), CASE WHEN g %% 10 = 0 THEN 'ready' ELSE 'done' END, 0, 0, 0, "
    "CASE WHEN g %% 10 = 0 THEN NULL ELSE 1 END FROM generate_series(1, %s) g"
)
_SIZE = "SELECT pg_total_relation_size('homing_jobs')"
_ID_TYPE = (
    "SELECT data_type FROM information_schema.columns WHERE table_schema = %s "
    "AND table_name = 'homing_jobs' AND column_name = 'id'"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    args = ap.parse_args()
    with scratch_schema("bench_uuid_migration") as (_admin, conn, schema):
        url = f"{PG}?schema={schema}"
        current = job_schema.MIGRATIONS
        job_schema.MIGRATIONS = current[:7]  # the schema before native uuids
        try:
            homing.connect(url).close()
        finally:
            job_schema.MIGRATIONS = current
        conn.execute(_FILL, (args.jobs,))
        conn.execute("VACUUM ANALYZE homing_jobs")
        before = conn.execute(_SIZE).fetchone()[0]  # type: ignore[index]
        started = time.perf_counter()
        homing.connect(url).close()  # applies jobs 8
        took = time.perf_counter() - started
        after = conn.execute(_SIZE).fetchone()[0]  # type: ignore[index]
        kind = conn.execute(_ID_TYPE, (schema,)).fetchone()[0]  # type: ignore[index]
    print(
        f"{args.jobs:,} jobs: upgrade to jobs 8 took {took:.1f} s (id is {kind} now); "
        f"homing_jobs with its indexes {before / 2**20:,.0f} MB before, {after / 2**20:,.0f} MB after"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
