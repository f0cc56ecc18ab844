"""What issue 17's item 3 could save: WAL per job of a sketched split schema, in SQL only.

    .venv/bin/python bench/narrow_row_sketch.py [--jobs 300]

Not homing's code: a measurement to decide the schema change before building it. Three
layouts run insert + grab + complete one job at a time, their WAL read by record type
(``pg_walinspect``, as ``bench/wal_records.py``):

- ``raw``: the raw SKIP LOCKED loop of ``bench/grab_cost.py`` (bigint key, one table).
- ``homing``: the job API on homing's current schema.
- ``split``: the job's body (id as native uuid, type, args, created_at) written once in a
  table of its own; the mutable part (state, due time, priority, lease as uuid) in a narrow
  queue row keyed by the body's bigint; a completion deletes the queue row and appends one
  row to an unindexed log of outcomes (what a history or a retention sweep would read).
  Per job: the body's heap row and key, the queue row and its key plus the ready index,
  the leased version and its key plus the leases index, a delete, and the log row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench.wal_records import measure, scratch_schema, wal_of  # noqa: E402

SPLIT_DDL = (
    "CREATE TABLE jobs_body (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
    "id UUID NOT NULL UNIQUE, type TEXT NOT NULL, args JSONB NOT NULL, "
    "created_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE jobs_queue (seq BIGINT PRIMARY KEY, type TEXT NOT NULL, "
    "priority INTEGER NOT NULL DEFAULT 0, run_at DOUBLE PRECISION NOT NULL, "
    "state SMALLINT NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, "
    "lease UUID, lease_expires_at DOUBLE PRECISION)",
    "CREATE INDEX jobs_queue_ready ON jobs_queue (type, priority DESC, run_at, seq) "
    "WHERE state = 0",
    "CREATE INDEX jobs_queue_leases ON jobs_queue (type, lease_expires_at) WHERE state = 1",
    "CREATE TABLE jobs_outcomes (seq BIGINT NOT NULL, state SMALLINT NOT NULL, "
    "attempts INTEGER NOT NULL, finished_at DOUBLE PRECISION NOT NULL)",
)
SPLIT_INSERT = (
    "WITH b AS (INSERT INTO jobs_body (id, type, args, created_at) VALUES (%s, 't', %s, %s) "
    "RETURNING seq) INSERT INTO jobs_queue (seq, type, run_at) SELECT seq, 't', %s FROM b"
)
SPLIT_GRAB = (
    "UPDATE jobs_queue q SET state = 1, attempts = q.attempts + 1, lease = %s, "
    "lease_expires_at = %s FROM (SELECT seq FROM jobs_queue WHERE type = 't' AND state = 0 "
    "AND run_at <= %s ORDER BY priority DESC, run_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED) c "
    "WHERE q.seq = c.seq RETURNING q.seq"
)
SPLIT_COMPLETE = (
    "WITH d AS (DELETE FROM jobs_queue WHERE seq = %s AND lease = %s AND state = 1 "
    "RETURNING seq, attempts) INSERT INTO jobs_outcomes SELECT seq, 2, attempts, %s FROM d"
)


def split_layout(jobs: int) -> dict[str, Any]:
    payload = json.dumps({"i": 1, "p": "x" * 80})
    with scratch_schema("narrow") as (admin, conn, schema):
        for ddl in SPLIT_DDL:
            conn.execute(ddl)

        def one() -> None:
            now = time.time()
            conn.execute(SPLIT_INSERT, (uuid.uuid4(), payload, now, now))
            lease = uuid.uuid4()
            (seq,) = conn.execute(SPLIT_GRAB, (lease, now + 60, now + 1)).fetchone()  # type: ignore[misc]
            conn.execute(SPLIT_COMPLETE, (seq, lease, now))

        return wal_of(admin, one, jobs, 1, schema)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=300)
    args = ap.parse_args()
    results = {
        "raw": measure("raw", args.jobs, 1),
        "homing": measure("homing", args.jobs, 1),
        "split": split_layout(args.jobs),
    }
    for name, res in results.items():
        leaf = sum(r["per_job"] for r in res["records"] if r["record"] == "Btree INSERT_LEAF")
        print(
            f"{name:>6}: {res['bytes_per_job']:6.0f} B of WAL a job, {leaf:4.2f} B-tree leaf "
            f"insertions a job, {res['bytes_per_job'] / results['raw']['bytes_per_job']:.2f}x raw"
        )
        for r in res["records"]:
            if r["bytes_per_job"] >= 1:
                print(
                    f"    {r['record']:<24} {r['per_job']:6.2f} a job {r['bytes_per_job']:7.1f} B"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
