"""Issue 19 items 1 and 2: homing's receiver as an idempotent API for any HTTP client (IETF
Idempotency-Key, RFC 9457 problems) and Standard Webhooks both ways, proved with the
reference ``standardwebhooks`` package. Real uvicorn servers, both backends.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import homing
from homing.http import Receiver, RetryPolicy, Sender
from homing.http.testing import serve_in_thread

FAST = RetryPolicy(initial=0.01, maximum=0.05)
SECRET = "whsec_" + base64.b64encode(b"a shared secret of 32 bytes long").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"the key before the last rotation").decode()
WRONG = "whsec_" + base64.b64encode(b"a secret nobody shared with them").decode()
PROBLEM = "application/problem+json"


def eventually(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@dataclass
class Api:
    db: homing.Database
    base: str
    auth_base: str  # keys scoped per Authorization
    hooks_base: str  # Standard Webhooks verified
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    calls: list[Any] = field(default_factory=list)

    def effects(self, tag: str) -> list[str]:
        with self.db.store.transaction(write=False) as tx:
            return [str(r[0]) for r in tx.query("SELECT k FROM effects") if tag in str(r[0])]


@pytest.fixture
def api(stores: Any) -> Iterator[Api]:
    db = homing.connect(stores.url("api"))
    assert isinstance(db, homing.Database)
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (k TEXT NOT NULL)")
    receiver = Receiver(db, handler_retry=FAST)
    auth = Receiver(db, handler_retry=FAST, idempotency_scope="authorization", dispatch=False)
    # with webhook secrets every request must be signed (Standard Webhooks or homing's)
    hooks = Receiver(db, handler_retry=FAST, webhook_secrets=[SECRET, OLD_SECRET], dispatch=False)
    with (
        serve_in_thread(receiver.app) as base,
        serve_in_thread(auth.app) as auth_base,
        serve_in_thread(hooks.app) as hooks_base,
    ):
        a = Api(db, base, auth_base, hooks_base)

        def charge(body: Any, tx: homing.Transaction) -> Any:
            a.calls.append(body)
            if isinstance(body, dict) and body.get("block"):
                a.started.set()
                assert a.release.wait(30)
            tx.tx.execute("INSERT INTO effects (k) VALUES (?)", (json.dumps(body, sort_keys=True),))
            return {"charged": body}

        for r in (receiver, auth, hooks):
            r.add_node("/charges", charge)
        yield a
    db.close()


def post(base: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        base + "/charges",
        content=body,
        headers={"content-type": "application/json", **headers},
        timeout=60,
    )


def test_idempotency_key_from_a_plain_client(api: Api) -> None:
    key = '"8e03978e-40d5-43e8-bc93-6894a57f9324"'
    first = post(api.base, b'{"amount": 5}', **{"Idempotency-Key": key})
    assert first.status_code == 200 and first.json() == {"charged": {"amount": 5}}
    again = post(api.base, b'{"amount": 5}', **{"Idempotency-Key": key})
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["homing-replayed"] == "true"
    changed = post(api.base, b'{"amount": 6}', **{"Idempotency-Key": key})
    assert changed.status_code == 422 and changed.headers["content-type"] == PROBLEM
    problem = changed.json()
    assert problem["status"] == 422 and "different body" in problem["detail"] and problem["title"]
    assert api.effects("amount") == ['{"amount": 5}']
    # bare (non structured-field) keys work too; bad keys are a 400 problem, nothing stored
    assert post(api.base, b'{"amount": 7}', **{"Idempotency-Key": "k-7"}).status_code == 200
    for bad in ('""', "x" * 256, "caf\u00e9"):
        r = httpx.post(
            api.base + "/charges",
            content=b'{"amount": 8}',
            headers=[("content-type", "application/json"), ("idempotency-key", bad.encode())],
        )
        assert r.status_code == 400 and r.headers["content-type"] == PROBLEM, (bad, r.text)
    missing = post(api.base, b'{"amount": 9}')
    assert missing.status_code == 400 and "Idempotency-Key" in missing.json()["detail"]
    assert sorted(api.effects("amount")) == ['{"amount": 5}', '{"amount": 7}']


def test_a_retry_racing_the_first_request_gets_409_and_one_effect(api: Api) -> None:
    key = {"Idempotency-Key": '"race-1"'}
    body = b'{"block": 1, "n": "race"}'
    results: list[httpx.Response] = []
    first = threading.Thread(target=lambda: results.append(post(api.base, body, **key)))
    first.start()
    assert api.started.wait(30)  # the first request's handler is running now
    racing = post(api.base, body, **key)
    assert racing.status_code == 409 and racing.headers["content-type"] == PROBLEM
    assert racing.json()["status"] == 409 and racing.headers["retry-after"]
    api.release.set()
    first.join(60)
    assert [r.status_code for r in results] == [200]
    # concurrent duplicates after that: every one replays, one effect in all
    replies: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda: replies.append(post(api.base, body, **key)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.status_code for r in replies] == [200] * 8
    assert {r.content for r in replies} == {results[0].content}
    assert api.effects("race") == ['{"block": 1, "n": "race"}'] and len(api.calls) == 1


def test_concurrent_first_requests_with_one_key_have_one_effect(api: Api) -> None:
    key = {"Idempotency-Key": "storm"}
    replies: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda: replies.append(post(api.base, b'{"storm": 1}', **key)))
        for _ in range(10)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    codes = sorted(r.status_code for r in replies)
    assert set(codes) <= {200, 409} and 200 in codes, codes
    assert api.effects("storm") == ['{"storm": 1}']


def test_keys_are_scoped_per_authenticated_client(api: Api) -> None:
    base = api.auth_base
    key = {"Idempotency-Key": '"same-key"'}
    a = post(base, b'{"who": "a"}', Authorization="Bearer alice", **key)
    b = post(base, b'{"who": "b"}', Authorization="Bearer bob", **key)
    assert (a.status_code, b.status_code) == (200, 200)
    assert post(base, b'{"who": "x"}', Authorization="Bearer alice", **key).status_code == 422
    anonymous = post(base, b'{"who": "c"}', **key)
    assert anonymous.status_code == 401 and anonymous.headers["content-type"] == PROBLEM
    assert sorted(api.effects("who")) == ['{"who": "a"}', '{"who": "b"}']


def test_homing_sender_signs_standard_webhooks_the_reference_library_verifies(
    api: Api, stores: Any
) -> None:
    verified: list[tuple[str, Any]] = []
    refused: list[str] = []

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        try:  # each key of a rotation verifies on its own
            for secret in (SECRET, OLD_SECRET):
                payload = Webhook(secret).verify(body, headers)
            verified.append((headers["webhook-id"], payload))
        except Exception as exc:
            refused.append(str(exc))
            return Response(status_code=401)
        return Response(status_code=204)

    app = Starlette(routes=[Route("/hook", endpoint, methods=["POST"])])
    sdb = homing.connect(stores.url("webhook_sender"))
    assert isinstance(sdb, homing.Database)
    try:
        with serve_in_thread(app) as base:
            signing = {base + "/hook": [SECRET, OLD_SECRET]}
            with Sender(sdb, retry=FAST, webhook_signing=signing) as sender:
                pending = sender.enqueue("send", base + "/hook", {"event": "paid"})
                assert pending.wait(timeout=30) is None
    finally:
        sdb.close()
    assert refused == [] and verified == [(pending.id, {"event": "paid"})]


def test_homing_receiver_takes_what_the_reference_library_signs(api: Api) -> None:
    body = json.dumps({"webhook": "invoice.paid"})
    now = datetime.now(tz=UTC)
    msg_id = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"

    def headers(secret: str, when: datetime = now, wid: str = msg_id) -> dict[str, str]:
        return {
            "webhook-id": wid,
            "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": Webhook(secret).sign(wid, when, body),
            "content-type": "application/json",
        }

    for _ in range(3):  # a replayed delivery is dropped by the inbox
        r = httpx.post(api.hooks_base + "/charges", content=body, headers=headers(OLD_SECRET))
        assert r.status_code == 204, r.text
    assert eventually(lambda: api.effects("invoice"))
    wrong = "whsec_" + base64.b64encode(b"not the secret at all, sorry!!!").decode()
    r = httpx.post(api.hooks_base + "/charges", content=body, headers=headers(wrong, wid="msg_x"))
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM
    stale = datetime.fromtimestamp(now.timestamp() - 3600, tz=UTC)
    r = httpx.post(
        api.hooks_base + "/charges", content=body, headers=headers(SECRET, stale, "msg_y")
    )
    assert r.status_code == 401 and "timestamp" in r.json()["detail"]
    r = httpx.post(
        api.hooks_base + "/charges",
        content=body.replace("paid", "void"),
        headers=headers(SECRET, wid="msg_z"),
    )
    assert r.status_code == 401
    unsigned = httpx.post(
        api.hooks_base + "/charges", content=body, headers={"idempotency-key": "k"}
    )
    assert unsigned.status_code == 401
    time.sleep(0.2)  # a second handling of the replays would show up now
    assert api.effects("invoice") == ['{"webhook": "invoice.paid"}']


def test_homing_to_homing_over_standard_webhooks(api: Api, stores: Any) -> None:
    """A homing sender signing only with Standard Webhooks (besides its own headers) is
    taken by a homing receiver that verifies Standard Webhooks: one effect per message."""
    sdb = homing.connect(stores.url("hook_sender"))
    assert isinstance(sdb, homing.Database)
    try:
        with Sender(sdb, retry=FAST, webhook_signing={"*": [SECRET]}) as sender:
            assert sender.send(api.hooks_base + "/charges", {"via": "standard"}) is None
        # (one dispatcher at a time on this outbox: each signs with its own secret)
        with Sender(sdb, retry=FAST, webhook_signing={"*": [WRONG]}) as bad:
            with pytest.raises(homing.http.MessageFailed) as info:
                bad.send(api.hooks_base + "/charges", {"via": "forged"})
            assert info.value.status == 401
    finally:
        sdb.close()
    assert eventually(lambda: api.effects("via")) == ['{"via": "standard"}']


def test_a_retry_racing_the_first_in_another_process_has_one_effect(api: Api) -> None:
    """Two receivers on one store (two processes of one service): a retry that reaches the
    other one while the first request runs gets 409 on PostgreSQL (an advisory lock) and
    waits for the store's single writer on SQLite, then replays; one effect either way."""
    other = Receiver(api.db, handler_retry=FAST, dispatch=False)
    other.add_node("/charges", lambda body, tx: {"not": "this one"})
    key = {"Idempotency-Key": '"two-processes"'}
    body = b'{"block": 1, "n": "two"}'
    results: list[httpx.Response] = []
    with serve_in_thread(other.app) as other_base:
        first = threading.Thread(target=lambda: results.append(post(api.base, body, **key)))
        first.start()
        assert api.started.wait(30)
        racing: list[httpx.Response] = []
        second = threading.Thread(target=lambda: racing.append(post(other_base, body, **key)))
        second.start()
        if api.db.dialect == "postgres":
            second.join(60)
            assert racing[0].status_code == 409 and racing[0].json()["status"] == 409
        api.release.set()
        first.join(60)
        second.join(60)
        again = post(other_base, body, **key)
    assert [r.status_code for r in results] == [200] and again.status_code == 200
    assert again.json() == results[0].json() == {"charged": {"block": 1, "n": "two"}}
    if api.db.dialect == "sqlite":
        assert racing[0].status_code == 200 and racing[0].json() == results[0].json()
    assert api.effects('"two"') == ['{"block": 1, "n": "two"}'] and len(api.calls) == 1
