"""Issue 19 item 0 (no accepted message lost) and issue 14 item 4 (DNS rebinding), on real
uvicorn servers and the real httpx client, on SQLite and PostgreSQL.

Each test is one hole found from outside: it failed on the code before the fix.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import homing
from homing.cli import cli
from homing.errors import InvalidArgument
from homing.http import MessageFailed, Receiver, RetryPolicy, Sender, UnsafeURL, admin, wire
from homing.http.testing import serve_in_thread

LOCAL = ["127.0.0.1"]
FAST = RetryPolicy(initial=0.01, maximum=0.05)


def eventually(check: Any, timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns a truthy value (the machine may be loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@dataclass
class Ends:
    url: str  # the receiver store's URL
    sdb: homing.Database
    rdb: homing.Database
    base: str
    reply_base: str  # the sender-side receiver (its base URL)
    receiver: Receiver
    stores: Any
    calls: dict[str, int] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

    def sender(self, **kw: Any) -> Sender:
        kw.setdefault("allowed_hosts", LOCAL)
        kw.setdefault("retry", FAST)
        return Sender(self.sdb, **kw)

    def effects(self, tag: str) -> list[str]:
        with self.rdb.store.transaction(write=False) as tx:
            return [str(r[0]) for r in tx.query("SELECT k FROM effects") if tag in str(r[0])]


@pytest.fixture
def ends(stores: Any) -> Iterator[Ends]:
    rurl = stores.url("receiver")
    sdb = homing.connect(stores.url("sender"))
    rdb = homing.connect(rurl)
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    with rdb.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (k TEXT NOT NULL)")
    receiver = Receiver(rdb, allowed_hosts=LOCAL, handler_retry=FAST, max_handler_attempts=3)
    sender_side = Receiver(sdb, allowed_hosts=LOCAL, dispatch=False)
    try:
        with serve_in_thread(receiver.app) as base, serve_in_thread(sender_side.app) as sbase:
            e = Ends(rurl, sdb, rdb, base, sbase, receiver, stores)

            def effect(body: Any, tx: homing.Transaction) -> Any:
                key = json.dumps(body, sort_keys=True)
                e.calls[key] = e.calls.get(key, 0) + 1
                if key in e.broken:
                    raise RuntimeError("the dependency is down")
                tx.tx.execute("INSERT INTO effects (k) VALUES (?)", (key,))
                return {"echo": body}

            receiver.add_node("/effect", effect)
            yield e
    finally:
        sdb.close()
        rdb.close()


def test_a_handler_failing_every_attempt_leaves_a_redrivable_dead_letter(ends: Ends) -> None:
    body = {"outage": 1}
    key = json.dumps(body)
    ends.broken.add(key)
    with ends.sender() as sender:
        assert sender.send(ends.base + "/effect", body) is None  # acknowledged: 204
        dead = eventually(lambda: admin.dead_letters(ends.rdb))
        assert [d.id for d in dead] and json.loads(dead[0].body) == body
        # one handler run per attempt (3 attempts), each failure in the history
        assert ends.calls[key] == 3 and dead[0].attempts == 3
        assert [h["error"] for h in dead[0].history] == ["RuntimeError: the dependency is down"] * 3
        assert ends.effects("outage") == []
        # the shell lists it, with its body; the outage ends; a redrive handles it once
        runner = CliRunner()
        out = runner.invoke(cli, ["--db", ends.url, "http", "dead-letters", "--json"])
        assert out.exit_code == 0 and json.loads(json.loads(out.output)[0]["body"]) == body, (
            out.output
        )
        ends.broken.clear()
        out = runner.invoke(cli, ["--db", ends.url, "http", "redrive", dead[0].id])
        assert out.exit_code == 0 and "redriven: 1" in out.output, out.output
        assert eventually(lambda: ends.effects("outage"))
        assert admin.dead_letters(ends.rdb) == []
        time.sleep(0.2)  # a second handling would show up now
        assert ends.effects("outage") == [key] and ends.calls[key] == 4
        # gc keeps dead letters however old; a redriven one is an ordinary entry again
        ends.broken.add(json.dumps({"outage": 2}))
        sender.send(ends.base + "/effect", {"outage": 2})
        assert eventually(lambda: admin.dead_letters(ends.rdb))
        homing.http.gc(ends.rdb, older_than=-1)
        assert len(admin.dead_letters(ends.rdb)) == 1
        assert admin.purge_dead_letters(ends.rdb) == 1 and admin.dead_letters(ends.rdb) == []


def test_a_put_that_failed_for_good_is_redriven_on_both_sides(ends: Ends) -> None:
    """Option 1: after its last attempt the caller gets 501 (MessageFailed) and the request
    stays a dead letter; redriven on the receiver it is handled once, and the sender's
    redrive (same id) then gets the stored answer."""
    body = {"put_outage": 1}
    ends.broken.add(json.dumps(body))
    with ends.sender() as sender:
        with pytest.raises(MessageFailed) as info:
            sender.put(ends.base + "/effect", body)
        assert info.value.status == 501 and ends.calls[json.dumps(body)] == 3
        (dead,) = admin.dead_letters(ends.rdb)
        assert dead.id == info.value.msg_id and dead.mode == "put"
        ends.broken.clear()
        assert admin.redrive(ends.rdb, [dead.id]) == 1
        assert eventually(lambda: ends.effects("put_outage"))
        assert admin.redrive_failed(ends.sdb, [info.value.msg_id]) == 1
        assert sender.wait(info.value.msg_id, timeout=30) == {"echo": body}
    assert ends.effects("put_outage") == [json.dumps(body)] and ends.calls[json.dumps(body)] == 4


def test_failed_deliveries_are_listed_and_redriven_under_their_own_id(ends: Ends) -> None:
    with ends.sender() as sender:
        with pytest.raises(MessageFailed) as info:
            sender.send(ends.base + "/later", {"late": 1})  # no node there yet: 404
        assert info.value.status == 404
        failed = admin.failed_deliveries(ends.sdb)
        assert [f.id for f in failed] == [info.value.msg_id] and "404" in (
            failed[0].last_error or ""
        )

        def later(body: Any, tx: homing.Transaction) -> None:
            tx.tx.execute("INSERT INTO effects (k) VALUES (?)", (json.dumps(body),))

        ends.receiver.add_node("/later", later)
        runner = CliRunner()
        out = runner.invoke(cli, ["--db", str(ends.sdb.url), "http", "failed"])
        assert out.exit_code == 0 and info.value.msg_id in out.output and "404" in out.output
        out = runner.invoke(cli, ["--db", str(ends.sdb.url), "http", "redrive-failed"])
        assert out.exit_code == 2 and "--all" in out.output  # ids or --all, never by accident
        out = runner.invoke(cli, ["--db", str(ends.sdb.url), "http", "redrive-failed", "--all"])
        assert out.exit_code == 0 and "redriven: 1" in out.output, out.output
        assert sender.wait(info.value.msg_id, timeout=30) is None
        assert eventually(lambda: ends.effects("late")) == ['{"late": 1}']
        assert admin.failed_deliveries(ends.sdb) == []


def test_a_wrong_local_url_fails_the_caller_at_once(ends: Ends) -> None:
    with ends.sender() as sender:
        started = time.monotonic()
        with pytest.raises(InvalidArgument, match="not a reply node"):
            sender.perform_job(
                ends.base + "/effect", ends.reply_base + "/orders", {"j": 0}, timeout=20
            )
        assert time.monotonic() - started < 5
        # the receiver's base URL is enough: the reply node's path is added
        assert sender.perform_job(ends.base + "/effect", ends.reply_base, {"j": 1}) == {
            "echo": {"j": 1}
        }


def test_a_result_no_reply_node_takes_still_reaches_the_caller(ends: Ends) -> None:
    """A job whose local_url is the reply node of another store: the result is answered 404
    there, kept among the receiver's failed deliveries, and the caller fetches it from the
    receiver's status URL instead of waiting for the absurd deadline."""
    other = homing.connect(ends.stores.url("other"))
    assert isinstance(other, homing.Database)
    stranger = Receiver(other, allowed_hosts=LOCAL, dispatch=False)
    try:
        with serve_in_thread(stranger.app) as sbase, ends.sender(job_check=0.2) as sender:
            result = sender.perform_job(ends.base + "/effect", sbase, {"orphan": 1}, timeout=30)
            assert result == {"echo": {"orphan": 1}}
            failed = admin.failed_deliveries(ends.rdb)
            assert failed[0].kind == "reply" and "404" in (failed[0].last_error or "")
    finally:
        other.close()
    assert ends.effects("orphan") == ['{"orphan": 1}']


