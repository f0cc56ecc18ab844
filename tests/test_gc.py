"""``homing gc`` keeps every table that grows with traffic bounded (issue 14, item 3).

Each round fills every growing table through its part's own API or query functions, then
runs one gc pass twice: within the retention nothing is deleted, past it everything
finished is. Table sizes after the late pass are the same every round: bounded.
"""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

import homing
from homing.housekeeping import Retention, collect
from homing.sessions import Server, Sessions
from homing.store import (
    engine_queries,
    http_inbox_queries,
    http_queries,
    messenger_queries,
    retention_queries,
)

DAY = 24 * 3600.0
N = 6
TABLES = (
    "homing_jobs",
    "homing_session_requests",
    "homing_sessions",
    "homing_session_prepared",
    "homing_engine_published",
    "homing_http_outbox",
    "homing_http_inbox",
    "homing_messenger_seen",
    "homing_messenger_channels",
    "homing_retention_promises",
)


def sizes(db: homing.Database) -> dict[str, int]:
    with db.store.transaction(write=False) as tx:
        return {t: int(tx.query(f"SELECT COUNT(*) FROM {t}")[0][0]) for t in TABLES}


def fill(db: homing.Database, round_: int) -> None:
    """N rows of every kind a busy store piles up, all finished (or abandoned)."""
    for i in range(N):
        db.insert("mail", {"n": i})
        job = db.grab("mail", lock_for=30)
        assert job is not None
        db.complete(job)
    sessions = Sessions(db)
    for i in range(N):
        session = sessions.open(f"r{round_}-c{i}")
        session.submit("q", {"n": i})  # answered and taken below
        session.prepare("q", {"n": i, "never": "submitted"})  # state A forever
    Server(db, "q", lambda r, t: r.body).run(until_idle=True)
    for i in range(N):
        session = sessions.open(f"r{round_}-c{i}")
        assert session.take_reply() is not None
        session.confirm(session.info().dequeued)
        session.submit("q", {"n": i, "unanswered": True})  # its client goes away
    now = db.clock.now()
    with db.store.transaction() as tx:  # a receiver that ran for a while with a 1-day retention
        retention_queries.promise(tx, retention_queries.HTTP_INBOX, DAY, now=now)
        engine_queries.record_published_many(
            tx, [(homing.uuid7(), "q", None, "routed", now) for _ in range(N)]
        )
        for i in range(N):  # a durable messenger's state of senders, and its channels
            messenger_queries.save_seen(
                tx,
                "m",
                f"r{round_}-s{i}",
                "c",
                epoch=1,
                nonce=1,
                max_seen=5,
                complement="",
                now=now,
            )
            messenger_queries.ensure_channel(
                tx, "m", f"r{round_}-ch{i}", "dealer", "tcp://x:1", None, 1, now
            )
        for _ in range(N):
            msg = homing.uuid7()
            http_queries.insert_outgoing(
                tx,
                [
                    http_queries.NewOutgoing(
                        id=msg,
                        kind="send",
                        method="POST",
                        url="http://example.invalid/x",
                        content_type="application/json",
                        body=b"{}",
                        response_url=None,
                        in_reply_to=None,
                        reply_status=None,
                        deadline=now + DAY,
                        created_at=now,
                    )
                ],
            )
            http_inbox_queries.insert_incoming(
                tx,
                http_inbox_queries.received_row(
                    msg_id=homing.uuid7(),
                    path="/x",
                    mode="send",
                    body_hash="h",
                    content_type="application/json",
                    body=b"{}",
                    response_url=None,
                    now=now,
                    work_at=None,
                ),
            )
        for row in http_queries.claim_work(tx, now=now, until=now + 60, token="t", limit=N):
            assert http_queries.mark_delivered(
                tx,
                row.id,
                "t",
                state="delivered",
                now=now,
                status=204,
                content_type=None,
                body=None,
                confirm_url=None,
            )
        for (msg_id,) in tx.query("SELECT id FROM homing_http_inbox WHERE state = 'received'"):
            http_inbox_queries.finish_incoming(
                tx,
                msg_id,
                state="done",
                now=now,
                status=204,
                content_type=None,
                body=None,
                error=None,
            )


def test_gc_keeps_every_growing_table_bounded(
    db: homing.Database, clock: homing.ManualClock
) -> None:
    full = dict.fromkeys(TABLES, N)
    full["homing_session_requests"] = 2 * N  # one taken, one unanswered per client
    full["homing_retention_promises"] = 1  # one per kind and retention in use
    for round_ in range(3):
        fill(db, round_)
        assert sizes(db) == full
        clock.advance(DAY)  # within every retention: nothing goes
        assert set(collect(db).values()) == {0}
        assert sizes(db) == full
        clock.advance(31 * DAY)  # past every retention and the session TTL
        deleted = collect(db)
        assert sizes(db) == dict.fromkeys(TABLES, 0), (round_, deleted)
        assert deleted == {
            "jobs": N,
            "sessions.requests": N,  # taken replies, then the rest with their sessions
            "sessions.expired": N,
            "engine.published": N,
            "http.outbox": N,
            "http.inbox": N,
            "messenger.seen": N,
            "messenger.dead": 0,
            "messenger.channels": N,
            "promises": 1,
        }


def test_an_active_session_does_not_expire(db: homing.Database, clock: homing.ManualClock) -> None:
    sessions = Sessions(db, session_ttl=10 * DAY)
    active = sessions.open("active")
    idle = sessions.open("idle")
    idle.prepare("q", 1)
    for _ in range(3):
        clock.advance(6 * DAY)
        active.submit("q", {"still": "here"})  # any client action keeps the session alive
        sessions.expire()
    assert sessions.table_sizes()["homing_sessions"] == 1
    assert sessions.info("active").unfinished
    assert sessions.table_sizes()["homing_session_prepared"] == 0  # went with "idle"


def test_homing_gc_command_reports_every_table(store_url: str) -> None:
    from homing.cli import cli

    runner = CliRunner()
    out = runner.invoke(cli, ["--db", store_url, "gc", "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    report: dict[str, Any] = json.loads(out.output)
    assert set(report["tables"]) == {
        "jobs",
        "sessions.requests",
        "sessions.expired",
        "engine.published",
        "http.outbox",
        "http.inbox",
        "messenger.seen",
        "messenger.dead",
        "messenger.channels",
        "promises",
    }
    bad = runner.invoke(cli, ["--db", store_url, "gc", "--session-ttl", "0"])
    assert bad.exit_code != 0 and "session_ttl" in bad.output
    assert Retention().session_ttl == 30 * DAY


def test_gc_defaults_are_the_parts_own() -> None:
    """homing.housekeeping cannot import the faces (they import homing.cli), so it keeps
    copies of their defaults: they must stay equal."""
    import inspect

    from homing.sessions._model import DEFAULT_RETENTION_S, DEFAULT_SESSION_TTL_S

    params = inspect.signature(Sessions.__init__).parameters
    assert Retention().sessions == DEFAULT_RETENTION_S == params["retention"].default
    assert Retention().session_ttl == DEFAULT_SESSION_TTL_S == params["session_ttl"].default
    from homing.messenger.durable import DEFAULT_RETENTION_S as MESSENGER_RETENTION_S

    assert Retention().messenger == MESSENGER_RETENTION_S
