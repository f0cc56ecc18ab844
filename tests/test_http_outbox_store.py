"""The sender's outbox in the store: tombstones written many at a time.

The dispatcher tombstones the deliveries that finish while a commit is in flight together
(``http_queries.mark_delivered_many``: one statement on PostgreSQL). Each must do what
``mark_delivered`` does for one message: only a row still pending under the caller's
claim is tombstoned, and the others are reported as not stored.
"""

from __future__ import annotations

import homing
from homing.store import http_queries as q


def _outgoing(n: int, now: float) -> list[q.NewOutgoing]:
    return [
        q.NewOutgoing(
            id=homing.uuid7(),
            kind="put" if i == 0 else "send",
            method="POST",
            url="http://127.0.0.1:9/node",
            content_type="application/json",
            body=b'{"n": %d}' % i,
            response_url=None,
            in_reply_to=None,
            reply_status=None,
            deadline=now + 3600,
            created_at=now,
        )
        for i in range(n)
    ]


def _stone(msg: q.NewOutgoing, token: str, **kw: object) -> q.Tombstone:
    fields: dict[str, object] = {
        "msg_id": msg.id,
        "token": token,
        "state": "delivered",
        "status": 204,
        "content_type": None,
        "body": None,
        "confirm_url": None,
        "status_url": None,
        "next_attempt_at": None,
    }
    fields.update(kw)
    return q.Tombstone(**fields)  # type: ignore[arg-type]


def test_many_tombstones_store_only_rows_pending_under_their_claim(db: homing.Database) -> None:
    now = db.clock.now()
    mine, theirs = _outgoing(3, now), _outgoing(1, now)
    with db.store.transaction() as tx:
        q.insert_outgoing(tx, mine, claim=("mine", now + 60))
        q.insert_outgoing(tx, theirs, claim=("theirs", now + 60))
    stones = [
        _stone(mine[0], "mine", status=200, content_type="application/json", body=b'{"ok": 1}'),
        _stone(mine[1], "mine", confirm_url="http://127.0.0.1:9/confirm", next_attempt_at=now),
        _stone(mine[2], "mine"),
        _stone(theirs[0], "mine"),  # claimed by another dispatcher: refused
    ]
    with db.store.transaction() as tx:
        stored = q.mark_delivered_many(tx, stones, now=now)
    assert stored == {m.id for m in mine}
    with db.store.transaction(write=False) as tx:
        put, confirmed, sent = (q.outgoing(tx, m.id) for m in mine)
        other = q.outgoing(tx, theirs[0].id)
    assert put is not None and confirmed is not None and sent is not None and other is not None
    assert (put.state, put.status, put.resp_body, put.attempts) == (
        "delivered",
        200,
        b'{"ok": 1}',
        1,
    )
    assert put.finished_at == now and put.next_attempt_at is None
    assert confirmed.confirm_url == "http://127.0.0.1:9/confirm"
    assert confirmed.next_attempt_at == now  # the confirmation DELETE is due
    assert (sent.state, sent.status, sent.next_attempt_at) == ("delivered", 204, None)
    assert other.state == "pending"  # untouched
    with db.store.transaction() as tx:  # a second tombstone finds nothing pending
        assert q.mark_delivered_many(tx, stones[:3], now=now + 1) == set()
        assert not q.mark_delivered(
            tx,
            mine[2].id,
            "mine",
            state="delivered",
            now=now + 1,
            status=204,
            content_type=None,
            body=None,
            confirm_url=None,
        )