def _signed(secret: bytes, method: str, target: str, headers: dict[str, str], body: bytes) -> str:
    return wire.sign("k1", secret, method, target, headers, body, time.time())


def test_signatures_bind_mode_response_url_content_type_and_the_delete(ends: Ends) -> None:
    secret = b"0123456789abcdef"
    signed = Receiver(ends.rdb, secrets={"k1": secret}, allowed_hosts=LOCAL, dispatch=False)
    signed.add_node("/n", lambda body, tx: body)
    with serve_in_thread(signed.app) as base:
        msg_id = homing.uuid7()
        headers = {wire.MESSAGE_ID: msg_id, wire.MODE: "send", "content-type": "application/json"}
        good = {**headers, wire.SIGNATURE: _signed(secret, "POST", "/n", headers, b"{}")}
        # the captured signature replayed with another mode and a response URL of the attacker
        forged = {**good, wire.MODE: "job", wire.RESPONSE_URL: "http://127.0.0.1:9/steal"}
        r = httpx.post(base + "/n", content=b"{}", headers=forged)
        assert r.status_code == 401 and "does not match" in r.json()["detail"], r.text
        r = httpx.post(base + "/n", content=b"{}", headers={**good, "content-type": "text/plain"})
        assert r.status_code == 401
        r = httpx.post(base + "/n", content=b"{}", headers={**good, "homing-extra": "1"})
        assert r.status_code == 401
        assert httpx.post(base + "/n", content=b"{}", headers=good).status_code == 204
        # a put's stored answer can only be confirmed (dropped) by a signed DELETE
        put_id = homing.uuid7()
        ph = {wire.MESSAGE_ID: put_id, wire.MODE: "put", "content-type": "application/json"}
        ph[wire.SIGNATURE] = _signed(secret, "POST", "/n", ph, b"[1]")
        assert httpx.post(base + "/n", content=b"[1]", headers=ph).json() == [1]
        target = f"/_homing/inbox/{put_id}"
        assert httpx.delete(base + target).status_code == 401
        dh = {wire.MESSAGE_ID: put_id}
        dh[wire.SIGNATURE] = _signed(secret, "DELETE", target, dh, b"")
        assert httpx.delete(base + target, headers=dh).status_code == 204
        # so is the job status (it may carry a result)
        assert httpx.get(base + target).status_code == 401
        gh = {wire.MESSAGE_ID: put_id}
        gh[wire.SIGNATURE] = _signed(secret, "GET", target, gh, b"")
        status = httpx.get(base + target, headers=gh)
        assert status.status_code == 200 and status.json()["state"] == "done", status.text

        # a homing sender signs its DELETE too, with a rotated key set on the receiver
        def unconfirmed() -> list[Any]:
            with ends.rdb.store.transaction(write=False) as tx:
                return tx.query(
                    "SELECT id FROM homing_http_inbox WHERE mode = 'put' AND confirmed = 0 "
                    "AND path = '/n'"
                )

        with ends.sender(signing={"*": ("k1", secret)}) as sender:
            assert sender.put(base + "/n", {"s": 1}) == {"s": 1}
            assert eventually(lambda: unconfirmed() == [])


