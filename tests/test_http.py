"""Reliable HTTP messaging (seed 000) on real uvicorn servers and the real httpx client.

Every test runs on SQLite and PostgreSQL (the ``stores`` fixture) for both sides' stores.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
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
    UnsafeURL,
    gc,
    wire,
)
from homing.http.testing import serve_in_thread
from tests.http_reads import outbox_reads

LOCAL = ["127.0.0.1"]
FAST = RetryPolicy(initial=0.02, maximum=0.2)


def effects(db: homing.Database) -> list[tuple[str, str]]:
    with db.store.transaction(write=False) as tx:
        return [(str(k), str(m)) for k, m in tx.query("SELECT k, msg FROM effects ORDER BY k")]


def make_effects_table(db: homing.Database) -> None:
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (k TEXT NOT NULL, msg TEXT NOT NULL)")


def eventually(check: Any, timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns a truthy value (the machine may be loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def inbox_size(db: homing.Database) -> int:
    with db.store.transaction(write=False) as tx:
        return int(tx.query("SELECT COUNT(*) FROM homing_http_inbox")[0][0])


@dataclass
class Pair:
    sdb: homing.Database
    rdb: homing.Database
    receiver: Receiver
    base: str  # the receiver's URL
    strict: str  # a receiver on the same store with no allowed hosts and max_body 1024
    reply_url: str  # the sender's reply node
    calls: dict[str, int]
    receivers: tuple[Receiver, ...] = ()  # every receiver serving ``rdb``

    def sender(self, **kw: Any) -> Sender:
        kw.setdefault("allowed_hosts", LOCAL)
        kw.setdefault("retry", FAST)
        return Sender(self.sdb, **kw)

    def effects_of(self, tag: str) -> list[str]:
        return [k for k, _ in effects(self.rdb) if tag in k]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Sender and receiver stores on one backend, servers on 127.0.0.1; shared by the
    module's tests (each uses its own message bodies) to keep the suite fast."""
    from tests.conftest import StoreFactory

    stores = StoreFactory(str(request.param), tmp_path_factory.mktemp("http"))
    sdb = homing.connect(stores.url("sender"))
    rdb = homing.connect(stores.url("receiver"))
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    make_effects_table(rdb)
    calls: dict[str, int] = {}

    def effect(body: Any, tx: homing.Transaction) -> Any:
        key = json.dumps(body, sort_keys=True)
        calls[key] = calls.get(key, 0) + 1
        if isinstance(body, dict) and body.get("sleep"):
            time.sleep(body["sleep"])
        if isinstance(body, dict) and body.get("refuse"):
            raise homing.PermanentFailure("this message can never be handled")
        tx.tx.execute("INSERT INTO effects (k, msg) VALUES (?, ?)", (key, "x"))
        return {"echo": body}

    def raw(body: Any, tx: homing.Transaction) -> Any:
        assert isinstance(body, bytes)
        return body[::-1]

    receiver = Receiver(rdb, allowed_hosts=LOCAL, handler_retry=FAST)
    receiver.add_node("/effect", effect)
    receiver.add_node("/bytes", raw)
    strict = Receiver(rdb, max_body=1024, dispatch=False)
    strict.add_node("/effect", effect)
    sender_side = Receiver(sdb, allowed_hosts=LOCAL, dispatch=False)
    try:
        with (
            serve_in_thread(receiver.app) as base,
            serve_in_thread(strict.app) as strict_base,
            serve_in_thread(sender_side.app) as sbase,
        ):
            yield Pair(
                sdb,
                rdb,
                receiver,
                base,
                strict_base,
                sbase + "/_homing/reply",
                calls,
                (receiver, strict),
            )
    finally:
        sdb.close()
        rdb.close()
        stores.cleanup()


