"""Schema of the job queue (seed 002)."""

from __future__ import annotations

from homing.store.migrations import Migration

# States: ready (waiting for run_at), running (leased), done, failed (perm-failed, "dead").
# available_at is when a grabber may take the job: run_at while ready, the lease expiry
# while running; one partial index then serves both fresh and lease-expired jobs.
# Staged jobs (batch_id set) are written invisibly, e.g. by Spark tasks, and become
# grabbable all at once when their batch is committed (one row update in
# homing_job_batches, not one per job); a grab clears batch_id, moving the job into the
# ordinary grab index.
_SQLITE = (
    """CREATE TABLE homing_jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        type TEXT NOT NULL,
        args TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL CHECK (state IN ('ready', 'running', 'done', 'failed')),
        run_at REAL NOT NULL,
        available_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        unique_key TEXT UNIQUE,
        lease_token TEXT,
        lease_expires_at REAL,
        holder_host TEXT,
        holder_pid INTEGER,
        holder_worker TEXT,
        created_at REAL NOT NULL,
        finished_at REAL,
        last_error TEXT,
        parent_id TEXT,
        batch_id TEXT
    )""",
    """CREATE INDEX homing_jobs_grab ON homing_jobs (type, priority DESC, available_at, seq)
       WHERE state IN ('ready', 'running') AND batch_id IS NULL""",
    """CREATE INDEX homing_jobs_staged ON homing_jobs (batch_id, type, priority DESC, seq)
       WHERE batch_id IS NOT NULL""",
    """CREATE INDEX homing_jobs_finished ON homing_jobs (finished_at)
       WHERE finished_at IS NOT NULL""",
    """CREATE TABLE homing_job_failures (
        job_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        host TEXT,
        pid INTEGER,
        worker TEXT,
        message TEXT NOT NULL
    )""",
    "CREATE INDEX homing_job_failures_job ON homing_job_failures (job_id)",
    """CREATE TABLE homing_job_batches (
        batch_id TEXT PRIMARY KEY,
        state TEXT NOT NULL CHECK (state IN ('open', 'committed', 'aborted')),
        created_at REAL NOT NULL,
        committed_at REAL,
        info TEXT
    )""",
)

_POSTGRES = (
    """CREATE TABLE homing_jobs (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        type TEXT NOT NULL,
        args JSONB NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL CHECK (state IN ('ready', 'running', 'done', 'failed')),
        run_at DOUBLE PRECISION NOT NULL,
        available_at DOUBLE PRECISION NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        unique_key TEXT UNIQUE,
        lease_token TEXT,
        lease_expires_at DOUBLE PRECISION,
        holder_host TEXT,
        holder_pid INTEGER,
        holder_worker TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        last_error TEXT,
        parent_id TEXT,
        batch_id TEXT
    )""",
    """CREATE INDEX homing_jobs_grab ON homing_jobs (type, priority DESC, available_at, seq)
       WHERE state IN ('ready', 'running') AND batch_id IS NULL""",
    """CREATE INDEX homing_jobs_staged ON homing_jobs (batch_id, type, priority DESC, seq)
       WHERE batch_id IS NOT NULL""",
    """CREATE INDEX homing_jobs_finished ON homing_jobs (finished_at)
       WHERE finished_at IS NOT NULL""",
    """CREATE TABLE homing_job_failures (
        job_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        host TEXT,
        pid INTEGER,
        worker TEXT,
        message TEXT NOT NULL
    )""",
    "CREATE INDEX homing_job_failures_job ON homing_job_failures (job_id)",
    """CREATE TABLE homing_job_batches (
        batch_id TEXT PRIMARY KEY,
        state TEXT NOT NULL CHECK (state IN ('open', 'committed', 'aborted')),
        created_at DOUBLE PRECISION NOT NULL,
        committed_at DOUBLE PRECISION,
        info TEXT
    )""",
    "ALTER TABLE homing_jobs SET (autovacuum_vacuum_scale_factor = 0.02, "
    "autovacuum_analyze_scale_factor = 0.02, fillfactor = 80)",
    "ALTER TABLE homing_job_batches SET (autovacuum_vacuum_scale_factor = 0.05)",
)