@pytest.mark.parametrize(
    "host",
    ["100.64.0.1", "[2002:7f00:1::]", "[::ffff:127.0.0.1]", "[64:ff9b::a00:1]", "[::127.0.0.1]"],
)
def test_shared_and_encapsulated_private_addresses_are_refused(host: str) -> None:
    with pytest.raises(UnsafeURL, match="non-public"):
        wire.check_url(f"http://{host}/reply")


def test_the_sender_sets_headers_and_method_stored_with_the_message(ends: Ends) -> None:
    seen: list[tuple[str, str | None]] = []

    async def endpoint(request: Request) -> Response:
        await request.body()
        seen.append((request.method, request.headers.get("authorization")))
        return Response(b'{"ok": true}', media_type="application/json")

    app = Starlette(routes=[Route("/api", endpoint, methods=["PUT", "PATCH", "POST"])])
    with serve_in_thread(app) as base, ends.sender() as sender:
        auth = {"Authorization": "Bearer t0ken"}
        assert sender.put(base + "/api", {"a": 1}, headers=auth, method="PATCH") == {"ok": True}
        pending = sender.enqueue("send", base + "/api", {"a": 2}, headers=auth, method="put")
        assert pending.wait(timeout=30) is None
        with ends.sdb.store.transaction(write=False) as tx:
            row = tx.query_one(
                "SELECT method, headers FROM homing_http_outbox WHERE id = ?", (pending.id,)
            )
        assert (
            row is not None
            and row[0] == "PUT"
            and json.loads(row[1]) == {"authorization": "Bearer t0ken"}
        )
        for bad in (
            {"Homing-Mode": "job"},
            {"Content-Length": "1"},
            {"bad name": "x"},
            {"X": "a\r\nb"},
        ):
            with pytest.raises(InvalidArgument):
                sender.enqueue("send", base + "/api", {}, headers=bad)
        with pytest.raises(InvalidArgument, match="method"):
            sender.enqueue("send", base + "/api", {}, method="TRACE")
    assert seen == [("PATCH", "Bearer t0ken"), ("PUT", "Bearer t0ken")]
    # a homing receiver takes the other verbs too; the verb is part of what the id names
    msg_id = homing.uuid7()
    h = {wire.MESSAGE_ID: msg_id, "content-type": "application/json"}
    assert httpx.put(ends.base + "/effect", content=b'{"verb": 1}', headers=h).status_code == 200
    assert httpx.patch(ends.base + "/effect", content=b'{"verb": 1}', headers=h).status_code == 422
    assert ends.effects("verb") == ['{"verb": 1}']


