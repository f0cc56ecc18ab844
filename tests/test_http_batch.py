"""Batches of Option 2 messages (``homing.http.batch_wire``): a sender with ``batch`` > 1
sends a homing receiver's due messages many a request, and each message is still checked,
stored, answered and counted as if it came alone. On both backends."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import homing
from homing.http import AsyncSender, Receiver, RetryPolicy, Sender, batch_wire, wire
from homing.http.testing import serve_in_thread
from tests.http_reads import outbox_reads

FAST = RetryPolicy(initial=0.05, maximum=0.5)
LOCAL = ["127.0.0.1"]
SECRET = {"k1": b"s3cret"}


@dataclass
class Side:
    sdb: homing.Database
    rdb: homing.Database
    receiver: Receiver
    base: str
    signed: str  # a receiver on the same store that requires Homing-Signature
    no_batches: str  # the same receiver behind a proxy that answers 404 at its batch URL
    seen: list[Any]
    requests: dict[str, int] = field(default_factory=dict)

    def effects(self, tag: str) -> list[int]:
        return sorted(b["i"] for b in self.seen if b.get("tag") == tag)


def counting(app: Any, counts: dict[str, int], refuse_batches: bool = False) -> Any:
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            batch = scope["path"].endswith("/_homing/batch")
            counts["batch" if batch else "single"] = (
                counts.get("batch" if batch else "single", 0) + 1
            )
            if batch and refuse_batches:
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return wrapped


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def side(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Side]:
    from tests.conftest import StoreFactory

    stores = StoreFactory(str(request.param), tmp_path_factory.mktemp("batch"))
    sdb = homing.connect(stores.url("sender"))
    rdb = homing.connect(stores.url("receiver"))
    assert isinstance(sdb, homing.Database) and isinstance(rdb, homing.Database)
    seen: list[Any] = []

    def record(body: Any, tx: homing.Transaction) -> None:
        if isinstance(body, bytes):  # a message that is not JSON
            body = {"tag": "bytes", "i": len(body)}
        seen.append(body)
        tx.insert("BatchEffect", body)  # the effect is in the inbox's transaction

    receiver = Receiver(rdb, dispatch=False, handler_retry=FAST)
    receiver.add_node("/e", record)
    receiver.add_node("/f", record)
    signed = Receiver(rdb, dispatch=False, secrets=SECRET, handler_retry=FAST)
    signed.add_node("/e", record)  # receivers on one store handle its inbox together:
    signed.add_node("/f", record)  # the same nodes on each
    counts: dict[str, int] = {}
    try:
        with (
            serve_in_thread(counting(receiver.app, counts)) as base,
            serve_in_thread(signed.app) as signed_base,
            serve_in_thread(counting(receiver.app, {}, refuse_batches=True)) as plain,
        ):
            yield Side(sdb, rdb, receiver, base, signed_base, plain, seen, counts)
    finally:
        sdb.close()
        rdb.close()
        stores.cleanup()


def effect_rows(db: homing.Database, tag: str) -> list[int]:
    with db.store.transaction(write=False) as tx:
        rows = tx.query("SELECT args FROM homing_jobs WHERE type = 'BatchEffect'")
    found = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows]
    return sorted(a["i"] for a in found if a.get("tag") == tag)


def eventually(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def send_all(sender: Sender, urls: list[str], tag: str, n: int) -> None:
    with sender.db.transaction() as t:
        pending = [
            sender.enqueue("send", urls[i % len(urls)], {"tag": tag, "i": i}, tx=t)
            for i in range(n)
        ]
    for p in pending:
        p.wait(60)


def test_a_sender_batches_a_receivers_messages_and_each_is_stored_once(side: Side) -> None:
    before = dict(side.requests)
    with Sender(side.sdb, batch=16, allowed_hosts=LOCAL, retry=FAST) as sender:
        send_all(sender, [side.base + "/e", side.base + "/f"], "many", 300)
        assert sender.dispatcher is not None
        assert sender.dispatcher.stats["batches"] > 0
    eventually(lambda: len(effect_rows(side.rdb, "many")) >= 300)
    assert effect_rows(side.rdb, "many") == list(range(300))  # each once, none lost
    requests = side.requests.get("batch", 0) + side.requests.get("single", 0)
    requests -= before.get("batch", 0) + before.get("single", 0)
    assert requests <= 300 // 2, side.requests  # far fewer requests than messages


def test_a_send_delivered_in_a_batch_is_not_read_back(
    side: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batched dispatcher says a delivered send is delivered with the wake-up, as the
    one-message path does: ``AsyncSender.send`` returns without reading its outbox row
    (it read each at least once before). Every message has its effect, once."""
    polls = outbox_reads(monkeypatch)
    n = 64

    async def main() -> list[Any]:
        async with AsyncSender(side.sdb, batch=16, allowed_hosts=LOCAL, retry=FAST) as sender:
            sent = await asyncio.gather(
                *(sender.send(side.base + "/e", {"tag": "unread", "i": i}) for i in range(n))
            )
            assert sender.sync.dispatcher is not None
            assert sender.sync.dispatcher.stats["batches"] > 0
            return list(sent)

    assert asyncio.run(main()) == [None] * n
    assert polls == []
    eventually(lambda: len(effect_rows(side.rdb, "unread")) >= n)
    assert effect_rows(side.rdb, "unread") == list(range(n))  # each once, none lost