def test_put_send_and_perform_job_round_trip(pair: Pair) -> None:
    with pair.sender() as sender:
        assert sender.put(pair.base + "/effect", {"rt": 1}) == {"echo": {"rt": 1}}
        assert sender.send(pair.base + "/effect", {"rt": 2}) is None
        assert sender.perform_job(pair.base + "/effect", pair.reply_url, {"rt": 3}) == {
            "echo": {"rt": 3}
        }
        assert sender.put(pair.base + "/bytes", b"abc") == b"cba"
        assert eventually(lambda: len(pair.effects_of('"rt"')) == 3)
    assert sorted(pair.effects_of('"rt"')) == ['{"rt": 1}', '{"rt": 2}', '{"rt": 3}']

    # the confirmation DELETE was followed: the receiver dropped the stored put responses
    def unconfirmed() -> list[Any]:
        with pair.rdb.store.transaction() as tx:
            return tx.query("SELECT id FROM homing_http_inbox WHERE mode = 'put' AND confirmed = 0")

    with pair.sender():
        assert eventually(lambda: unconfirmed() == [])


def test_duplicate_deliveries_run_the_handler_once(pair: Pair) -> None:
    msg_id = homing.uuid7()
    body = json.dumps({"dup": 1}).encode()
    headers = {wire.MESSAGE_ID: msg_id, wire.MODE: "put", "content-type": "application/json"}

    def post() -> httpx.Response:
        return httpx.post(pair.base + "/effect", content=body, headers=headers, timeout=30)

    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(post())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r.status_code == 200]
    assert ok and all(r.status_code in (200, 409) for r in results), results
    assert {r.json()["echo"]["dup"] for r in ok} == {1}
    again = post()
    assert again.status_code == 200 and again.headers[wire.REPLAYED] == "true"
    # Option 2 and job repeats: the same ack every time, one effect
    for mode, status, n in (("send", 204, 2), ("job", 202, 3)):
        same = homing.uuid7()
        extra = {wire.RESPONSE_URL: pair.reply_url} if mode == "job" else {}
        for _ in range(5):
            r = httpx.post(
                pair.base + "/effect",
                content=json.dumps({"dup": n}).encode(),
                headers={**headers, wire.MESSAGE_ID: same, wire.MODE: mode, **extra},
            )
            assert r.status_code == status, r.text
    assert eventually(lambda: len(pair.effects_of('"dup"')) >= 3)
    time.sleep(0.3)  # a duplicate handling would show up now
    assert sorted(pair.effects_of('"dup"')) == ['{"dup": 1}', '{"dup": 2}', '{"dup": 3}']
    assert [pair.calls[f'{{"dup": {n}}}'] for n in (1, 2, 3)] == [1, 1, 1]
    # same id, different body: refused, nothing changes
    r = httpx.post(pair.base + "/effect", content=b'{"dup": 4}', headers=headers)
    assert r.status_code == 422 and "different body" in r.json()["error"]
    assert '{"dup": 4}' not in pair.calls


def test_transactional_outbox_commits_with_the_callers_writes(pair: Pair) -> None:
    with pair.sdb.store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT)")
    with pair.sender() as sender:
        with pytest.raises(RuntimeError), pair.sdb.transaction() as t:
            t.tx.execute("INSERT INTO orders VALUES ('rolled back')")
            sender.send(pair.base + "/effect", {"tx": "no"})
            raise RuntimeError("the caller changes its mind")
        with pair.sdb.transaction() as t:
            t.tx.execute("INSERT INTO orders VALUES ('kept')")
            pending = sender.send(pair.base + "/effect", {"tx": "yes"}, tx=t)
            put = sender.put(pair.base + "/effect", {"tx": "put"})  # joins the open transaction
        assert pending.wait(30) is None
        assert put.wait(30) == {"echo": {"tx": "put"}}
    assert eventually(lambda: len(pair.effects_of('"tx"')) == 2)
    assert sorted(pair.effects_of('"tx"')) == ['{"tx": "put"}', '{"tx": "yes"}']
    with pair.sdb.store.transaction() as tx:
        assert tx.query("SELECT id FROM orders") == [("kept",)]
        assert tx.query("SELECT id FROM homing_http_outbox WHERE body = ?", (b'{"tx":"no"}',)) == []


