"""homing.sessions on both backends: request/reply, sessions, recover() rules, lookup, bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import homing
from homing.sessions import (
    DuplicateRequest,
    NotDequeued,
    Reply,
    Request,
    RequestNotFound,
    Server,
    SessionNotFound,
    Sessions,
)


def double(request: Request, txn: homing.Transaction) -> Any:
    return {"n": request.body["n"] * 2}


def test_round_trip_in_three_transactions(db: homing.Database) -> None:
    sessions = Sessions(db)
    session = sessions.open("client-1")
    assert session.created
    request = session.submit("math", {"n": 21})
    assert homing.ids.is_uuid(request.id)
    info = session.info()
    assert info.last_request_id == info.last_enqueued_id == request.id
    assert info.last_dequeued_id is None and info.unfinished == [request.id]

    assert session.take_reply() is None  # nothing answered yet
    assert Server(db, "math", double).run(until_idle=True) == 1
    peeked = session.peek_reply()
    assert peeked is not None and peeked.body == {"n": 42}
    reply = session.take_reply()
    assert reply is not None and reply.ok and reply.body == {"n": 42}
    assert reply.request == {"n": 21} and reply.request_id == request.id
    assert session.take_reply() is None  # taken once
    info = session.info()
    assert info.last_dequeued_id == request.id and info.unfinished == []
    assert info.dequeued == [request.id]


def test_reconnect_reestablishes_the_session(db: homing.Database, open_db: Any) -> None:
    first = Sessions(db).open("client-1")
    request = first.submit("q", {"n": 1})
    other = Sessions(open_db(clock=db.clock)).open("client-1")  # "another process, later"
    assert other.reestablished
    info = other.info()
    assert info.connects == 2 and info.last_enqueued_id == request.id
    assert other.recover().last is not None
    assert other.recover().last.state == "B"  # type: ignore[union-attr]


def test_server_handler_writes_commit_with_the_reply(db: homing.Database) -> None:
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (request_id TEXT, kind TEXT)")

    def handler(request: Request, txn: homing.Transaction) -> Any:
        txn.tx.execute(
            "INSERT INTO effects (request_id, kind) VALUES (?, 'processed')", (request.id,)
        )
        txn.insert("audit", {"request": request.id})  # the job API in the same transaction
        return "ok"

    session = Sessions(db).open("c")
    request = session.submit("q", None)
    Server(db, "q", handler).run(until_idle=True)

    def on_reply(reply: Reply, txn: homing.Transaction) -> None:
        txn.tx.execute(
            "INSERT INTO effects (request_id, kind) VALUES (?, 'reply')", (reply.request_id,)
        )

    assert session.take_reply(on_reply) is not None
    with db.store.transaction() as tx:
        rows = sorted(tx.query("SELECT request_id, kind FROM effects"))
    assert rows == [(request.id, "processed"), (request.id, "reply")]
    assert db.grab("audit", lock_for=10) is not None


def test_a_failing_reply_handler_takes_nothing(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    session.submit("q", 1)
    Server(db, "q", lambda r, t: r.body + 1).run(until_idle=True)

    def boom(reply: Reply, txn: homing.Transaction) -> None:
        raise RuntimeError("client could not record the reply")

    with pytest.raises(RuntimeError):
        session.take_reply(boom)
    rec = session.recover()
    assert rec.last is not None and rec.last.state == "C"
    reply = session.take_reply()
    assert reply is not None and reply.body == 2


def test_handler_failures_retry_then_answer_with_an_error(
    db: homing.Database, clock: homing.ManualClock
) -> None:
    calls: list[str] = []

    def flaky(request: Request, txn: homing.Transaction) -> Any:
        calls.append(request.id)
        txn.tx.execute("CREATE TABLE IF NOT EXISTS side (x TEXT)")
        txn.tx.execute("INSERT INTO side (x) VALUES ('rolled back')")
        raise ValueError("downstream said no")

    session = Sessions(db).open("c")
    request = session.submit("q", {})
    server = Server(db, "q", flaky, max_attempts=3, retry_in=10)
    assert server.process_one()
    assert not server.process_one()  # backing off
    record = Sessions(db).lookup(request.id)
    assert record.state == "queued" and record.attempts == 1
    assert record.last_error is not None and "downstream said no" in record.last_error
    clock.advance(10)
    assert server.process_one()
    clock.advance(20)
    assert server.process_one()  # third failure: give up, answer with an error
    reply = session.take_reply()
    assert reply is not None and not reply.ok and reply.body is None
    assert reply.error is not None and "gave up after 3 attempts" in reply.error
    assert len(calls) == 3


def test_permanent_failure_answers_at_once(db: homing.Database) -> None:
    def refuse(request: Request, txn: homing.Transaction) -> Any:
        raise homing.PermanentFailure("no such account")

    session = Sessions(db).open("c")
    session.submit("q", {})
    Server(db, "q", refuse).run(until_idle=True)
    reply = session.take_reply()
    assert reply is not None and reply.error is not None
    assert reply.error.startswith("permanent failure") and "no such account" in reply.error


def test_reply_queues_are_private_and_ordered(db: homing.Database) -> None:
    sessions = Sessions(db)
    a, b = sessions.open("a"), sessions.open("b")
    ra = [a.submit("q", i).id for i in range(3)]
    rb = b.submit("q", 99).id
    Server(db, "q", lambda r, t: r.body).run(until_idle=True)
    got = [a.take_reply() for _ in range(4)]
    assert [r.request_id for r in got if r] == ra and got[3] is None
    only_b = b.take_reply()
    assert only_b is not None and only_b.request_id == rb


def test_take_a_chosen_reply(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    ids = [session.submit("q", i).id for i in range(3)]
    Server(db, "q", lambda r, t: r.body).run(until_idle=True)
    reply = session.take_reply(request_id=ids[2])
    assert reply is not None and reply.body == 2
    assert session.take_reply(request_id=ids[2]) is None


# -- recover(): the seed's four states ---------------------------------------------------
def test_state_a_when_transaction_1_never_ran(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    prepared = session.prepare("q", {"order": 7})  # Transaction 0 only: then a "crash"
    rec = session.recover()
    assert rec.last is not None and rec.last.state == "A"
    assert rec.last.action == "resubmit_or_drop" and rec.last.body == {"order": 7}
    assert rec.last_request_id == prepared.id != rec.last_enqueued_id
    assert [s.state for s in rec.requests] == ["A"]
    again = session.resubmit()
    assert again == prepared
    assert session.recover().last.state == "B"  # type: ignore[union-attr]
    with pytest.raises(DuplicateRequest):
        session.resubmit()  # enqueued now: not twice


def test_state_a_drop(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    first = session.submit("q", 1)
    session.prepare("q", 2)
    dropped = session.drop()
    assert dropped.body == 2
    rec = session.recover()
    assert rec.last is not None and rec.last.request_id == first.id and rec.last.state == "B"
    with pytest.raises(homing.InvalidState):
        session.drop()


def test_states_b_c_d(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    request = session.submit("q", 5)
    rec = session.recover()
    assert rec.last is not None and (rec.last.state, rec.last.action) == ("B", "wait")
    Server(db, "q", lambda r, t: r.body + 1).run(until_idle=True)
    rec = session.recover()
    assert rec.last is not None and (rec.last.state, rec.last.action) == ("C", "process_reply")
    assert rec.last.reply is not None and rec.last.reply.body == 6
    session.take_reply()
    rec = session.recover()
    assert rec.last is not None and (rec.last.state, rec.last.action) == ("D", "continue")
    assert rec.last_dequeued_id == request.id
    assert [s.state for s in rec.requests] == ["D"]


def test_client_kept_last_request(db: homing.Database) -> None:
    """The client keeps LastRequest in its own store and passes its id to recover()."""
    session = Sessions(db).open("c")
    done = session.submit("q", 1, remember=False)
    assert session.info().last_request_id is None
    mine = homing.uuid7()  # constructed and saved by the client, then a crash before T1
    rec = session.recover(last_request_id=mine)
    assert rec.last is not None and rec.last.state == "A" and rec.last.body is None
    rec = session.recover(last_request_id=done.id)
    assert rec.last is not None and rec.last.state == "B"
    session.submit("q", 2, request_id=mine, remember=False)
    Server(db, "q", lambda r, t: r.body).run(until_idle=True)
    assert session.recover(last_request_id=mine).last.state == "C"  # type: ignore[union-attr]


def test_many_outstanding_requests(db: homing.Database) -> None:
    session = Sessions(db, keep_replies=3).open("c")
    ids = [session.submit("q", i).id for i in range(8)]
    server = Server(db, "q", lambda r, t: r.body)
    for _ in range(5):
        server.process_one()
    for _ in range(4):
        session.take_reply()
    session.prepare("q", "never sent")
    rec = session.recover()
    states = {s.request_id: s.state for s in rec.requests}
    # replies of 0..3 taken; the session keeps the last 3 of them (n = 3)
    assert [states.get(i) for i in ids] == [None, "D", "D", "D", "C", "B", "B", "B"]
    assert rec.in_state("A")[0].body == "never sent"
    assert rec.last is not None and rec.last.state == "A"
    assert session.confirm(ids[1:3]) == 2
    rec = session.recover()
    assert [s.request_id for s in rec.in_state("D")] == [ids[3]]
    assert session.info().unfinished == ids[4:]
    assert Sessions(db).lookup(ids[0]).state == "taken"  # forgotten by the session, not by lookup


def test_lookup_and_retention(db: homing.Database, clock: homing.ManualClock) -> None:
    sessions = Sessions(db, retention=3600)
    session = sessions.open("c")
    request = session.submit("q", {"x": 1})
    Server(db, "q", lambda r, t: {"y": 2}).run(until_idle=True)
    record = sessions.lookup(request.id)
    assert (record.state, record.reply, record.client_id) == ("replied", {"y": 2}, "c")
    session.take_reply()
    session.confirm([request.id])
    clock.advance(3599)
    assert sessions.gc() == 0
    clock.advance(2)
    assert sessions.gc() == 1
    with pytest.raises(RequestNotFound, match="retention"):
        sessions.lookup(request.id)


def test_remembered_replies_survive_gc_until_confirmed(
    db: homing.Database, clock: homing.ManualClock
) -> None:
    sessions = Sessions(db, retention=10)
    session = sessions.open("c")
    request = session.submit("q", 1)
    Server(db, "q", lambda r, t: 1).run(until_idle=True)
    session.take_reply()
    clock.advance(100)
    assert sessions.gc() == 0
    assert session.recover().last.state == "D"  # type: ignore[union-attr]
    session.confirm([request.id])
    assert sessions.gc() == 1
    assert session.recover().last.state == "D"  # type: ignore[union-attr]


# -- bad input ---------------------------------------------------------------------------
def test_unknown_session(db: homing.Database) -> None:
    sessions = Sessions(db)
    with pytest.raises(SessionNotFound, match="open one"):
        sessions.attach("ghost")
    with pytest.raises(SessionNotFound):
        sessions.info("ghost")
    session = sessions.open("temp")
    session.close()
    for call in (
        lambda: session.submit("q", 1),
        lambda: session.take_reply(),
        lambda: session.recover(),
        lambda: session.confirm([]),
    ):
        with pytest.raises(SessionNotFound):
            call()


def test_confirm_of_a_reply_never_dequeued(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    other = Sessions(db).open("other")
    waiting = session.submit("q", 1)
    Server(db, "q", lambda r, t: 1).run(until_idle=True)
    mine = session.submit("q", 2)
    theirs = other.submit("q", 3)
    Server(db, "q", lambda r, t: 1).run(until_idle=True)
    other.take_reply()
    session.take_reply(request_id=mine.id)
    for bad in ([homing.uuid7()], [waiting.id], [theirs.id], [mine.id, "nope"]):
        with pytest.raises(NotDequeued, match="never dequeued"):
            session.confirm(bad)
    assert session.recover().in_state("D")[0].request_id == mine.id  # nothing confirmed
    with pytest.raises(homing.InvalidArgument):
        session.confirm("not-a-list")  # type: ignore[arg-type]


def test_duplicate_submit_of_the_same_request_id(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    rid = homing.uuid7()
    session.submit("q", 1, request_id=rid)
    with pytest.raises(DuplicateRequest, match="already submitted by this client"):
        session.submit("q", 1, request_id=rid)
    with pytest.raises(DuplicateRequest, match="another client"):
        Sessions(db).open("x").submit("q", 1, request_id=rid)
    assert Server(db, "q", lambda r, t: 1).run(until_idle=True) == 1


BAD_CALLS: list[tuple[Any, str]] = [
    (lambda s: s.open(""), "client_id"),
    (lambda s: s.open("a\x00b"), "printable"),
    (lambda s: s.open(5), "client_id"),
    (lambda s: s.open("c", keep_replies=0), "keep_replies"),
    (lambda s: s.open("c").submit("", 1), "queue"),
    (lambda s: s.open("c").submit("q", float("nan")), "JSON"),
    (lambda s: s.open("c").submit("q", object()), "JSON"),
    (lambda s: s.open("c").submit("q", 1, request_id=""), "request id"),
    (lambda s: s.open("c").take_reply(timeout=-1), "timeout"),
    (lambda s: s.lookup(""), "request id"),
    (lambda s: s.open("c").resubmit(), "no unsubmitted request"),
]


def test_bad_input_is_refused_clearly(db: homing.Database) -> None:
    sessions = Sessions(db)
    for k, (call, match) in enumerate(BAD_CALLS):
        with pytest.raises(homing.HomingError, match=match):
            call(sessions)
            pytest.fail(f"bad call {k} was accepted")


def test_oversize_body(db: homing.Database) -> None:
    session = Sessions(db, max_body_bytes=100).open("c")
    with pytest.raises(homing.PayloadTooLarge, match="over the limit"):
        session.submit("q", "x" * 200)
    assert session.info().unfinished == [] and session.info().last_request_id is None


def test_close_refused_with_open_requests(db: homing.Database) -> None:
    session = Sessions(db).open("c")
    session.submit("q", 1)
    with pytest.raises(homing.InvalidState, match="not yet answered"):
        session.close()


def test_quickstart_example_runs(store_url: str) -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / "sessions_quickstart.py"
    spec = importlib.util.spec_from_file_location("sessions_quickstart", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(store_url)
    assert result["states"] == ["A", "B", "C", "D"]
    assert result["second_reply"] == {"sku": "B-2", "total": 15}


def test_cli_show_lookup_queues_gc(db: homing.Database, store_url: str) -> None:
    from click.testing import CliRunner

    from homing.cli import cli

    session = Sessions(db).open("cli-client")
    done = session.submit("q", {"a": 1})
    Server(db, "q", lambda r, t: {"b": 2}).run(until_idle=True)
    waiting = session.submit("q", {"a": 3})
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["--db", store_url, "sessions", *args], catch_exceptions=False)

    out = run("show", "cli-client")
    assert out.exit_code == 0, out.output
    assert f"LastEnqueuedID  {waiting.id}" in out.output and "state B" in out.output
    shown = json.loads(run("show", "cli-client", "--json").output)
    assert [r["state"] for r in shown["recovery"]["requests"]] == ["C", "B"]
    looked = json.loads(run("lookup", done.id, "--json").output)
    assert looked["reply"] == {"b": 2} and looked["state"] == "replied"
    assert "replied" in run("queues").output
    assert json.loads(run("gc", "--json").output) == {"deleted": 0, "expired_sessions": 0}
    missing = run("show", "nobody")
    assert missing.exit_code == 1 and "no session for client 'nobody'" in missing.output
    unknown = run("lookup", homing.uuid7())
    assert unknown.exit_code == 1 and "no request" in unknown.output


def test_cli_server_answers_until_sigterm(open_db: Any, store_url: str, tmp_path: Path) -> None:
    db = open_db()  # the system clock, like the server process
    (tmp_path / "my_handlers.py").write_text(
        "def echo(request, txn):\n    return {'echo': request.body}\n"
    )
    session = Sessions(db).open("c")
    request = session.submit("q", 5)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HOMING_FAILPOINTS": ""}
    args = ["--db", store_url, "sessions", "server", "q", "--handler", "my_handlers:echo"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "homing", *args], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        reply = session.take_reply(timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert reply is not None and reply.body == {"echo": 5}
    assert reply.request_id == request.id
    assert proc.returncode == 0 and "handled 1 requests" in err, err
    from click.testing import CliRunner

    from homing.cli import cli

    bad = CliRunner().invoke(cli, [*args[:-1], "no_such_module:fn"])
    assert bad.exit_code == 2 and "cannot load 'no_such_module:fn'" in bad.output


def test_cli_server_keeps_the_store_tidy(open_db: Any, store_url: str, tmp_path: Path) -> None:
    """A deployment of sessions servers alone (no worker, no cron entry) stays bounded:
    the server runs ``homing gc`` on its own schedule, as a worker does. A request taken
    long ago (aged here past the 30-day retention) is deleted while the server runs."""
    db = open_db()
    (tmp_path / "my_handlers.py").write_text("def echo(request, txn):\n    return request.body\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HOMING_FAILPOINTS": ""}
    args = ["--db", store_url, "sessions", "server", "q", "--handler", "my_handlers:echo"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "homing", *args, "--gc-every", "0.3", "--vacuum-every", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        session = Sessions(db).open("c")
        request = session.submit("q", 7)
        reply = session.take_reply(timeout=30)
        assert reply is not None and reply.body == 7
        with db.store.transaction() as tx:  # taken 40 days ago, as far as gc can tell
            tx.execute(
                "UPDATE homing_session_requests SET taken_at = ?, remembered = 0 WHERE id = ?",
                (db.clock.now() - 40 * 86400, request.id),
            )
        deadline = time.monotonic() + 30
        gone = False
        while time.monotonic() < deadline and not gone:
            time.sleep(0.1)
            try:
                Sessions(db).lookup(request.id)
            except RequestNotFound:
                gone = True
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert gone, f"the server never collected the old request; its stderr: {err}"
    assert proc.returncode == 0, err


def test_public_api_is_pinned() -> None:
    import homing.sessions

    assert sorted(homing.sessions.__all__) == [
        "ACTIONS",
        "DuplicateRequest",
        "NotDequeued",
        "Recovery",
        "Reply",
        "Request",
        "RequestNotFound",
        "RequestRecord",
        "RequestStatus",
        "Server",
        "Session",
        "SessionFenced",
        "SessionInfo",
        "SessionNotFound",
        "Sessions",
        "TooManyPrepared",
    ]
    assert issubclass(homing.sessions.SessionNotFound, homing.NotFound)
    assert issubclass(homing.sessions.DuplicateRequest, homing.InvalidState)
    assert issubclass(homing.sessions.NotDequeued, homing.InvalidState)


def test_a_server_handler_can_send_a_request_in_its_transaction(db: homing.Database) -> None:
    """Chained services: the handler's own request commits with its reply, or not at all."""
    sessions = Sessions(db)
    front = sessions.open("front-client")
    sessions.open("front-server")  # once; handlers attach (an open would fence the others)

    def forward(request: Request, txn: homing.Transaction) -> Any:
        downstream = sessions.attach("front-server").submit("back", request.body)
        return {"forwarded_as": downstream.id}

    front.submit("front", {"x": 1})
    Server(db, "front", forward).run(until_idle=True)
    reply = front.take_reply()
    assert reply is not None
    record = sessions.lookup(reply.body["forwarded_as"])
    assert (record.client_id, record.queue, record.body) == ("front-server", "back", {"x": 1})
