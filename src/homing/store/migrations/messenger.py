"""Schema of the messenger's durable mode (seed 003).

- ``homing_messenger_channels``: one row per outgoing channel of a messenger (its name is
  ``owner``): where it goes, the sender incarnation and the last message id handed out.
- ``homing_messenger_out``: messages sent and not yet acknowledged (the pending list).
- ``homing_messenger_seen``: per sender and channel, ``max_seen`` and the complement of
  unseen ids below it (as ``lo-hi`` intervals), updated in the handler's transaction.
  Since version 2 ``incarnation`` holds the epoch this receiver granted (only moves
  forward) and ``nonce`` the request it answered.
- ``homing_messenger_dead`` (version 2): dead letters, out (given up on) or in (parked).
- ``homing_messenger_gaps`` (version 3): the complement as one row per gap ``[lo, hi)``, so
  a batch writes only the gaps it changed; ``complement`` text is then only read (rows
  written before version 3) and left empty.
"""

from __future__ import annotations

from homing.store.migrations import Migration


def _schema(int64: str, real: str, blob: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE homing_messenger_channels (
            owner TEXT NOT NULL,
            channel TEXT NOT NULL,
            route TEXT NOT NULL CHECK (route IN ('dealer', 'router')),
            destination TEXT NOT NULL,
            peer TEXT,
            incarnation {int64} NOT NULL,
            next_id {int64} NOT NULL DEFAULT 0,
            created_at {real} NOT NULL,
            PRIMARY KEY (owner, channel)
        )""",
        f"""CREATE TABLE homing_messenger_out (
            owner TEXT NOT NULL,
            channel TEXT NOT NULL,
            message_id {int64} NOT NULL,
            incarnation {int64} NOT NULL,
            source_cb {int64} NOT NULL,
            dest_cb {int64} NOT NULL,
            callback_name TEXT,
            body {blob} NOT NULL,
            created_at {real} NOT NULL,
            PRIMARY KEY (owner, channel, message_id)
        )""",
        f"""CREATE TABLE homing_messenger_seen (
            owner TEXT NOT NULL,
            sender TEXT NOT NULL,
            channel TEXT NOT NULL,
            incarnation {int64} NOT NULL,
            max_seen {int64} NOT NULL,
            complement TEXT NOT NULL,
            updated_at {real} NOT NULL,
            PRIMARY KEY (owner, sender, channel)
        )""",
    )


def _v2(int64: str, real: str, blob: str) -> tuple[str, ...]:
    return (
        f"ALTER TABLE homing_messenger_seen ADD COLUMN nonce {int64} NOT NULL DEFAULT 0",
        f"ALTER TABLE homing_messenger_out ADD COLUMN deadline {real}",
        f"ALTER TABLE homing_messenger_channels ADD COLUMN used_at {real}",
        "CREATE INDEX homing_messenger_seen_updated ON homing_messenger_seen (updated_at)",
        f"""CREATE TABLE homing_messenger_dead (
            owner TEXT NOT NULL,
            direction TEXT NOT NULL CHECK (direction IN ('in', 'out')),
            peer TEXT NOT NULL,
            channel TEXT NOT NULL,
            message_id {int64} NOT NULL,
            source_cb {int64} NOT NULL,
            dest_cb {int64} NOT NULL,
            callback_name TEXT,
            body {blob} NOT NULL,
            reason TEXT NOT NULL,
            attempts {int64} NOT NULL,
            route TEXT NOT NULL,
            route_destination TEXT NOT NULL,
            route_peer TEXT NOT NULL,
            failed_at {real} NOT NULL,
            PRIMARY KEY (owner, direction, channel, message_id)
        )""",
        "CREATE INDEX homing_messenger_dead_failed ON homing_messenger_dead (failed_at)",
    )


MIGRATIONS: list[Migration] = [
    Migration(
        1,
        "messenger",
        _schema("INTEGER", "REAL", "BLOB"),
        _schema("BIGINT", "DOUBLE PRECISION", "BYTEA"),
    )
]
MIGRATIONS.append(
    Migration(
        2,
        "messenger receiver-assigned epochs, dead letters, gc",
        _v2("INTEGER", "REAL", "BLOB"),
        _v2("BIGINT", "DOUBLE PRECISION", "BYTEA"),
    )
)


def _v3(int64: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE homing_messenger_gaps (
            owner TEXT NOT NULL,
            sender TEXT NOT NULL,
            channel TEXT NOT NULL,
            lo {int64} NOT NULL,
            hi {int64} NOT NULL,
            PRIMARY KEY (owner, sender, channel, lo)
        )""",
    )


MIGRATIONS.append(Migration(3, "messenger complement as gap rows", _v3("INTEGER"), _v3("BIGINT")))