def test_without_batch_a_sender_sends_one_request_a_message(side: Side) -> None:
    before = side.requests.get("batch", 0)
    with Sender(side.sdb, allowed_hosts=LOCAL, retry=FAST) as sender:
        send_all(sender, [side.base + "/e"], "alone", 40)
    assert side.requests.get("batch", 0) == before
    eventually(lambda: effect_rows(side.rdb, "alone") == list(range(40)))


def test_a_receiver_that_refuses_batches_gets_each_message_alone(side: Side) -> None:
    """Its answers say it takes batches, but its batch URL answers 404 (a proxy in front
    that does not pass it): the sender stops batching there and nothing is lost."""
    with Sender(side.sdb, batch=16, allowed_hosts=LOCAL, retry=FAST) as sender:
        send_all(sender, [side.no_batches + "/e"], "refused", 120)
        assert sender.dispatcher is not None and sender.dispatcher.batcher is not None
        assert sender.dispatcher.batcher.refused  # it tried, and gave up on that URL
    eventually(lambda: effect_rows(side.rdb, "refused") == list(range(120)))


def message(
    path: str,
    body: Any,
    *,
    msg_id: str | None = None,
    mode: str = "send",
    ctype: str = "application/json",
) -> batch_wire.BatchMessage:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": ctype, wire.MODE: mode}
    headers[wire.MESSAGE_ID] = msg_id or str(uuid.uuid4())
    return batch_wire.BatchMessage("POST", path, headers, data)


def post_batch(base: str, messages: list[batch_wire.BatchMessage]) -> httpx.Response:
    return httpx.post(
        base + "/_homing/batch",
        content=batch_wire.encode_batch(messages),
        headers={"content-type": batch_wire.BATCH_TYPE},
        timeout=30,
    )


