"""Schema of the sessions component (seed 004): client sessions, request and reply queues.

``homing_sessions`` is the queue manager's persistent session per client: LastRequest
(Transaction 0, when the queue manager keeps it), LastEnqueuedID and LastDequeuedID.

``homing_session_requests`` holds one row per request for its whole life, so the request
queue, each client's private reply queue and the audit record (lookup by id) are views of
one table, and moving a request from one queue to the next is one row update:
``queued`` (in the request queue, ordered by ``seq``) -> ``replied`` (in the client's reply
queue, ordered by ``replied_at, seq``) -> ``taken`` (dequeued by the client). ``remembered``
marks the last n replies the client dequeued and has not yet confirmed.

Version 2 (issue 14): a request being served is leased (``lease_token``; ``available_at`` is
then the lease's end), so a crashed or hung server's request returns to the queue and
``attempts`` counts takes, not exceptions; ``homing_sessions.epoch`` fences an older
process of the same client and ``active_at`` drives session expiry;
``homing_session_prepared`` keeps every prepared-but-unsubmitted request (state A).
"""

from __future__ import annotations

from homing.store.migrations import Migration


def _schema(real: str, serial: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE homing_sessions (
            client_id TEXT PRIMARY KEY,
            created_at {real} NOT NULL,
            reconnected_at {real} NOT NULL,
            connects INTEGER NOT NULL DEFAULT 1,
            keep_replies INTEGER NOT NULL,
            last_request_id TEXT,
            last_request_queue TEXT,
            last_request_body TEXT,
            last_request_at {real},
            last_enqueued_id TEXT,
            last_dequeued_id TEXT
        )""",
        f"""CREATE TABLE homing_session_requests (
            seq {serial},
            id TEXT NOT NULL UNIQUE,
            client_id TEXT NOT NULL,
            queue TEXT NOT NULL,
            body TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('queued', 'replied', 'taken')),
            attempts INTEGER NOT NULL DEFAULT 0,
            available_at {real} NOT NULL,
            last_error TEXT,
            reply TEXT,
            reply_error TEXT,
            server TEXT,
            created_at {real} NOT NULL,
            replied_at {real},
            taken_at {real},
            confirmed_at {real},
            remembered INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE INDEX homing_session_requests_queue
           ON homing_session_requests (queue, available_at, seq) WHERE state = 'queued'""",
        """CREATE INDEX homing_session_requests_replies
           ON homing_session_requests (client_id, replied_at, seq) WHERE state = 'replied'""",
        """CREATE INDEX homing_session_requests_client
           ON homing_session_requests (client_id, seq)
           WHERE state <> 'taken' OR remembered = 1""",
        """CREATE INDEX homing_session_requests_taken
           ON homing_session_requests (taken_at) WHERE state = 'taken'""",
    )


def _v2(real: str) -> tuple[str, ...]:
    return (
        "ALTER TABLE homing_session_requests ADD COLUMN lease_token TEXT",
        "ALTER TABLE homing_sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE homing_sessions ADD COLUMN active_at {real}",
        "UPDATE homing_sessions SET active_at = reconnected_at",
        f"""CREATE TABLE homing_session_prepared (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL,
            queue TEXT NOT NULL,
            body TEXT NOT NULL,
            prepared_at {real} NOT NULL
        )""",
        """CREATE INDEX homing_session_prepared_client
           ON homing_session_prepared (client_id, prepared_at)""",
        """INSERT INTO homing_session_prepared (id, client_id, queue, body, prepared_at)
           SELECT last_request_id, client_id, last_request_queue, last_request_body,
                  last_request_at FROM homing_sessions
           WHERE last_request_id IS NOT NULL AND (last_enqueued_id IS NULL
                 OR last_request_id <> last_enqueued_id)
             AND last_request_id NOT IN (SELECT id FROM homing_session_requests)""",
        "CREATE INDEX homing_sessions_active ON homing_sessions (active_at)",
    )


MIGRATIONS: list[Migration] = [
    Migration(
        1,
        "sessions",
        _schema("REAL", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        _schema("DOUBLE PRECISION", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
    ),
    Migration(
        2, "sessions leases, fencing, prepared requests", _v2("REAL"), _v2("DOUBLE PRECISION")
    ),
    # v3: each session keeps the TTL its opener's ``Sessions(session_ttl=...)`` promised,
    # so that no expiry with a shorter one (``homing gc``'s 30-day default, run every hour
    # by a worker's upkeep) deletes it, with its untaken replies, sooner.
    Migration(
        3,
        "sessions own ttl",
        ("ALTER TABLE homing_sessions ADD COLUMN ttl_s REAL",),
        ("ALTER TABLE homing_sessions ADD COLUMN ttl_s DOUBLE PRECISION",),
    ),
]