# Version 2: the grab reads ready jobs through an index of their own, so its cost does not
# depend on how many jobs are running or finished; expired leases are found through a
# second index ordered by expiry (see jobs_queries.ExpiryMarks); on PostgreSQL the unique
# key index holds only jobs that have a key.
_READY = (
    "CREATE INDEX homing_jobs_ready ON homing_jobs (type, priority DESC, run_at, seq) "
    "WHERE state = 'ready' AND batch_id IS NULL"
)
_LEASES = (
    "CREATE INDEX homing_jobs_leases ON homing_jobs (type, lease_expires_at) "
    "WHERE state = 'running'"
)
_V2_SQLITE = ("DROP INDEX homing_jobs_grab", _READY, _LEASES)
_V2_POSTGRES = (
    "DROP INDEX homing_jobs_grab",
    _READY,
    _LEASES,
    "CREATE UNIQUE INDEX homing_jobs_unique_key ON homing_jobs (unique_key) "
    "WHERE unique_key IS NOT NULL",
    "ALTER TABLE homing_jobs DROP CONSTRAINT homing_jobs_unique_key_key",
)

# Version 3: idle workers, so that an insert wakes as many workers as it inserted jobs
# instead of every one (see PostgresSql.insert_jobs). Unlogged on PostgreSQL: it is
# ephemeral (a crash empties it; workers register again at their next empty grab) and its
# writes need no WAL flush. SQLite has no notifications; the table is there, unused.
_IDLE = "homing_idle_workers (channel TEXT PRIMARY KEY, since {real} NOT NULL)"


# Version 4: the job features of issue 16 (see docs/jobs.md "Cancel, pause, limits,
# timeouts, periodic jobs").
# - cancelled_at: a cancelled job is stored as state 'failed' with cancelled_at set (the
#   CHECK on state cannot be changed in place on SQLite, and other components' migrations
#   add columns to homing_jobs, so the table cannot be rebuilt here); the API reports it as
#   state 'cancelled' and redrive refuses it.
# - timeout_s: a job's own timeout (the worker applies the shorter of it and its type's).
# - homing_job_types: per-type controls (pause, concurrency and rate limits, per-key
#   concurrency); read by grabbers at most twice a second, so an unused feature costs the
#   grab nothing.
# - homing_job_starts: the grabs of rate-limited types within their window (bounded: at
#   most the limit per type; older rows are deleted by the next grab of the type).
# - homing_schedules: periodic jobs and their last tick (exactly one job per tick).
# - homing_jobs_parent: cancel_children finds a parent's children without a scan.
def _v4(real: str) -> tuple[str, ...]:
    return (
        f"ALTER TABLE homing_jobs ADD COLUMN cancelled_at {real}",
        f"ALTER TABLE homing_jobs ADD COLUMN timeout_s {real}",
        "CREATE INDEX homing_jobs_parent ON homing_jobs (parent_id) WHERE parent_id IS NOT NULL",
        f"""CREATE TABLE homing_job_types (
            type TEXT PRIMARY KEY,
            paused INTEGER NOT NULL DEFAULT 0,
            max_running INTEGER,
            rate_limit INTEGER,
            rate_per {real},
            key_field TEXT,
            key_limit INTEGER,
            updated_at {real} NOT NULL
        )""",
        f"CREATE TABLE homing_job_starts (type TEXT NOT NULL, at {real} NOT NULL)",
        "CREATE INDEX homing_job_starts_type ON homing_job_starts (type, at)",
        f"""CREATE TABLE homing_schedules (
            name TEXT PRIMARY KEY,
            cron TEXT NOT NULL,
            tz TEXT NOT NULL,
            type TEXT NOT NULL,
            args TEXT NOT NULL,
            priority INTEGER NOT NULL DEFAULT 0,
            missed TEXT NOT NULL CHECK (missed IN ('once', 'all', 'skip')),
            last_tick {real},
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )""",
    )


_DEPS = (
    "CREATE TABLE homing_job_deps (job_id TEXT NOT NULL, after_id TEXT NOT NULL, "
    "run_at {real} NOT NULL, PRIMARY KEY (job_id, after_id))"
)

