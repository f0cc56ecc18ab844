"""What a component promised to keep binds every gc of its store.

The receiver tells each sender how long it remembers message ids (``Homing-Retention``);
a sender may retry a message until then and count on the receiver to know it. ``homing
gc`` (and a worker's upkeep, which runs it every hour) forgot handled ids after its own
default of 7 days, whatever a receiver had promised: with a 30-day receiver, a retry on
day 8 was taken as a new message and its effect happened twice. On both backends, through
a real uvicorn server and httpx. The same for a durable messenger's dead letters, which
``homing gc`` deleted after 7 days from a messenger keeping them 30, and for a session
whose ``Sessions(session_ttl=...)`` is longer than ``homing gc``'s 30 days: it went, with
its untaken replies, while its client was still within its TTL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zmq

import homing
from homing.housekeeping import collect
from homing.http import Receiver, wire
from homing.http.testing import serve_in_thread
from homing.messenger import Messenger
from homing.sessions import Server, SessionNotFound, Sessions
from homing.store import retention_queries

DAY = 24 * 3600.0


@pytest.fixture
def rdb(stores: Any) -> Iterator[homing.Database]:
    db = homing.connect(stores.url("receiver"))
    assert isinstance(db, homing.Database)
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (k TEXT NOT NULL)")
    yield db
    db.close()


def effects(db: homing.Database, *, settle: float = 0.0) -> int:
    """Effects so far; with ``settle``, after waiting that long for one to appear (a
    message may be handled after its 204, by the receiver's worker)."""
    deadline = time.monotonic() + settle
    while True:
        with db.store.transaction(write=False) as tx:
            n = int(tx.query("SELECT COUNT(*) FROM effects")[0][0])
        if n or time.monotonic() >= deadline:
            return n
        time.sleep(0.02)


def send(base: str, msg_id: str) -> httpx.Response:
    return httpx.post(
        base + "/effect",
        content=b'{"n": 1}',
        headers={
            "content-type": "application/json",
            "homing-message-id": msg_id,
            "homing-mode": "send",
        },
        timeout=30,
    )


def age(db: homing.Database, msg_id: str, seconds: float) -> None:
    with db.store.transaction() as tx:
        tx.execute(
            "UPDATE homing_http_inbox SET received_at = received_at - ? WHERE id = ?",
            (seconds, msg_id),
        )


def test_homing_gc_keeps_ids_for_as_long_as_the_receiver_promised(rdb: homing.Database) -> None:
    receiver = Receiver(rdb, retention=30 * DAY, dispatch=False)

    def effect(body: Any, tx: homing.Transaction) -> None:
        tx.tx.execute("INSERT INTO effects (k) VALUES (?)", ("done",))

    receiver.add_node("/effect", effect)
    msg_id = str(uuid.uuid4())
    try:
        with serve_in_thread(receiver.app) as base:
            first = send(base, msg_id)
            assert first.status_code == 204, first.text
            assert first.headers[wire.RETENTION] == str(int(30 * DAY))
            assert effects(rdb, settle=30) == 1
            age(rdb, msg_id, 10 * DAY)  # past homing gc's own 7 days, within the promise
            collect(rdb)  # homing gc with its defaults, as cron or a worker's upkeep runs it
            retry = send(base, msg_id)  # the sender retries on day 10, as it may
            assert retry.status_code == 204, retry.text
            # the receiver's own count says at once whether it knew the id (the effect
            # of a wrongly accepted retry could come after any sleep)
            assert receiver.stats["duplicates"] == 1, "the retry was taken as a new message"
            time.sleep(0.5)
            assert effects(rdb) == 1, "the retry was taken as a new message"
            assert collect(rdb)["http.inbox"] == 0
            age(rdb, msg_id, 21 * DAY)  # day 31: past the promise too
            assert collect(rdb)["http.inbox"] == 1
    finally:
        receiver.stop()


def test_a_promise_binds_until_its_rows_are_past_it_then_goes(rdb: homing.Database) -> None:
    """A promise covers the rows written while it was refreshed (and a grace period
    after); once the last of them is past the retention, ``homing gc`` forgets the
    promise too, so the table holds one row per kind and retention in use."""
    now = rdb.clock.now()
    grace = retention_queries.PROMISE_GRACE_S
    kind = retention_queries.HTTP_INBOX
    with rdb.store.transaction() as tx:
        retention_queries.promise(tx, kind, 30 * DAY, now=now - 10 * DAY)
        retention_queries.promise(tx, kind, 2 * DAY, now=now - 3 * DAY)  # binds no more
        retention_queries.promise(tx, retention_queries.MESSENGER, 90 * DAY, now=now)
    with rdb.store.transaction() as tx:
        assert retention_queries.binding(tx, kind, now=now) == 30 * DAY
        assert retention_queries.keep_before(tx, kind, now - 7 * DAY, now=now) == now - 30 * DAY
    assert collect(rdb)["promises"] == 1
    later = now + 20 * DAY + grace  # the 30-day promise's last ids may go now
    with rdb.store.transaction() as tx:
        assert retention_queries.binding(tx, kind, now=later) == 0.0
        assert retention_queries.forget_unbinding(tx, now=later) == 1
        rows = tx.query("SELECT kind, retention_s FROM homing_retention_promises")
    assert [(str(k), float(r)) for k, r in rows] == [(retention_queries.MESSENGER, 90 * DAY)]


def test_a_receiver_records_its_promise_when_it_starts(rdb: homing.Database) -> None:
    receiver = Receiver(rdb, retention=9 * DAY, dispatch=False)
    receiver.start()
    try:
        with rdb.store.transaction(write=False) as tx:
            rows = tx.query(
                "SELECT retention_s, promised_at FROM homing_retention_promises WHERE kind = ?",
                (retention_queries.HTTP_INBOX,),
            )
        assert [float(r[0]) for r in rows] == [9 * DAY]
        assert abs(float(rows[0][1]) - rdb.clock.now()) < 60
    finally:
        receiver.stop()


def test_homing_gc_keeps_a_durable_messengers_dead_letters_as_long_as_it_promised(
    rdb: homing.Database,
) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        with Messenger("m", db=rdb, context=ctx, retention=30 * DAY) as m:
            m.send("inproc://nobody", "undeliverable", ttl=0.05)
            deadline = time.monotonic() + 30
            while not m.dead_letters() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(m.dead_letters()) == 1
            with rdb.store.transaction() as tx:  # failed 10 days ago
                tx.execute(
                    "UPDATE homing_messenger_dead SET failed_at = failed_at - ?", (10 * DAY,)
                )
            collect(rdb)  # homing gc with its defaults (7 days)
            assert len(m.dead_letters()) == 1, "a dead letter went before its retention"
            with rdb.store.transaction() as tx:  # 31 days ago: past the promise
                tx.execute(
                    "UPDATE homing_messenger_dead SET failed_at = failed_at - ?", (21 * DAY,)
                )
            assert collect(rdb)["messenger.dead"] == 1
    finally:
        ctx.term()


def test_homing_gc_keeps_a_session_for_the_ttl_its_opener_set(rdb: homing.Database) -> None:
    sessions = Sessions(rdb, session_ttl=90 * DAY)
    session = sessions.open("c")
    request = session.submit("q", {"n": 1})
    Server(rdb, "q", lambda r, t: r.body).run(until_idle=True)  # a reply not yet taken

    def idle(seconds: float) -> None:
        with rdb.store.transaction() as tx:
            tx.execute(
                "UPDATE homing_sessions SET active_at = active_at - ?, "
                "reconnected_at = reconnected_at - ?",
                (seconds, seconds),
            )

    idle(40 * DAY)  # the client is away for 40 days: past homing gc's 30, within its 90
    assert collect(rdb)["sessions.expired"] == 0
    reply = sessions.open("c").take_reply(timeout=1)
    assert reply is not None and reply.request_id == request.id
    idle(91 * DAY)
    assert collect(rdb)["sessions.expired"] == 1
    with pytest.raises(SessionNotFound):
        sessions.info("c")


def test_a_long_handler_batch_does_not_hold_up_the_promise(
    rdb: homing.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The promise is refreshed by a thread of its own: the inbox loop, which waits for
    each batch of handlers, may be busy for longer than the promise's grace."""
    from homing.http import _worker

    monkeypatch.setattr(_worker, "GC_EVERY_S", 0.05)
    receiver = Receiver(rdb, retention=9 * DAY, dispatch=False)
    inbox_worker = receiver._worker
    busy = threading.Event()

    def stuck_loop() -> None:  # a handler batch that takes for ever
        busy.set()
        inbox_worker._stop.wait()

    monkeypatch.setattr(inbox_worker, "_loop", stuck_loop)

    def promised_at() -> float:
        with rdb.store.transaction(write=False) as tx:
            row = tx.query_one("SELECT promised_at FROM homing_retention_promises")
        assert row is not None
        return float(row[0])

    receiver.start()
    try:
        assert busy.wait(10)
        first = promised_at()
        deadline = time.monotonic() + 10
        while promised_at() == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert promised_at() > first
    finally:
        receiver.stop()
