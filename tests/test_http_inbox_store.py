"""The receiver's inbox in the store: a message handled at receipt is tombstoned in place.

The receiver stores a batch of new messages and, for those its node handled at receipt,
marks them done before the same commit (``insert_received`` then ``finish_handled``).
http schema version 4 makes that second write cheap on PostgreSQL (a HOT update: no new
index entries, the new version on the same page), and keeps the background worker's
query on its partial index on both stores.
"""

from __future__ import annotations

import hashlib

import pytest

import homing
from homing.store import http_inbox_queries as iq
from homing.store.http_queries import InboxRow


def _rows(n: int, now: float) -> list[InboxRow]:
    return [
        iq.received_row(
            msg_id=homing.uuid7(),
            path="/node",
            mode="send",
            body_hash=hashlib.sha256(str(i).encode()).hexdigest(),
            content_type="application/json",
            body=b'{"n": %d, "pad": "%s"}' % (i, b"x" * 200),
            response_url=None,
            now=now,
            work_at=None,
        )
        for i in range(n)
    ]


def test_messages_handled_at_receipt_are_tombstoned_in_place(db: homing.Database) -> None:
    """A batch of 64 (the receiver's batches reach 128): every tombstone is a HOT update
    on PostgreSQL (the update changed ``state``, which the work index's predicate named:
    none was HOT before version 4); on both stores the rows end done, without a body."""
    now = db.clock.now()
    rows = _rows(64, now)
    ids = [r.id for r in rows]
    with db.store.transaction() as tx:
        assert iq.insert_received(tx, rows) == [True] * 64
        iq.finish_handled(tx, ids, now=now)
        if db.dialect == "postgres":
            counts = tx.query_one(
                "SELECT pg_stat_get_xact_tuples_updated(c.oid), "
                "pg_stat_get_xact_tuples_hot_updated(c.oid) FROM pg_class c "
                "WHERE c.oid = 'homing_http_inbox'::regclass"
            )
            assert counts == (64, 64)
    with db.store.transaction(write=False) as tx:
        got = tx.query("SELECT state, body IS NULL, next_attempt_at IS NULL FROM homing_http_inbox")
    assert [(s, bool(b), bool(n)) for s, b, n in got] == [("done", True, True)] * 64


@pytest.mark.parametrize("retry_in", [0.0, 30.0])
def test_the_workers_query_reads_the_work_index(db: homing.Database, retry_in: float) -> None:
    """The work index now holds every row with a next attempt (whatever its state), and the
    background worker's query, which asks for ``state = 'received'`` too, still reads it:
    due messages are found, a message not yet due is not, done ones never."""
    now = db.clock.now()
    waiting = _rows(3, now)
    done = _rows(2, now)
    with db.store.transaction() as tx:
        iq.insert_received(tx, waiting + done)
        for r in waiting:
            iq.retry_incoming(tx, r.id, at=now + retry_in, error="later")
        iq.finish_handled(tx, [r.id for r in done], now=now)
    with db.store.transaction(write=False) as tx:
        due = iq.due_incoming(tx, now=now + 1, limit=10)
        if db.dialect == "postgres":
            tx.execute("SET LOCAL enable_seqscan = off")
            plan = " ".join(
                str(r[0])
                for r in tx.query(
                    "EXPLAIN SELECT id FROM homing_http_inbox WHERE state = 'received' "
                    "AND next_attempt_at IS NOT NULL AND next_attempt_at <= ? "
                    "ORDER BY next_attempt_at LIMIT ?",
                    (now, 10),
                )
            )
        else:
            plan = " ".join(
                str(r[-1])
                for r in tx.query(
                    "EXPLAIN QUERY PLAN SELECT id FROM homing_http_inbox WHERE state = 'received' "
                    "AND next_attempt_at IS NOT NULL AND next_attempt_at <= ? "
                    "ORDER BY next_attempt_at LIMIT ?",
                    (now, 10),
                )
            )
    expected = sorted(r.id for r in waiting) if retry_in == 0 else []
    assert sorted(due) == expected
    assert "homing_http_inbox_work" in plan