# Version 6: ready jobs of staged batches in an index of their own, per batch and type in
# grab order. A grab took the jobs of committed batches through homing_jobs_staged, which
# holds every job a batch ever had: with 2,000,000 notifications in committed batches it
# read and sorted all of them on every grab. Now the grab walks this index
# one batch and type at a time and stops at its limit (PostgresSql.grab, SqliteSql.grab_staged).
_STAGED_READY = (
    "CREATE INDEX homing_jobs_staged_ready ON homing_jobs (batch_id, type, priority DESC, seq) "
    "WHERE batch_id IS NOT NULL AND state = 'ready'"
)

# Version 7: the sessions that LISTEN on a channel (one row per channel and backend,
# refreshed by the listener while it listens). An insert broadcasts on the jobs channel
# only when a listener is registered: a transaction that NOTIFYs takes a database-wide
# lock from its commit until the commit is flushed, so every producer's commit waited for
# the others' flushes (4 / 8 producer processes: 1.25x / 1.37x the inserts/s without it).
# Unlogged on PostgreSQL (listeners register again within seconds); unused on SQLite.
_LISTENERS = (
    "homing_listeners (channel TEXT NOT NULL, backend INTEGER NOT NULL, since {real} NOT NULL, "
    "PRIMARY KEY (channel, backend))"
)

# Version 8: job ids are UUIDs everywhere. On PostgreSQL ids and lease tokens become native
# uuid columns (16 bytes against 37 as text, compared by memcmp instead of the collation):
# each of a job's row versions writes its id into the id index, so every job's WAL and
# index pages shrink. ALTER ... TYPE rewrites homing_jobs under an exclusive lock.
# The API always made uuid7 ids and refused other handles, but a Spark sink's idColumn
# could store any string: such an id (and a parent id naming it) becomes ids.job_uuid of
# it, the UUID of its MD5 digest, which the sink now applies to what it writes, so a
# rerun of the same rows still finds them. SQLite keeps text columns; the same mapping
# through homing_job_uuid(), a function its connections define (store/sqlite.py).
_UUID_RE = "'^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'"


def _as_uuid(column: str) -> str:
    return f"CASE WHEN {column} ~ {_UUID_RE} THEN {column}::uuid ELSE md5({column})::uuid END"


def _v8_postgres() -> tuple[str, ...]:
    parent = _as_uuid("parent_id")
    return (
        f"UPDATE homing_jobs SET parent_id = ({parent})::text "
        f"WHERE parent_id IS NOT NULL AND parent_id <> ({parent})::text",
        f"ALTER TABLE homing_jobs ALTER COLUMN id TYPE uuid USING {_as_uuid('id')}, "
        f"ALTER COLUMN lease_token TYPE uuid USING {_as_uuid('lease_token')}",
        f"ALTER TABLE homing_job_failures ALTER COLUMN job_id TYPE uuid USING {_as_uuid('job_id')}",
        f"ALTER TABLE homing_job_deps ALTER COLUMN job_id TYPE uuid USING {_as_uuid('job_id')}, "
        f"ALTER COLUMN after_id TYPE uuid USING {_as_uuid('after_id')}",
    )


def _v8_sqlite() -> tuple[str, ...]:
    def remap(table: str, *columns: str) -> str:
        sets = ", ".join(f"{c} = homing_job_uuid({c})" for c in columns)
        differ = " OR ".join(f"{c} <> homing_job_uuid({c})" for c in columns)
        return f"UPDATE {table} SET {sets} WHERE {differ}"

    return (
        remap("homing_jobs", "id"),
        remap("homing_jobs", "parent_id"),
        remap("homing_job_failures", "job_id"),
        remap("homing_job_deps", "job_id", "after_id"),
    )


