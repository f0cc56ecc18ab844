"""Schema of the queue engine (seed 001): queues, selectors, message entries, publish ledger.

An *entry* is one message in one queue. Its state is ``ready`` (unprocessed, held in the
queue), ``outstanding`` (given to a selector's destination, not yet paid for) or ``done``
(processed: the queue's history). A MOVE selector that moves an entry to another queue
creates a child entry there whose ``parent_seq`` points back; when the child is settled,
the parent is paid (its selector gets the credit back), so credits flow up the graph.
The engine's own dead-letter queue ``$dead`` is created here so that it always exists.
"""

from __future__ import annotations

from homing.store.migrations import Migration


def _schema(*, pg: bool) -> tuple[str, ...]:
    seq = (
        "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        if pg
        else "INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    real = "DOUBLE PRECISION" if pg else "REAL"
    big = "BIGINT" if pg else "INTEGER"
    blob = "BYTEA" if pg else "BLOB"
    return (
        f"""CREATE TABLE homing_engine_queues (
            name TEXT PRIMARY KEY,
            dead_letter TEXT,
            max_unprocessed {big},
            on_overflow TEXT NOT NULL DEFAULT 'discard'
                CHECK (on_overflow IN ('reject', 'discard', 'overflow')),
            max_history {big},
            self_destruct INTEGER NOT NULL DEFAULT 0,
            discarded {big} NOT NULL DEFAULT 0,
            created_at {real} NOT NULL
        )""",
        f"""CREATE TABLE homing_engine_selectors (
            id {seq},
            queue TEXT NOT NULL REFERENCES homing_engine_queues (name),
            name TEXT NOT NULL,
            mode TEXT NOT NULL CHECK (mode IN ('move', 'copy', 'bounce')),
            role TEXT NOT NULL CHECK (role IN ('normal', 'default', 'overflow')),
            match_rule TEXT NOT NULL,
            dest_kind TEXT NOT NULL CHECK (dest_kind IN ('queue', 'consumer', 'job', 'bounce')),
            dest TEXT,
            credits {big} NOT NULL CHECK (credits >= 0),
            granted {big} NOT NULL CHECK (granted >= 0),
            last_used {big} NOT NULL DEFAULT 0,
            created_at {real} NOT NULL,
            UNIQUE (queue, name)
        )""",
        "CREATE INDEX homing_engine_selectors_dest ON homing_engine_selectors (dest_kind, dest)",
        f"""CREATE TABLE homing_engine_entries (
            seq {seq},
            id TEXT NOT NULL,
            queue TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('ready', 'outstanding', 'done')),
            headers TEXT NOT NULL,
            body {blob},
            body_kind TEXT NOT NULL CHECK (body_kind IN ('bytes', 'json')),
            address TEXT NOT NULL,
            return_address TEXT,
            original_address TEXT,
            reason TEXT,
            parent_seq {big},
            selector_id {big},
            consumer TEXT,
            job_id TEXT,
            copied INTEGER NOT NULL DEFAULT 0,
            hops INTEGER NOT NULL DEFAULT 0,
            lease_token TEXT,
            lease_until {real},
            attempts INTEGER NOT NULL DEFAULT 0,
            created_at {real} NOT NULL,
            done_at {real}
        )""",
        "CREATE INDEX homing_engine_entries_queue ON homing_engine_entries (queue, state, seq)",
        "CREATE INDEX homing_engine_entries_selector ON homing_engine_entries (selector_id) "
        "WHERE state = 'outstanding'",
        "CREATE INDEX homing_engine_entries_consumer ON homing_engine_entries (consumer, seq) "
        "WHERE state = 'outstanding'",
        "CREATE INDEX homing_engine_entries_parent ON homing_engine_entries (parent_seq) "
        "WHERE parent_seq IS NOT NULL",
        "CREATE INDEX homing_engine_entries_job ON homing_engine_entries (job_id) "
        "WHERE job_id IS NOT NULL",
        "CREATE INDEX homing_engine_entries_id ON homing_engine_entries (id)",
        f"""CREATE TABLE homing_engine_published (
            id TEXT PRIMARY KEY,
            queue TEXT NOT NULL,
            seq {big},
            outcome TEXT NOT NULL,
            at {real} NOT NULL
        )""",
        "INSERT INTO homing_engine_queues (name, created_at) VALUES ('$dead', 0)",
    )


def _limits(*, pg: bool) -> tuple[str, ...]:
    """Version 2: delivery limits, message TTL, queue expiry, drop-head overflow, death
    history (x-death), consumer liveness. ``on_overflow`` is rebuilt to widen its CHECK
    (a column-level CHECK goes with its column on both backends)."""
    real = "DOUBLE PRECISION" if pg else "REAL"
    big = "BIGINT" if pg else "INTEGER"
    return (
        "ALTER TABLE homing_engine_queues ADD COLUMN overflow_action TEXT NOT NULL "
        "DEFAULT 'discard' CHECK (overflow_action IN "
        "('reject', 'discard', 'overflow', 'drop-head'))",
        "UPDATE homing_engine_queues SET overflow_action = on_overflow",
        "ALTER TABLE homing_engine_queues DROP COLUMN on_overflow",
        "ALTER TABLE homing_engine_queues RENAME COLUMN overflow_action TO on_overflow",
        f"ALTER TABLE homing_engine_queues ADD COLUMN max_deliveries {big}",
        f"ALTER TABLE homing_engine_queues ADD COLUMN message_ttl {real}",
        f"ALTER TABLE homing_engine_queues ADD COLUMN expires {real}",
        f"ALTER TABLE homing_engine_queues ADD COLUMN last_active {real}",
        "ALTER TABLE homing_engine_entries ADD COLUMN deaths TEXT",
        f"ALTER TABLE homing_engine_entries ADD COLUMN expires_at {real}",
        # ",3,7,": the selectors whose credit would move this held entry (see pump)
        "ALTER TABLE homing_engine_entries ADD COLUMN waiting_for TEXT",
        f"ALTER TABLE homing_engine_selectors ADD COLUMN seen_at {real}",
        "CREATE INDEX homing_engine_entries_expiry ON homing_engine_entries (expires_at) "
        "WHERE state = 'ready' AND expires_at IS NOT NULL",
        "CREATE INDEX homing_engine_entries_lease ON homing_engine_entries (lease_until) "
        "WHERE state = 'outstanding' AND consumer IS NOT NULL",
        # forget_published (homing gc) deletes by age
        "CREATE INDEX homing_engine_published_at ON homing_engine_published (at)",
    )


MIGRATIONS: list[Migration] = [
    Migration(1, "engine", _schema(pg=False), _schema(pg=True)),
    Migration(2, "engine limits and dead-letter history", _limits(pg=False), _limits(pg=True)),
]
