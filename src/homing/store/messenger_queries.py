"""Every SQL statement of the messenger's durable mode. Domain-level functions over a ``Tx``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.store.protocol import Tx


@dataclass(frozen=True)
class ChannelRow:
    channel: str
    route: str
    destination: str
    peer: str | None
    incarnation: int


@dataclass(frozen=True)
class OutRow:
    channel: str
    message_id: int
    incarnation: int
    source_cb: int
    dest_cb: int
    callback_name: str | None
    body: bytes


def ensure_channel(
    tx: Tx,
    owner: str,
    channel: str,
    route: str,
    destination: str,
    peer: str | None,
    incarnation: int,
    now: float,
) -> None:
    tx.execute(
        "INSERT INTO homing_messenger_channels "
        "(owner, channel, route, destination, peer, incarnation, next_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (owner, channel) DO NOTHING",
        (owner, channel, route, destination, peer, incarnation, now),
    )


def next_message_id(tx: Tx, owner: str, channel: str) -> tuple[int, int]:
    """Hand out the channel's next message id; returns (incarnation, id)."""
    row = tx.query_one(
        "UPDATE homing_messenger_channels SET next_id = next_id + 1 "
        "WHERE owner = ? AND channel = ? RETURNING incarnation, next_id",
        (owner, channel),
    )
    if row is None:
        raise LookupError(f"messenger channel {owner}/{channel} is not in the store")
    return int(row[0]), int(row[1])


def channels(tx: Tx, owner: str) -> list[ChannelRow]:
    return [
        ChannelRow(str(c), str(r), str(d), None if p is None else str(p), int(i))
        for c, r, d, p, i in tx.query(
            "SELECT channel, route, destination, peer, incarnation "
            "FROM homing_messenger_channels WHERE owner = ? ORDER BY channel",
            (owner,),
        )
    ]


def insert_out(tx: Tx, owner: str, row: OutRow, now: float) -> None:
    tx.execute(
        "INSERT INTO homing_messenger_out (owner, channel, message_id, incarnation, source_cb, "
        "dest_cb, callback_name, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            owner,
            row.channel,
            row.message_id,
            row.incarnation,
            row.source_cb,
            row.dest_cb,
            row.callback_name,
            row.body,
            now,
        ),
    )


def delete_out(tx: Tx, owner: str, acked: Sequence[tuple[str, int]]) -> None:
    tx.executemany(
        "DELETE FROM homing_messenger_out WHERE owner = ? AND channel = ? AND message_id = ?",
        [(owner, channel, message_id) for channel, message_id in acked],
    )


def pending_out(tx: Tx, owner: str) -> list[OutRow]:
    return [
        OutRow(str(c), int(m), int(i), int(s), int(d), None if n is None else str(n), bytes(b))
        for c, m, i, s, d, n, b in tx.query(
            "SELECT channel, message_id, incarnation, source_cb, dest_cb, callback_name, body "
            "FROM homing_messenger_out WHERE owner = ? ORDER BY channel, message_id",
            (owner,),
        )
    ]


def count_out(tx: Tx, owner: str) -> int:
    row = tx.query_one("SELECT COUNT(*) FROM homing_messenger_out WHERE owner = ?", (owner,))
    return int(row[0]) if row else 0


def load_seen(tx: Tx, owner: str, sender: str, channel: str) -> tuple[int, int, str] | None:
    """(incarnation, max_seen, complement) of one sender's channel, locked for update."""
    lock = " FOR UPDATE" if tx.dialect == "postgres" else ""
    row = tx.query_one(
        "SELECT incarnation, max_seen, complement FROM homing_messenger_seen "
        "WHERE owner = ? AND sender = ? AND channel = ?" + lock,
        (owner, sender, channel),
    )
    return None if row is None else (int(row[0]), int(row[1]), str(row[2]))


def save_seen(
    tx: Tx,
    owner: str,
    sender: str,
    channel: str,
    incarnation: int,
    max_seen: int,
    complement: str,
    now: float,
) -> None:
    tx.execute(
        "INSERT INTO homing_messenger_seen "
        "(owner, sender, channel, incarnation, max_seen, complement, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, sender, channel) DO UPDATE SET "
        "incarnation = excluded.incarnation, max_seen = excluded.max_seen, "
        "complement = excluded.complement, updated_at = excluded.updated_at",
        (owner, sender, channel, incarnation, max_seen, complement, now),
    )


def seen_rows(tx: Tx, owner: str) -> list[tuple[str, str, int, int, str]]:
    return [
        (str(s), str(c), int(i), int(m), str(x))
        for s, c, i, m, x in tx.query(
            "SELECT sender, channel, incarnation, max_seen, complement "
            "FROM homing_messenger_seen WHERE owner = ? ORDER BY sender, channel",
            (owner,),
        )
    ]


# Savepoint names are constants chosen by the messenger, never user text.
_SAVEPOINT = "homing_messenger_item"


def savepoint(tx: Tx) -> None:
    tx.execute("SAVEPOINT " + _SAVEPOINT)


def release_savepoint(tx: Tx) -> None:
    tx.execute("RELEASE SAVEPOINT " + _SAVEPOINT)


def rollback_to_savepoint(tx: Tx) -> None:
    tx.execute("ROLLBACK TO SAVEPOINT " + _SAVEPOINT)
    tx.execute("RELEASE SAVEPOINT " + _SAVEPOINT)
