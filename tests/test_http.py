"""Reliable HTTP messaging (seed 000) on real uvicorn servers and the real httpx client.

Every test runs on SQLite and PostgreSQL (the ``stores`` fixture) for both sides' stores.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import homing
from homing.http import (
    AsyncSender,
    DeadlineExceeded,
    MessageFailed,
    Receiver,
    RetryPolicy,
    Sender,
    wire,
)
from homing.http.testing import serve_in_thread

LOCAL = ["127.0.0.1"]
FAST = RetryPolicy(initial=0.02, maximum=0.2)


def effects(db: homing.Database) -> list[tuple[str, str]]:
    with db.store.transaction(write=False) as tx:
        return [(str(k), str(m)) for k, m in tx.query("SELECT k, msg FROM effects ORDER BY k")]


def make_effects_table(db: homing.Database) -> None:
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (k TEXT NOT NULL, msg TEXT NOT NULL)")


@dataclass
class Pair:
    sdb: homing.Database
    rdb: homing.Database
    receiver: Receiver
    base: str  # the receiver's URL
    reply_url: str  # the sender's reply node
    calls: dict[str, int]

    def sender(self, **kw: Any) -> Sender:
        kw.setdefault("allowed_hosts", LOCAL)
        kw.setdefault("retry", FAST)
        return Sender(self.sdb, **kw)


@pytest.fixture
def pair(stores: Any) -> Iterator[Pair]:
    sdb = homing.connect(stores.url("sender"))
    rdb = homing.connect(stores.url("receiver"))
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    make_effects_table(rdb)
    calls: dict[str, int] = {}
    receiver = Receiver(rdb, allowed_hosts=LOCAL, handler_retry=FAST)

    @receiver.node("/effect")
    def effect(body: Any, tx: homing.Transaction) -> Any:
        key = json.dumps(body, sort_keys=True)
        calls[key] = calls.get(key, 0) + 1
        if isinstance(body, dict) and body.get("sleep"):
            time.sleep(body["sleep"])
        if isinstance(body, dict) and body.get("refuse"):
            raise homing.PermanentFailure("this message can never be handled")
        tx.tx.execute("INSERT INTO effects (k, msg) VALUES (?, ?)", (key, "x"))
        return {"echo": body}

    @receiver.node("/bytes")
    def raw(body: Any, tx: homing.Transaction) -> Any:
        assert isinstance(body, bytes)
        return body[::-1]

    sender_side = Receiver(sdb, allowed_hosts=LOCAL, dispatch=False)
    with serve_in_thread(receiver.app) as base, serve_in_thread(sender_side.app) as sbase:
        yield Pair(sdb, rdb, receiver, base, sbase + "/_homing/reply", calls)
    sdb.close()
    rdb.close()


def test_put_send_and_perform_job_round_trip(pair: Pair) -> None:
    with pair.sender() as sender:
        assert sender.put(pair.base + "/effect", {"n": 1}) == {"echo": {"n": 1}}
        assert sender.send(pair.base + "/effect", {"n": 2}) is None
        assert sender.perform_job(pair.base + "/effect", pair.reply_url, {"n": 3}) == {
            "echo": {"n": 3}
        }
        assert sender.put(pair.base + "/bytes", b"abc") == b"cba"
        deadline = time.monotonic() + 10
        while len(effects(pair.rdb)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    keys = [k for k, _ in effects(pair.rdb)]
    assert sorted(keys) == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
    with pair.sdb.store.transaction() as tx:
        states = tx.query("SELECT state, confirm_url FROM homing_http_outbox")
    assert {s for s, _ in states} == {"delivered"}
    # the confirmation DELETE was followed: the receiver dropped the stored put response
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with pair.rdb.store.transaction() as tx:
            unconfirmed = tx.query(
                "SELECT id FROM homing_http_inbox WHERE mode = 'put' AND confirmed = 0"
            )
        if not unconfirmed:
            break
        time.sleep(0.05)
    assert unconfirmed == []


def test_duplicate_deliveries_run_the_handler_once(pair: Pair) -> None:
    msg_id = homing.uuid7()
    body = json.dumps({"dup": 1}).encode()
    headers = {
        wire.MESSAGE_ID: msg_id,
        wire.MODE: "put",
        "content-type": "application/json",
    }

    def post() -> httpx.Response:
        return httpx.post(pair.base + "/effect", content=body, headers=headers, timeout=10)

    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(post())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r.status_code == 200]
    assert ok and all(r.status_code in (200, 409) for r in results)
    assert {r.json()["echo"]["dup"] for r in ok} == {1}
    again = post()
    assert again.status_code == 200 and again.headers[wire.REPLAYED] == "true"
    # Option 2 repeats: 204 every time, one effect
    send_id = homing.uuid7()
    for _ in range(5):
        r = httpx.post(
            pair.base + "/effect",
            content=b'{"dup": 2}',
            headers={**headers, wire.MESSAGE_ID: send_id, wire.MODE: "send"},
        )
        assert r.status_code == 204
    deadline = time.monotonic() + 10
    while len(effects(pair.rdb)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    assert sorted(k for k, _ in effects(pair.rdb)) == ['{"dup": 1}', '{"dup": 2}']
    assert pair.calls == {'{"dup": 1}': 1, '{"dup": 2}': 1}
    # same id, different body: refused, nothing changes
    r = httpx.post(pair.base + "/effect", content=b'{"dup": 3}', headers=headers)
    assert r.status_code == 422 and "different body" in r.json()["error"]


def test_transactional_outbox_commits_with_the_callers_writes(pair: Pair) -> None:
    with pair.sdb.store.transaction() as tx:
        tx.execute("CREATE TABLE orders (id TEXT)")
    with pair.sender() as sender:
        with pytest.raises(RuntimeError), pair.sdb.transaction() as t:
            t.tx.execute("INSERT INTO orders VALUES ('rolled back')")
            sender.send(pair.base + "/effect", {"tx": "no"})
            raise RuntimeError("the caller changes its mind")
        with pair.sdb.transaction() as t:
            t.tx.execute("INSERT INTO orders VALUES ('kept')")
            pending = sender.send(pair.base + "/effect", {"tx": "yes"}, tx=t)
            put = sender.put(pair.base + "/effect", {"tx": "put"})  # joins the open transaction
        assert pending.wait(10) is None
        assert put.wait(10) == {"echo": {"tx": "put"}}
    deadline = time.monotonic() + 10
    while len(effects(pair.rdb)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(k for k, _ in effects(pair.rdb)) == ['{"tx": "put"}', '{"tx": "yes"}']
    with pair.sdb.store.transaction() as tx:
        assert tx.query("SELECT COUNT(*) FROM homing_http_outbox")[0][0] == 2


def test_sender_restarted_with_a_full_outbox_delivers_each_once(pair: Pair) -> None:
    stopped = Sender(pair.sdb, dispatch=False)
    handles = [stopped.enqueue("send", pair.base + "/effect", {"r": i}) for i in range(20)]
    with pair.sender() as restarted:
        for h in handles:
            assert restarted.wait(h.id, timeout=20) is None
    deadline = time.monotonic() + 10
    while len(effects(pair.rdb)) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    keys = [k for k, _ in effects(pair.rdb)]
    assert len(keys) == 20 and len(set(keys)) == 20


def test_long_job_with_sender_timeouts_and_retries(pair: Pair) -> None:
    with pair.sender(request_timeout=0.3) as sender:
        result = sender.put(pair.base + "/effect", {"sleep": 1.2, "id": "long"}, timeout=30)
        assert result == {"echo": {"sleep": 1.2, "id": "long"}}
        assert sender.dispatcher is not None and sender.dispatcher.stats["retries"] >= 2
    assert pair.calls == {'{"id": "long", "sleep": 1.2}': 1}
    assert len(effects(pair.rdb)) == 1


def test_501_and_refused_jobs_raise(pair: Pair) -> None:
    def not_implemented(request: Request) -> Response:
        return Response("this endpoint will never do that", status_code=501)

    app = Starlette(routes=[Route("/x", not_implemented, methods=["POST"])])
    with serve_in_thread(app) as other, pair.sender() as sender:
        with pytest.raises(MessageFailed) as info:
            sender.send(other + "/x", {"a": 1})
        assert info.value.status == 501
        with pytest.raises(MessageFailed) as info:
            sender.put(pair.base + "/effect", {"refuse": True})
        assert info.value.status == 501
        with pytest.raises(MessageFailed):
            sender.perform_job(pair.base + "/effect", pair.reply_url, {"refuse": True}, timeout=10)
        with pytest.raises(MessageFailed) as info:
            sender.send(pair.base + "/nowhere", {})
        assert info.value.status == 404
    assert effects(pair.rdb) == []


def test_the_absurd_deadline_raises(pair: Pair) -> None:
    with pair.sender(absurd_after=0.5, request_timeout=0.2) as sender:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            sender.send("http://127.0.0.1:9/never", {"a": 1})  # nothing listens on port 9
        assert time.monotonic() - t0 < 5


def test_async_sender(pair: Pair) -> None:
    async def main() -> list[Any]:
        async with AsyncSender(pair.sdb, allowed_hosts=LOCAL, retry=FAST) as sender:
            return list(
                await asyncio.gather(
                    sender.put(pair.base + "/effect", {"a": 1}),
                    sender.send(pair.base + "/effect", {"a": 2}),
                    sender.perform_job(pair.base + "/effect", pair.reply_url, {"a": 3}),
                )
            )

    assert asyncio.run(main()) == [{"echo": {"a": 1}}, None, {"echo": {"a": 3}}]


def test_signed_requests(stores: Any) -> None:
    sdb = homing.connect(stores.url("s"))
    rdb = homing.connect(stores.url("r"))
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    receiver = Receiver(rdb, secrets={"peer1": b"s3cret"})
    receiver.add_node("/n", lambda body, tx: body)
    try:
        with serve_in_thread(receiver.app) as base:
            with Sender(sdb, signing={"*": ("peer1", b"s3cret")}, retry=FAST) as good:
                assert good.put(base + "/n", {"signed": True}) == {"signed": True}
            with Sender(sdb, signing={"*": ("peer1", b"wrong")}, retry=FAST) as bad:
                with pytest.raises(MessageFailed) as info:
                    bad.put(base + "/n", {"signed": "badly"})
                assert info.value.status == 401
            r = httpx.post(base + "/n", content=b"{}", headers={wire.MESSAGE_ID: homing.uuid7()})
            assert r.status_code == 401 and "not signed" in r.json()["error"]
            old = wire.sign("peer1", b"s3cret", "POST", "/n", "x", b"{}", now=time.time() - 3600)
            msg_id = homing.uuid7()
            old = wire.sign("peer1", b"s3cret", "POST", "/n", msg_id, b"{}", time.time() - 3600)
            r = httpx.post(
                base + "/n",
                content=b"{}",
                headers={wire.MESSAGE_ID: msg_id, wire.SIGNATURE: old},
            )
            assert r.status_code == 401 and "clock" in r.json()["error"]
    finally:
        sdb.close()
        rdb.close()