def test_sender_restarted_with_a_full_outbox_delivers_each_once(pair: Pair) -> None:
    stopped = Sender(pair.sdb, dispatch=False)  # stores only, like a sender that died
    handles = [stopped.enqueue("send", pair.base + "/effect", {"restart": i}) for i in range(20)]
    with pair.sender() as restarted:
        for h in handles:
            assert restarted.wait(h.id, timeout=60) is None
    assert eventually(lambda: len(pair.effects_of("restart")) >= 20)
    keys = pair.effects_of("restart")
    assert len(keys) == 20 and len(set(keys)) == 20


def test_long_job_with_sender_timeouts_and_retries(pair: Pair) -> None:
    with pair.sender(request_timeout=0.3) as sender:
        result = sender.put(pair.base + "/effect", {"sleep": 1.2, "long": 1}, timeout=60)
        assert result == {"echo": {"sleep": 1.2, "long": 1}}
        assert sender.dispatcher is not None and sender.dispatcher.stats["retries"] >= 2
    assert pair.calls['{"long": 1, "sleep": 1.2}'] == 1
    assert len(pair.effects_of('"long"')) == 1


def test_501_and_refused_messages_raise(pair: Pair) -> None:
    def not_implemented(request: Request) -> Response:
        return Response("this endpoint will never do that", status_code=501)

    app = Starlette(routes=[Route("/x", not_implemented, methods=["POST"])])
    with serve_in_thread(app) as other, pair.sender() as sender:
        with pytest.raises(MessageFailed) as info:
            sender.send(other + "/x", {"a": 1})
        assert info.value.status == 501 and info.value.body == b"this endpoint will never do that"
        with pytest.raises(MessageFailed) as info:
            sender.put(pair.base + "/effect", {"refuse": "put"})
        assert info.value.status == 501
        with pytest.raises(MessageFailed):
            sender.perform_job(pair.base + "/effect", pair.reply_url, {"refuse": "job"}, timeout=60)
        with pytest.raises(MessageFailed) as info:
            sender.send(pair.base + "/nowhere", {})
        assert info.value.status == 404
    assert pair.effects_of("refuse") == []


def test_the_absurd_deadline_raises(pair: Pair) -> None:
    with pair.sender(absurd_after=0.5, request_timeout=0.2) as sender:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            sender.send("http://127.0.0.1:9/never", {"a": 1})  # nothing listens on port 9
        assert time.monotonic() - t0 < 10


def test_async_sender(pair: Pair) -> None:
    async def main() -> list[Any]:
        async with AsyncSender(pair.sdb, allowed_hosts=LOCAL, retry=FAST) as sender:
            return list(
                await asyncio.gather(
                    sender.put(pair.base + "/effect", {"aio": 1}),
                    sender.send(pair.base + "/effect", {"aio": 2}),
                    sender.perform_job(pair.base + "/effect", pair.reply_url, {"aio": 3}),
                )
            )

    assert asyncio.run(main()) == [{"echo": {"aio": 1}}, None, {"echo": {"aio": 3}}]


