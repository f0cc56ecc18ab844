"""Every SQL statement of the messenger's durable mode. Domain-level functions over a ``Tx``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.store import retention_queries
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
    deadline: float | None = None


def ensure_channel(
    tx: Tx,
    owner: str,
    channel: str,
    route: str,
    destination: str,
    peer: str | None,
    incarnation: int,
    now: float,
) -> bool:
    """Create the channel's row; True if it did not exist (its ids start at 1)."""
    cur = tx.execute(
        "INSERT INTO homing_messenger_channels "
        "(owner, channel, route, destination, peer, incarnation, next_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (owner, channel) DO NOTHING",
        (owner, channel, route, destination, peer, incarnation, now),
    )
    return bool(cur.rowcount == 1)


def raise_next_id(tx: Tx, owner: str, channel: str, at_least: int) -> None:
    """Ids handed out later on this channel stay above ``at_least`` (a redriven id)."""
    tx.execute(
        "UPDATE homing_messenger_channels SET next_id = ? "
        "WHERE owner = ? AND channel = ? AND next_id < ?",
        (at_least, owner, channel, at_least),
    )


def reserve_ids(tx: Tx, owner: str, channel: str, n: int, now: float) -> int:
    """Hand out the channel's next ``n`` message ids at once (and note the channel's use,
    for ``collect_garbage``); returns the first."""
    row = tx.query_one(
        "UPDATE homing_messenger_channels SET next_id = next_id + ?, used_at = ? "
        "WHERE owner = ? AND channel = ? RETURNING next_id",
        (n, now, owner, channel),
    )
    if row is None:
        raise LookupError(f"messenger channel {owner}/{channel} is not in the store")
    return int(row[0]) - n + 1


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
        "dest_cb, callback_name, body, created_at, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            row.deadline,
        ),
    )


def insert_out_many(tx: Tx, owner: str, rows: Sequence[OutRow], now: float) -> None:
    tx.executemany(
        "INSERT INTO homing_messenger_out (owner, channel, message_id, incarnation, source_cb, "
        "dest_cb, callback_name, body, created_at, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (owner, r.channel, r.message_id, r.incarnation, r.source_cb, r.dest_cb,
             r.callback_name, r.body, now, r.deadline)
            for r in rows
        ],
    )  # fmt: skip


def delete_out(tx: Tx, owner: str, acked: Sequence[tuple[str, int]]) -> None:
    tx.executemany(
        "DELETE FROM homing_messenger_out WHERE owner = ? AND channel = ? AND message_id = ?",
        [(owner, channel, message_id) for channel, message_id in acked],
    )


def pending_out(tx: Tx, owner: str) -> list[OutRow]:
    return [
        OutRow(
            str(c),
            int(m),
            int(i),
            int(s),
            int(d),
            None if n is None else str(n),
            bytes(b),
            None if x is None else float(x),
        )  # fmt: skip
        for c, m, i, s, d, n, b, x in tx.query(
            "SELECT channel, message_id, incarnation, source_cb, dest_cb, callback_name, body, "
            "deadline FROM homing_messenger_out WHERE owner = ? ORDER BY channel, message_id",
            (owner,),
        )
    ]


def load_seen(tx: Tx, owner: str, sender: str, channel: str) -> tuple[int, int, int, str] | None:
    """(epoch, nonce, max_seen, complement) of one sender's channel, locked for update."""
    lock = tx.sql.lock_rows
    row = tx.query_one(
        "SELECT incarnation, nonce, max_seen, complement FROM homing_messenger_seen "
        "WHERE owner = ? AND sender = ? AND channel = ?" + lock,
        (owner, sender, channel),
    )
    return None if row is None else (int(row[0]), int(row[1]), int(row[2]), str(row[3]))


def save_seen(
    tx: Tx,
    owner: str,
    sender: str,
    channel: str,
    epoch: int,
    nonce: int,
    max_seen: int,
    complement: str,
    now: float,
) -> None:
    tx.execute(
        "INSERT INTO homing_messenger_seen "
        "(owner, sender, channel, incarnation, nonce, max_seen, complement, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, sender, channel) DO UPDATE SET "
        "incarnation = excluded.incarnation, nonce = excluded.nonce, "
        "max_seen = excluded.max_seen, complement = excluded.complement, "
        "updated_at = excluded.updated_at",
        (owner, sender, channel, epoch, nonce, max_seen, complement, now),
    )


def load_gaps(tx: Tx, owner: str, sender: str, channel: str) -> list[tuple[int, int]]:
    return [
        (int(lo), int(hi))
        for lo, hi in tx.query(
            "SELECT lo, hi FROM homing_messenger_gaps WHERE owner = ? AND sender = ? "
            "AND channel = ? ORDER BY lo",
            (owner, sender, channel),
        )
    ]