# Version 9: the lease holder (host, pid, worker id) moves out of the job row into a
# registry, homing_holders, and a grab writes its 4-byte id. Every row version a lease
# writes (the grab's, then the completion's, which copies it) carried the three columns,
# ~30 bytes on this machine and ~90 with a cloud host name, into the heap and the WAL. A
# process registers each worker id once (JobOps.holder_id) and renews the registration
# while it grabs; gc forgets registrations that no job names and nobody renewed for a day.
# Only a running job's holder is ever read (details, a stale lease's error, takeovers, the
# history of a failure), so only running jobs carry theirs over.
_HOLDERS = (
    "homing_holders (id {ident}, host TEXT NOT NULL, pid INTEGER NOT NULL, "
    "worker TEXT NOT NULL, seen_at {real} NOT NULL, UNIQUE (host, pid, worker))"
)
_HOLDERS_OF_RUNNING = (
    "INSERT INTO homing_holders (host, pid, worker, seen_at) "
    "SELECT DISTINCT COALESCE(holder_host, ''), COALESCE(holder_pid, 0), "
    "COALESCE(holder_worker, ''), {now} FROM homing_jobs WHERE state = 'running'"
)
_HOLDER_IDS = (
    "UPDATE homing_jobs SET holder_id = (SELECT h.id FROM homing_holders h "
    "WHERE h.host = COALESCE(homing_jobs.holder_host, '') "
    "AND h.pid = COALESCE(homing_jobs.holder_pid, 0) "
    "AND h.worker = COALESCE(homing_jobs.holder_worker, '')) WHERE state = 'running'"
)


def _v9(ident: str, real: str, now: str) -> tuple[str, ...]:
    return (
        "CREATE TABLE " + _HOLDERS.format(ident=ident, real=real),
        "ALTER TABLE homing_jobs ADD COLUMN holder_id INTEGER",
        _HOLDERS_OF_RUNNING.format(now=now),
        _HOLDER_IDS,
        "ALTER TABLE homing_jobs DROP COLUMN holder_host",
        "ALTER TABLE homing_jobs DROP COLUMN holder_pid",
        "ALTER TABLE homing_jobs DROP COLUMN holder_worker",
    )


# Version 10: how long the faces promised to keep what their users count on (a receiver's
# inbox ids, which it publishes to senders as its retention; a durable messenger's dead
# letters and seen state): one row per kind and retention in use, refreshed while a
# component runs, so that every gc (``homing gc``, a worker's upkeep, another component's)
# keeps such rows for the longest promise still binding (store/retention_queries.py).
_PROMISES = (
    "CREATE TABLE homing_retention_promises (kind TEXT NOT NULL, retention_s {real} NOT NULL, "
    "promised_at {real} NOT NULL, PRIMARY KEY (kind, retention_s))"
)


MIGRATIONS: list[Migration] = [
    Migration(1, "jobs", _SQLITE, _POSTGRES),
    Migration(2, "ready_index", _V2_SQLITE, _V2_POSTGRES),
    Migration(
        3,
        "idle_workers",
        ("CREATE TABLE " + _IDLE.format(real="REAL"),),
        ("CREATE UNLOGGED TABLE " + _IDLE.format(real="DOUBLE PRECISION"),),
    ),
    Migration(4, "job_controls", _v4("REAL"), _v4("DOUBLE PRECISION")),
    # Version 5: job dependencies (insert(..., after=[handles])): one row per dependency
    # of a waiting job, deleted when the job is released or cancelled (job_deps_queries).
    Migration(
        5,
        "job_deps",
        (_DEPS.format(real="REAL"),),
        (_DEPS.format(real="DOUBLE PRECISION"),),
    ),
    Migration(6, "staged_ready_index", (_STAGED_READY,), (_STAGED_READY,)),
    Migration(
        7,
        "listeners",
        ("CREATE TABLE " + _LISTENERS.format(real="REAL"),),
        ("CREATE UNLOGGED TABLE " + _LISTENERS.format(real="DOUBLE PRECISION"),),
    ),
    Migration(8, "uuid_ids", _v8_sqlite(), _v8_postgres()),
    Migration(
        9,
        "holder_registry",
        _v9("INTEGER PRIMARY KEY", "REAL", "CAST(strftime('%s', 'now') AS REAL)"),
        _v9(
            "INTEGER GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            "DOUBLE PRECISION",
            "extract(epoch FROM now())",
        ),
    ),
    Migration(
        10,
        "retention_promises",
        (_PROMISES.format(real="REAL"),),
        (_PROMISES.format(real="DOUBLE PRECISION"),),
    ),
]