def test_a_delivered_send_is_not_read_back(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """``AsyncSender.send`` with the dispatcher in this process: the caller's wake-up is
    registered before its message is stored, and the dispatcher that delivers a send says
    so with the wake-up, so the caller returns without reading the outbox row (it read it
    twice a message before: once right after storing it, once when woken). Every message
    still has its effect, once."""
    polls = outbox_reads(monkeypatch)
    n = 40

    async def main() -> list[Any]:
        async with AsyncSender(pair.sdb, allowed_hosts=LOCAL, retry=FAST) as sender:
            return list(
                await asyncio.gather(
                    *(sender.send(pair.base + "/effect", {"unread": i}) for i in range(n))
                )
            )

    assert asyncio.run(main()) == [None] * n
    assert polls == []
    # a send is acknowledged once stored; its handler may run after the 204
    expected = sorted(json.dumps({"unread": i}, sort_keys=True) for i in range(n))
    assert eventually(lambda: sorted(pair.effects_of("unread")) == expected)
    assert sorted(pair.effects_of("unread")) == expected  # and no more than once


def test_a_synchronous_send_is_not_read_back(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Sender.send`` with the dispatcher in this process registers its wake-up before
    storing the message, as ``AsyncSender`` does: its first wait is for the wake-up, not a
    read of the row it just stored, and a delivered send is not read back at all (it read
    each row once before). Every message has its effect, once."""
    polls = outbox_reads(monkeypatch)
    n = 20
    with pair.sender() as sender:
        for i in range(n):
            assert sender.send(pair.base + "/effect", {"sync_unread": i}) is None
    assert polls == []
    expected = sorted(json.dumps({"sync_unread": i}, sort_keys=True) for i in range(n))
    assert eventually(lambda: sorted(pair.effects_of("sync_unread")) == expected)
    assert sorted(pair.effects_of("sync_unread")) == expected  # and no more than once


def test_signed_requests(pair: Pair) -> None:
    signed = Receiver(pair.rdb, secrets={"peer1": b"s3cret"}, dispatch=False)
    signed.add_node("/n", lambda body, tx: body)
    with serve_in_thread(signed.app) as base:
        with pair.sender(signing={"*": ("peer1", b"s3cret")}) as good:
            assert good.put(base + "/n", {"signed": True}) == {"signed": True}
        with pair.sender(signing={"*": ("peer1", b"wrong")}) as bad:
            with pytest.raises(MessageFailed) as info:
                bad.put(base + "/n", {"signed": "badly"})
            assert info.value.status == 401
        before = inbox_size(pair.rdb)
        r = httpx.post(base + "/n", content=b"{}", headers={wire.MESSAGE_ID: homing.uuid7()})
        assert r.status_code == 401 and "not signed" in r.json()["error"]
        msg_id = homing.uuid7()
        old = wire.sign(
            "peer1", b"s3cret", "POST", "/n", {wire.MESSAGE_ID: msg_id}, b"{}", time.time() - 3600
        )
        r = httpx.post(
            base + "/n", content=b"{}", headers={wire.MESSAGE_ID: msg_id, wire.SIGNATURE: old}
        )
        assert r.status_code == 401 and "clock" in r.json()["error"]
        assert inbox_size(pair.rdb) == before


BAD_JSON = [
    (b'{"x": NaN}', "NaN"),
    (b'{"x": Infinity}', "Infinity"),
    (b'{"a": 1, "a": 2}', "twice"),
    (b"[" * 100 + b"]" * 100, "nested"),
    (b'{"n": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"n": 9223372036854775808}', "64-bit"),
    (b'{"x": 1', "not valid JSON"),
    (b'"\xff\xfe"', "UTF-8"),
]


def test_bad_input_is_refused_with_a_clear_4xx_and_changes_nothing(pair: Pair) -> None:
    url = pair.base + "/effect"
    json_type = {"content-type": "application/json"}
    before = inbox_size(pair.rdb)

    def post(content: bytes, **headers: str) -> httpx.Response:
        return httpx.post(url, content=content, headers=headers, timeout=30)

    r = post(b"{}", **json_type)
    assert r.status_code == 400 and "Homing-Message-Id" in r.json()["error"]
    r = post(b"{}", **{wire.MESSAGE_ID: "not-a-uuid", **json_type})
    assert r.status_code == 400 and "UUID" in r.json()["error"]
    r = post(b"{}", **{wire.MESSAGE_ID: homing.uuid7(), wire.MODE: "teleport"})
    assert r.status_code == 400 and "Homing-Mode" in r.json()["error"]
    for body, words in BAD_JSON:
        r = post(body, **{wire.MESSAGE_ID: homing.uuid7(), **json_type})
        assert r.status_code == 400, (body[:40], r.text)
        assert words in r.json()["error"], (words, r.json())
    r = httpx.post(pair.base + "/nowhere", content=b"{}", headers={wire.MESSAGE_ID: homing.uuid7()})
    assert r.status_code == 404
    r = post(b"{}", **{wire.MESSAGE_ID: homing.uuid7(), wire.MODE: "job", **json_type})
    assert r.status_code == 400 and "Response-Url" in r.json()["error"]
    # unsafe response URLs, at a receiver that allows no private hosts
    for target in (
        "http://127.0.0.1:8080/r",
        "http://localhost/r",
        "http://10.1.2.3/r",
        "http://192.168.0.1/r",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/r",
        "file:///etc/passwd",
        "gopher://example.com/",
    ):
        r = httpx.post(
            pair.strict + "/effect",
            content=b"{}",
            headers={
                wire.MESSAGE_ID: homing.uuid7(),
                wire.MODE: "job",
                wire.RESPONSE_URL: target,
                **json_type,
            },
        )
        assert r.status_code == 422, (target, r.text)
        assert any(w in r.json()["error"] for w in ("refused", "does not resolve", "only http"))
    # oversize: declared, and streamed without a Content-Length
    big = b'{"x": "' + b"a" * 2000 + b'"}'
    r = httpx.post(pair.strict + "/effect", content=big, headers={wire.MESSAGE_ID: homing.uuid7()})
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunks() -> Iterator[bytes]:
        yield big[:1000]
        yield big[1000:]

    r = httpx.post(
        pair.strict + "/effect", content=chunks(), headers={wire.MESSAGE_ID: homing.uuid7()}
    )
    assert r.status_code == 413
    assert inbox_size(pair.rdb) == before
    assert post(b"{}", **{wire.MESSAGE_ID: homing.uuid7(), **json_type}).status_code == 200


def _raw(base: str, data: bytes, *, read: bool = True) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        if not read:
            return b""
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_lying_content_length_and_disconnects(pair: Pair) -> None:
    before = inbox_size(pair.rdb)
    head = (
        "POST /effect HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"{wire.MESSAGE_ID}: {{id}}\r\nContent-Length: {{n}}\r\n\r\n"
    )
    # says more than it sends, then closes: nothing stored
    _raw(pair.base, head.format(id=homing.uuid7(), n=100).encode() + b"{}", read=True)
    # says less than it sends: the rest is garbage for HTTP, answered 4xx, never 500
    out = _raw(pair.base, head.format(id=homing.uuid7(), n=1).encode() + b'{"a": 1}')
    statuses = [int(line.split()[1]) for line in out.split(b"\r\n") if line.startswith(b"HTTP/1.1")]
    assert statuses and all(400 <= s < 500 for s in statuses), out
    # a non-numeric Content-Length
    out = _raw(pair.base, head.format(id=homing.uuid7(), n="x").encode() + b"{}")
    assert out.startswith(b"HTTP/1.1 4"), out
    # a client that goes away mid-body
    _raw(pair.base, head.format(id=homing.uuid7(), n=50).encode() + b'{"a":', read=False)
    assert inbox_size(pair.rdb) == before
    assert httpx.get(pair.base + "/_homing/info").json()["inbox_retention_s"] > 0


def test_url_safety_rules() -> None:
    assert wire.check_url("http://127.0.0.1:5/x", ["127.0.0.1"])
    assert wire.check_url("http://93.184.216.34/x")  # a public address
    for bad in ("http://127.0.0.1/", "http://0.0.0.0/", "http://[fe80::1]/", "ftp://x/"):
        with pytest.raises(UnsafeURL):
            wire.check_url(bad)
    with pytest.raises(homing.InvalidArgument):
        wire.check_url("http://a b/")


def test_a_job_whose_result_comes_after_the_deadline_raises_and_gc_forgets(pair: Pair) -> None:
    with pair.sender(absurd_after=0.6) as sender:
        with pytest.raises(DeadlineExceeded):
            sender.perform_job(pair.base + "/effect", pair.reply_url, {"sleep": 1.5, "late": 1})
    # the late result is still acked (204) and changes nothing on the sender
    assert eventually(lambda: len(pair.effects_of('"late"')) == 1)
    with pair.sdb.store.transaction() as tx:
        rows = tx.query(
            "SELECT state FROM homing_http_outbox WHERE body = ?", (b'{"sleep":1.5,"late":1}',)
        )
    assert rows == [("failed",)]
    out, inn = gc(pair.rdb, older_than=3600)  # nothing is that old yet
    assert (out, inn) == (0, 0)
    before = inbox_size(pair.rdb)
    with pair.rdb.store.transaction() as tx:  # received 8 days ago: past the receivers'
        tx.execute(  # 7-day retention, and past what they promised their senders
            "UPDATE homing_http_inbox SET received_at = received_at - ?", (8 * 86400,)
        )
    out, inn = gc(pair.rdb, older_than=3600)  # handled ids go
    assert inn > 0 and inbox_size(pair.rdb) == before - inn


@pytest.mark.parametrize("writes_through", ["tx", "connection"])
def test_send_messages_are_handled_in_batches_and_a_failing_one_alone(
    pair: Pair, writes_through: str
) -> None:
    """Option-2 messages are handled many per transaction, each handler in a savepoint: a
    handler that writes and then raises undoes only its own writes, the rest of its batch
    commits, and it is retried alone until it succeeds: every effect exactly once. The
    handler writes through homing's Tx or straight on the DB-API connection (the
    savepoint is set only once a statement runs: taking the connection must set it)."""
    failures: dict[int, int] = {}

    def flaky(body: Any, tx: homing.Transaction) -> None:
        n = int(body["n"])
        if writes_through == "tx":
            tx.tx.execute(
                "INSERT INTO effects (k, msg) VALUES (?, ?)", (f"flaky{writes_through}-{n}", "x")
            )
        else:
            mark = "%s" if tx.dialect == "postgres" else "?"
            tx.connection.execute(
                f"INSERT INTO effects (k, msg) VALUES ({mark}, {mark})",
                (f"flaky{writes_through}-{n}", "x"),
            )
        if n % 5 == 0 and failures.get(n, 0) < 2:
            failures[n] = failures.get(n, 0) + 1
            raise RuntimeError("flaky handler")  # after its write: the write must go

    for receiver in pair.receivers:  # both work loops on this store may pick a message up
        receiver.add_node(f"/flaky-{writes_through}", flaky)
    with pair.sender() as sender:
        with pair.sdb.transaction() as t:
            pending = [
                sender.send(pair.base + f"/flaky-{writes_through}", {"n": n}, tx=t)
                for n in range(40)
            ]
        for p in pending:
            p.wait(30)
    assert eventually(lambda: len(pair.effects_of(f"flaky{writes_through}-")) >= 40)
    assert eventually(lambda: all(failures.get(n) == 2 for n in range(0, 40, 5)))
    time.sleep(0.3)  # a repeated effect would show up now
    assert Counter(pair.effects_of(f"flaky{writes_through}-")) == Counter(
        f"flaky{writes_through}-{n}" for n in range(40)
    )


def test_an_enqueue_hands_its_row_to_the_local_dispatcher_without_a_claim(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row enqueued in a transaction is stored claimed by this process's dispatcher and
    handed to it once the transaction commits: no claim transaction of its own (on SQLite
    one more turn of the shared write lock). A rolled-back enqueue hands nothing over."""
    from homing.http import _claims

    claimed_from_store: list[tuple[str, int]] = []
    real_claim = _claims.claim_due

    def counting_claim(*args: Any) -> list[Any]:
        rows = real_claim(*args)
        # this test's rows only: the module's sender store may hold earlier tests' rows,
        # still due for a retry, which this dispatcher claims from the store as it should
        claimed_from_store.extend((r.id, r.attempts) for r in rows if b"handoff" in r.body)
        return rows

    monkeypatch.setattr(_claims, "claim_due", counting_claim)
    with pair.sender() as sender:
        assert sender.dispatcher is not None
        with pytest.raises(RuntimeError), pair.sdb.transaction() as t:
            sender.send(pair.base + "/effect", {"handoff": "rolled back"}, tx=t)
            raise RuntimeError("the caller changes its mind")
        assert len(sender.dispatcher.handoff) == 0
        pending = []
        for i in range(30):
            with pair.sdb.transaction() as t:
                pending.append(sender.send(pair.base + "/effect", {"handoff": i}, tx=t))
        for p in pending:
            assert p.wait(30) is None
    assert eventually(lambda: len(pair.effects_of("handoff")) == 30)
    keys = pair.effects_of("handoff")
    assert len(set(keys)) == 30 and "rolled back" not in "".join(keys)
    # every row's first attempt came by hand-off: a claim from the store can only be of a
    # retry (a delivery that failed, as one may on a loaded machine)
    assert [c for c in claimed_from_store if c[1] == 0] == []
    with pair.sdb.store.transaction(write=False) as tx:
        assert tx.query(
            "SELECT COUNT(*) FROM homing_http_outbox WHERE claim_token IS NOT NULL AND body LIKE ?",
            (b"%handoff%",),
        ) == [(0,)]  # each claim ended with its row's outcome


def test_a_batch_of_enqueues_is_handed_off_only_up_to_the_queues_bound(pair: Pair) -> None:
    """``AsyncSender`` stores a group commit's messages together: no more of them are
    claimed for the local dispatcher than its hand-off queue has room for (``bound``);
    the rest are stored unclaimed, for any dispatcher's claim, and the dispatcher is
    woken for them once the transaction commits."""
    from homing.http import _claims
    from homing.store import http_queries as q

    class StubDispatcher:
        def __init__(self) -> None:
            self.handoff = _claims.Handoff(bound=3, lease=60.0)
            self.handoff.open("stub-token")
            self.handed: list[q.OutboxRow] = []
            self.wakes = 0

        def hand_off(self, *rows: q.OutboxRow) -> None:
            for row in rows:
                self.handoff.put(row)
            self.handed += rows

        def wake(self) -> None:
            self.wakes += 1

    sender = Sender(pair.sdb, dispatch=False)
    stub = StubDispatcher()
    stub.handoff.put(
        _claims.claimed_row(sender._new("send", pair.base + "/x", 0, None, None), "stub-token", 1.0)
    )
    sender.dispatcher = stub  # type: ignore[assignment]
    msgs = [sender._new("send", pair.base + "/bound", {"b": i}, None, None) for i in range(5)]
    with pair.sdb.store.transaction() as tx:
        sender._insert_many(tx, msgs)
        assert stub.handed == [] and stub.wakes == 0  # nothing before the commit
    assert [r.id for r in stub.handed] == [m.id for m in msgs[:2]]  # room for 2 of 5
    assert stub.wakes == 1
    with pair.sdb.store.transaction(write=False) as tx:
        rows = [q.outgoing(tx, m.id) for m in msgs]
    assert [r.claim_token if r else "missing" for r in rows] == ["stub-token"] * 2 + [None] * 3


def test_rows_claimed_at_enqueue_by_a_dead_process_are_delivered_by_the_next(
    pair: Pair,
) -> None:
    """A process killed after its enqueue committed and before its dispatcher sent the
    row: the row stays claimed by a dead token, and the next dispatcher on the host
    releases it at start (not after the lease), then delivers it once."""
    import subprocess
    import sys

    from homing.http import _claims
    from homing.store import http_queries as q

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    token = f"{socket.gethostname()}:{int(dead.stdout)}:0190aaaa-0000-7000-8000-000000000000"
    stored = Sender(pair.sdb, dispatch=False)
    msg = stored._new("send", pair.base + "/effect", {"dead-claim": 1}, None, None)
    with pair.sdb.store.transaction() as tx:
        q.insert_outgoing(tx, [msg], claim=(token, time.time() + 3600))
    started = time.monotonic()
    with pair.sender() as sender:
        assert sender.wait(msg.id, timeout=30) is None
    assert time.monotonic() - started < 20  # not the hour-long lease
    # delivered = stored by the receiver (the 204); its handler may run just after
    assert eventually(lambda: pair.effects_of("dead-claim") == ['{"dead-claim": 1}'])
    handoff = _claims.Handoff(bound=2, lease=5.0)
    assert handoff.claim(0.0) is None  # no dispatcher running: stored unclaimed
    handoff.open("t")
    assert handoff.claim(1.0) == ("t", 6.0)
    row = _claims.claimed_row(msg, "t", 6.0)
    handoff.put(row)
    handoff.put(row)
    assert handoff.claim(1.0) is None  # two wait already: the next is stored unclaimed
    assert handoff.take(5) == [row, row] and len(handoff) == 0