def save_gaps(
    tx: Tx,
    owner: str,
    sender: str,
    channel: str,
    gone: Sequence[int],
    changed: Sequence[tuple[int, int]],
) -> None:
    """Write only what a batch changed in the complement: gaps gone and gaps new/changed."""
    tx.executemany(
        "DELETE FROM homing_messenger_gaps WHERE owner = ? AND sender = ? AND channel = ? "
        "AND lo = ?",
        [(owner, sender, channel, lo) for lo in gone],
    )
    tx.executemany(
        "INSERT INTO homing_messenger_gaps (owner, sender, channel, lo, hi) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, sender, channel, lo) "
        "DO UPDATE SET hi = excluded.hi",
        [(owner, sender, channel, lo, hi) for lo, hi in changed],
    )


def reset_gaps(tx: Tx, owner: str, sender: str, channel: str) -> None:
    tx.execute(
        "DELETE FROM homing_messenger_gaps WHERE owner = ? AND sender = ? AND channel = ?",
        (owner, sender, channel),
    )


def move_out_to_dead(tx: Tx, owner: str, dead: DeadRow) -> None:
    """A sent message the messenger gave up on: out of the pending list, into dead letters."""
    tx.execute(
        "DELETE FROM homing_messenger_out WHERE owner = ? AND channel = ? AND message_id = ?",
        (owner, dead.channel, dead.message_id),
    )
    insert_dead(tx, owner, dead)


@dataclass(frozen=True)
class DeadRow:
    direction: str
    peer: str
    channel: str
    message_id: int
    source_cb: int
    dest_cb: int
    body: bytes
    reason: str
    attempts: int
    failed_at: float
    callback_name: str | None
    route: tuple[str, str, str]


def insert_dead(tx: Tx, owner: str, d: DeadRow) -> None:
    tx.execute(
        "INSERT INTO homing_messenger_dead (owner, direction, peer, channel, message_id, "
        "source_cb, dest_cb, callback_name, body, reason, attempts, route, route_destination, "
        "route_peer, failed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (owner, direction, channel, message_id) DO UPDATE SET "
        "reason = excluded.reason, attempts = excluded.attempts, failed_at = excluded.failed_at",
        (
            owner, d.direction, d.peer, d.channel, d.message_id, d.source_cb, d.dest_cb,
            d.callback_name, d.body, d.reason, d.attempts, d.route[0], d.route[1], d.route[2],
            d.failed_at,
        ),
    )  # fmt: skip


def dead_rows(tx: Tx, owner: str, limit: int) -> list[DeadRow]:
    return [
        DeadRow(
            str(r[0]),
            str(r[1]),
            str(r[2]),
            int(r[3]),
            int(r[4]),
            int(r[5]),
            bytes(r[6]),
            str(r[7]),
            int(r[8]),
            float(r[9]),
            None if r[10] is None else str(r[10]),
            (str(r[11]), str(r[12]), str(r[13])),
        )  # fmt: skip
        for r in tx.query(
            "SELECT direction, peer, channel, message_id, source_cb, dest_cb, body, reason, "
            "attempts, failed_at, callback_name, route, route_destination, route_peer "
            "FROM homing_messenger_dead WHERE owner = ? "
            "ORDER BY failed_at, channel, message_id LIMIT ?",
            (owner, limit),
        )
    ]


def delete_dead(tx: Tx, owner: str, direction: str, channel: str, message_id: int) -> int:
    return int(
        tx.execute(
            "DELETE FROM homing_messenger_dead "
            "WHERE owner = ? AND direction = ? AND channel = ? AND message_id = ?",
            (owner, direction, channel, message_id),
        ).rowcount
    )


def collect_garbage(tx: Tx, cutoff: float, *, now: float) -> dict[str, int]:
    """Delete messenger rows idle since before ``cutoff``, or before the longest retention
    a running durable messenger promised if that is longer (``retention_queries``): seen
    state, dead letters, and channels with no pending message (all owners)."""
    cutoff = retention_queries.keep_before(tx, retention_queries.MESSENGER, cutoff, now=now)
    tx.execute(
        "DELETE FROM homing_messenger_gaps WHERE EXISTS (SELECT 1 FROM homing_messenger_seen s "
        "WHERE s.owner = homing_messenger_gaps.owner AND s.sender = homing_messenger_gaps.sender "
        "AND s.channel = homing_messenger_gaps.channel AND s.updated_at < ?)",
        (cutoff,),
    )
    seen = tx.execute("DELETE FROM homing_messenger_seen WHERE updated_at < ?", (cutoff,))
    dead = tx.execute("DELETE FROM homing_messenger_dead WHERE failed_at < ?", (cutoff,))
    return {
        "seen": int(seen.rowcount),
        "dead": int(dead.rowcount),
        "channels": int(
            tx.execute(
                "DELETE FROM homing_messenger_channels WHERE COALESCE(used_at, created_at) < ? "
                "AND NOT EXISTS (SELECT 1 FROM homing_messenger_out o WHERE "
                "o.owner = homing_messenger_channels.owner AND "
                "o.channel = homing_messenger_channels.channel)",
                (cutoff,),
            ).rowcount
        ),
    }