def test_each_message_of_a_batch_is_answered_as_if_it_came_alone(side: Side) -> None:
    alone_id = str(uuid.uuid4())
    r = httpx.post(
        side.base + "/e",
        content=json.dumps({"tag": "mixed", "i": 0}).encode(),
        headers={"content-type": "application/json", wire.MESSAGE_ID: alone_id, wire.MODE: "send"},
    )
    assert r.status_code == 204
    assert r.headers[batch_wire.BATCH_HEADER] == "/_homing/batch"  # where batches go
    batch = [
        message("/e", {"tag": "mixed", "i": 1}),  # new
        message("/e", {"tag": "mixed", "i": 0}, msg_id=alone_id),  # a repeat: stored already
        message("/e", {"tag": "mixed", "i": 99}, msg_id=alone_id),  # the same id, another body
        message("/nowhere", {"tag": "mixed", "i": 2}),
        message("/e", b'{"tag": "mixed", "i": NaN}'),  # not strict JSON
        message("/e", {"tag": "mixed", "i": 3}, mode="put"),  # batches carry Option 2 only
        message("/e", {"tag": "mixed", "i": 4}, msg_id="not-a-uuid"),
        message("/f", b"\x00raw bytes", ctype="application/octet-stream"),
    ]
    r = post_batch(side.base, batch)
    assert r.status_code == 200, r.text
    statuses = [x["status"] for x in r.json()["results"]]
    assert statuses == [204, 204, 422, 404, 400, 400, 400, 204]
    assert "different body" in r.json()["results"][2]["detail"]
    eventually(lambda: effect_rows(side.rdb, "mixed") == [0, 1])  # once each
    # the same batch again: everything stored is a repeat now, and still answered 2xx
    again = post_batch(side.base, batch[:2])
    assert [x["status"] for x in again.json()["results"]] == [204, 204]
    time.sleep(0.2)
    assert effect_rows(side.rdb, "mixed") == [0, 1]


@pytest.mark.parametrize(
    "body,status,why",
    [
        (b"", 400, "no message"),
        (b"garbage without a newline", 400, "JSON line"),
        (b'{"method":"POST","target":"/e","headers":{},"length":50}\n{"short":1}', 400, "left"),
        (b'["not", "an", "object"]\n', 400, "JSON object"),
        (b'{"method":"POST","target":"e","headers":{},"length":0}\n', 400, "target"),
    ],
)
def test_a_batch_that_cannot_be_read_is_refused_whole(
    side: Side, body: bytes, status: int, why: str
) -> None:
    before = len(side.seen)
    r = httpx.post(
        side.base + "/_homing/batch", content=body, headers={"content-type": batch_wire.BATCH_TYPE}
    )
    assert r.status_code == status and why in r.json()["detail"], r.text
    assert len(side.seen) == before


def test_too_many_messages_in_a_batch_are_refused_with_413(side: Side) -> None:
    batch = [
        message("/e", {"tag": "toomany", "i": i}) for i in range(batch_wire.MAX_BATCH_MESSAGES + 1)
    ]
    r = post_batch(side.base, batch)
    assert r.status_code == 413, r.text
    time.sleep(0.2)
    assert effect_rows(side.rdb, "toomany") == []


def test_a_forged_message_in_a_batch_is_refused_and_the_signed_ones_stored(side: Side) -> None:
    """A batch is not signed as a whole: each message carries its own signature, so one
    forged message cannot ride along with signed ones."""
    signed = message("/e", {"tag": "signed", "i": 1})
    signed.headers[wire.SIGNATURE] = wire.sign(
        "k1", SECRET["k1"], "POST", "/e", signed.headers, signed.body, time.time()
    )
    forged = message("/e", {"tag": "signed", "i": 2})
    forged.headers[wire.SIGNATURE] = wire.sign(
        "k1", b"wrong", "POST", "/e", forged.headers, forged.body, time.time()
    )
    unsigned = message("/e", {"tag": "signed", "i": 3})
    r = post_batch(side.signed, [signed, forged, unsigned])
    assert [x["status"] for x in r.json()["results"]] == [204, 401, 401], r.text
    eventually(lambda: effect_rows(side.rdb, "signed") == [1])
    # and a signing sender's batches pass
    with Sender(
        side.sdb, batch=8, allowed_hosts=LOCAL, retry=FAST, signing={"*": ("k1", SECRET["k1"])}
    ) as sender:
        send_all(sender, [side.signed + "/e"], "signed-sender", 60)
        assert sender.dispatcher is not None and sender.dispatcher.stats["batches"] > 0
    eventually(lambda: effect_rows(side.rdb, "signed-sender") == list(range(60)))


def test_batch_option_is_checked() -> None:
    with pytest.raises(homing.InvalidArgument, match="batch"):
        from homing.http.dispatcher import Dispatcher

        Dispatcher(None, batch=-1)  # type: ignore[arg-type]
