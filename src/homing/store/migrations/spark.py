"""Schema of the spark component: stream positions, Spark commits and consumer cursors.

- ``homing_jobs.staged_in``: the staged batch a Spark task wrote the row into. Unlike
  ``batch_id`` (cleared by a grab), it is never cleared, so a stream can still place the
  row by its batch's commit position after it was grabbed.
- ``homing_jobs.xid`` (PostgreSQL only): the inserting transaction's id. Sequence values are
  not visible in commit order on PostgreSQL; ``(xid, seq)`` read only below the snapshot's
  xmin is (see docs/spark.md).
- ``homing_spark_commits``: one row per Spark commit that made a staged batch visible, with a
  commit-ordered number (``commit_no``): SQLite's autoincrement under its single writer; on
  PostgreSQL a counter row in ``homing_spark_sequencer`` locked until the commit ends.
- ``homing_spark_cursors``: each stream consumer's durable cursor (the last committed end).
- ``homing_jobs_stream`` (version 2: built on demand): the index a stream reads plain rows
  through. Every job inserted or updated writes an entry into it, so it is no longer part
  of the schema: the first stream over a store builds it (``Store.ensure_stream_index``),
  and a store no stream reads pays nothing for it.
"""

from __future__ import annotations

from homing.store.migrations import Migration

# The stream index of each dialect; ensure_stream_index creates it with IF NOT EXISTS (and,
# on PostgreSQL, CONCURRENTLY, so that building it does not hold inserts back).
STREAM_INDEX_NAME = "homing_jobs_stream"
STREAM_INDEX_SQLITE = (
    "CREATE INDEX homing_jobs_stream ON homing_jobs (type, seq) WHERE staged_in IS NULL"
)
STREAM_INDEX_POSTGRES = (
    "CREATE INDEX homing_jobs_stream ON homing_jobs (type, xid, seq) WHERE staged_in IS NULL"
)

_SQLITE = (
    "ALTER TABLE homing_jobs ADD COLUMN staged_in TEXT",
    "CREATE INDEX homing_jobs_staged_in ON homing_jobs (staged_in, seq) WHERE staged_in IS NOT NULL",
    STREAM_INDEX_SQLITE,
    """CREATE TABLE homing_spark_commits (
        commit_no INTEGER PRIMARY KEY AUTOINCREMENT,
        staged_batch TEXT NOT NULL UNIQUE,
        sink TEXT NOT NULL,
        label TEXT NOT NULL,
        committed_at REAL NOT NULL,
        parents INTEGER NOT NULL DEFAULT 0,
        UNIQUE (sink, label)
    )""",
    """CREATE TABLE homing_spark_cursors (
        consumer TEXT NOT NULL,
        queue TEXT NOT NULL,
        position TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (consumer, queue)
    )""",
)

_POSTGRES = (
    "ALTER TABLE homing_jobs ADD COLUMN staged_in TEXT, "
    "ADD COLUMN xid BIGINT NOT NULL DEFAULT (pg_current_xact_id()::text::bigint)",
    "CREATE INDEX homing_jobs_staged_in ON homing_jobs (staged_in, seq) WHERE staged_in IS NOT NULL",
    STREAM_INDEX_POSTGRES,
    """CREATE TABLE homing_spark_sequencer (
        one INTEGER PRIMARY KEY CHECK (one = 1),
        n BIGINT NOT NULL
    )""",
    "INSERT INTO homing_spark_sequencer (one, n) VALUES (1, 0)",
    """CREATE TABLE homing_spark_commits (
        commit_no BIGINT PRIMARY KEY,
        staged_batch TEXT NOT NULL UNIQUE,
        sink TEXT NOT NULL,
        label TEXT NOT NULL,
        committed_at DOUBLE PRECISION NOT NULL,
        parents BIGINT NOT NULL DEFAULT 0,
        UNIQUE (sink, label)
    )""",
    """CREATE TABLE homing_spark_cursors (
        consumer TEXT NOT NULL,
        queue TEXT NOT NULL,
        position TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (consumer, queue)
    )""",
)

_DROP_STREAM_INDEX = (f"DROP INDEX IF EXISTS {STREAM_INDEX_NAME}",)

MIGRATIONS: list[Migration] = [
    Migration(1, "spark_streams", _SQLITE, _POSTGRES),
    Migration(2, "stream_index_on_demand", _DROP_STREAM_INDEX, _DROP_STREAM_INDEX),
]