def test_a_response_url_that_rebinds_to_loopback_is_not_called(
    ends: Ends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name resolves to a public address when the job arrives (the check)
    and to 127.0.0.1 when the result is sent. The dispatcher checks (and pins) the address
    at connect time, so the loopback service never sees the request."""
    hits: list[str] = []

    async def sink(request: Request) -> Response:
        hits.append(request.url.path)
        return Response(status_code=204)

    real = socket.getaddrinfo
    lookups: list[str] = []
    lock = threading.Lock()

    def rebinding(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host  # anyio passes bytes
        if name != "rebind.homing.test":
            return real(host, port, *args, **kw)
        with lock:
            lookups.append(host)
            first = len(lookups) == 1
        addr = "93.184.216.34" if first else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    strict = Receiver(ends.rdb, handler_retry=FAST)  # no allowed hosts: only public addresses
    strict.add_node("/job", lambda body, tx: {"result": body})
    with serve_in_thread(
        Starlette(routes=[Route("/{p:path}", sink, methods=["POST"])])
    ) as sinkbase:
        port = sinkbase.rsplit(":", 1)[1]
        with serve_in_thread(strict.app) as base:
            r = httpx.post(
                base + "/job",
                content=b'{"rebind": 1}',
                headers={
                    wire.MESSAGE_ID: homing.uuid7(),
                    wire.MODE: "job",
                    wire.RESPONSE_URL: f"http://rebind.homing.test:{port}/_homing/reply",
                    "content-type": "application/json",
                },
            )
            assert r.status_code == 202, r.text  # the check saw a public address
            failed = eventually(lambda: admin.failed_deliveries(ends.rdb))
    assert failed and "non-public" in (failed[0].last_error or ""), failed
    assert hits == [] and len(lookups) >= 2


def test_http_schema_upgrades_from_version_1_with_rows_in_flight(stores: Any) -> None:
    """A store made by the previous release (http schema v1, a pending outbox row and a
    received inbox entry) upgrades in place and both rows stay usable."""
    from homing.store import http_inbox_queries as iq
    from homing.store import http_queries as q
    from homing.store.migrations import component_migrations

    db = homing.connect(stores.url("upgrade"), migrate=False)
    assert isinstance(db, homing.Database)
    v1 = component_migrations("http")[0]
    with db.store.transaction() as tx:
        tx.execute(
            "CREATE TABLE IF NOT EXISTS homing_migrations (component TEXT NOT NULL, "
            "version INTEGER NOT NULL, name TEXT NOT NULL, applied_at "
            + ("REAL" if tx.dialect == "sqlite" else "DOUBLE PRECISION")
            + " NOT NULL, PRIMARY KEY (component, version))"
        )
        for statement in v1.sqlite if tx.dialect == "sqlite" else v1.postgres:
            tx.execute(statement)
        tx.execute("INSERT INTO homing_migrations VALUES ('http', 1, ?, 0)", (v1.name,))
        tx.execute(
            "INSERT INTO homing_http_outbox (id, kind, method, url, content_type, body, state, "
            "deadline, created_at, next_attempt_at) VALUES ('o1', 'send', 'POST', "
            "'http://x/y', 'application/json', ?, 'pending', 9e9, 0, 0)",
            (b"{}",),
        )
        tx.execute(
            "INSERT INTO homing_http_inbox (id, path, mode, body_hash, content_type, body, "
            "state, received_at) VALUES ('i1', '/n', 'send', 'h', 'application/json', ?, "
            "'received', 0)",
            (b"[1]",),
        )
    applied = db.migrate()
    assert "http:0002_http_headers_history_dead_letters" in applied
    assert "http:0003_http_endpoints" in applied
    with db.store.transaction() as tx:
        out = q.outgoing(tx, "o1")
        inn = iq.incoming(tx, "i1")
    assert out is not None and out.headers is None and out.state == "pending"
    assert inn is not None and inn.body == b"[1]" and inn.history is None and inn.dead_at is None
    db.close()


def test_a_stopped_dispatcher_hands_its_claims_over_at_once(ends: Ends) -> None:
    """A sender closed while a request is in flight releases its claim: the next
    dispatcher sends the message now, not after the claim's lease (request timeout + 10 s)."""
    arrived = threading.Event()
    release = threading.Event()
    seen: list[str] = []

    async def slow(request: Request) -> Response:
        seen.append(request.headers[wire.MESSAGE_ID])
        arrived.set()
        while not release.is_set() and len(seen) == 1:
            await asyncio.sleep(0.01)
        return Response(status_code=204)

    app = Starlette(routes=[Route("/slow", slow, methods=["POST"])])
    with serve_in_thread(app) as base:
        first = ends.sender(request_timeout=60.0)
        pending = first.enqueue("send", base + "/slow", {"x": 1})
        assert arrived.wait(30)
        first.close()  # the request is cancelled mid-flight
        with ends.sender(request_timeout=60.0) as second:
            assert pending.wait(timeout=50) is None  # the old claim would hold it for 70 s
            assert second.dispatcher is not None and second.dispatcher.stats["delivered"] == 1
        release.set()
    assert seen == [pending.id, pending.id]
