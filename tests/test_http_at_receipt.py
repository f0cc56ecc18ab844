"""Handling at receipt: an Option 2 message to a node whose handler has proved short is
handled in the commit that stores it (one transaction instead of two); a failure there
is recorded and retried in the background; a slow handler goes back to the background.
Every effect exactly once, on both stores.

Real uvicorn servers, messages posted with homing's wire headers by httpx.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import homing
from homing.http import Receiver, RetryPolicy
from homing.http.testing import serve_in_thread

FAST = RetryPolicy(initial=0.02, maximum=0.2)
BUDGET = 0.05


def _effects(db: homing.Database, tag: str) -> list[str]:
    with db.store.transaction(write=False) as tx:
        return [str(r[0]) for r in tx.query("SELECT k FROM effects") if tag in str(r[0])]


def _state(db: homing.Database, msg_id: str) -> tuple[str, int]:
    with db.store.transaction(write=False) as tx:
        row = tx.query_one("SELECT state, attempts FROM homing_http_inbox WHERE id = ?", (msg_id,))
    assert row is not None
    return str(row[0]), int(row[1])


def _post(client: httpx.Client, url: str, body: Any, msg_id: str | None = None) -> str:
    msg_id = msg_id or str(uuid.uuid4())
    r = client.post(
        url,
        content=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "homing-message-id": msg_id,
            "homing-mode": "send",
        },
    )
    assert r.status_code == 204, r.text
    return msg_id


def _eventually(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


class Node:
    """A handler that writes its effect, and fails or sleeps when told to."""

    def __init__(self) -> None:
        self.fail_once: set[str] = set()
        self.spoil_once: set[str] = set()  # change the body it was given, then fail
        self.sleep = 0.0

    def __call__(self, body: Any, t: homing.Transaction) -> None:
        key = str(body["k"])
        if key in self.spoil_once:
            self.spoil_once.discard(key)
            body["k"] = "spoilt"
            raise RuntimeError("failing once, after changing the value it was handed")
        t.tx.execute("INSERT INTO effects (k) VALUES (?)", (key,))
        if self.sleep:
            time.sleep(self.sleep)
        if key in self.fail_once:
            self.fail_once.discard(key)
            raise RuntimeError("failing once, after its write (which must be undone)")


@pytest.fixture(params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[homing.Database, Receiver, Node, str]]:
    from tests.conftest import StoreFactory

    stores = StoreFactory(str(request.param), tmp_path_factory.mktemp("at-receipt"))
    db = homing.connect(stores.url("receiver"))
    assert isinstance(db, homing.Database)
    with db.store.transaction() as tx:
        tx.execute("CREATE TABLE effects (k TEXT NOT NULL)")
    node = Node()
    # a budget far above these handlers' run time (the default, 1 ms, is close to what a
    # write to PostgreSQL takes on a loaded machine): which path a message takes must not
    # depend on the machine's load here
    receiver = Receiver(db, handler_retry=FAST, dispatch=False, handle_at_receipt_below=BUDGET)
    receiver.add_node("/n", node)
    try:
        with serve_in_thread(receiver.app) as base:
            yield db, receiver, node, base + "/n"
    finally:
        receiver.stop()
        db.close()
        stores.cleanup()


def _warm_up(client: httpx.Client, db: homing.Database, receiver: Receiver, url: str) -> None:
    """Background runs until the node's handler has proved short."""
    for i in range(200):
        msg_id = _post(client, url, {"k": f"warm-{i}"})
        assert _eventually(lambda msg_id=msg_id: _state(db, msg_id)[0] == "done")
        if receiver.inbox.at_receipt_for("/n"):
            return
    raise AssertionError("a handler of a few hundred microseconds never counted as short")


def test_a_short_handler_runs_in_the_commit_that_stores_its_message(served: Any) -> None:
    db, receiver, _node, url = served
    with httpx.Client(timeout=30) as client:
        _warm_up(client, db, receiver, url)
        before = receiver.stats["handled_at_receipt"]
        ids = [_post(client, url, {"k": f"now-{i}"}) for i in range(20)]
        # done when the 204 came: the handler ran in the commit that stored the message
        assert [_state(db, i) for i in ids] == [("done", 1)] * 20
        assert receiver.stats["handled_at_receipt"] - before == 20
        again = _post(client, url, {"k": "now-0"}, msg_id=ids[0])  # a duplicate delivery
        assert again == ids[0]
    time.sleep(0.2)  # a second run would show up now
    assert Counter(_effects(db, "now-")) == Counter(f"now-{i}" for i in range(20))


def test_a_handler_failing_at_receipt_is_retried_in_the_background_once(served: Any) -> None:
    db, receiver, node, url = served
    with httpx.Client(timeout=30) as client:
        _warm_up(client, db, receiver, url)
        node.fail_once = {f"f-{i}" for i in range(0, 20, 4)}
        ids = [_post(client, url, {"k": f"f-{i}"}) for i in range(20)]
        assert _eventually(lambda: all(_state(db, i)[0] == "done" for i in ids))
    assert not node.fail_once  # every planned failure happened
    assert [_state(db, i)[1] for i in ids] == [2 if i % 4 == 0 else 1 for i in range(20)]
    time.sleep(0.2)
    assert Counter(_effects(db, "f-")) == Counter(f"f-{i}" for i in range(20))


def test_a_retry_gets_the_body_as_sent_whatever_the_first_attempt_did_to_its_value(
    served: Any,
) -> None:
    """The first attempt at receipt is handed the body the receiver parsed to check it
    (not parsed twice); a handler that changes that value and fails must not hand the
    change to its retry, which parses the stored body again."""
    db, receiver, node, url = served
    with httpx.Client(timeout=30) as client:
        _warm_up(client, db, receiver, url)
        node.spoil_once = {f"sp-{i}" for i in range(5)}
        ids = [_post(client, url, {"k": f"sp-{i}"}) for i in range(5)]
        assert _eventually(lambda: all(_state(db, i)[0] == "done" for i in ids))
    assert not node.spoil_once
    assert [_state(db, i)[1] for i in ids] == [2] * 5
    assert Counter(_effects(db, "sp-")) == Counter(f"sp-{i}" for i in range(5))
    assert _effects(db, "spoilt") == []


def test_a_handler_that_turns_slow_goes_back_to_the_background(served: Any) -> None:
    db, receiver, node, url = served
    with httpx.Client(timeout=30) as client:
        _warm_up(client, db, receiver, url)
        node.sleep = 3 * BUDGET
        first = receiver.stats["handled_at_receipt"]
        ids = [_post(client, url, {"k": f"s-{i}"}) for i in range(5)]
        assert _eventually(lambda: all(_state(db, i)[0] == "done" for i in ids))
        # one slow run at receipt raises the average past the budget at once
        assert receiver.stats["handled_at_receipt"] - first <= 1
        assert not receiver.inbox.at_receipt_for("/n")
    assert Counter(_effects(db, "s-")) == Counter(f"s-{i}" for i in range(5))


def test_a_budget_of_zero_handles_every_message_in_the_background(served: Any) -> None:
    db, receiver, _node, url = served
    receiver.inbox.at_receipt_below = 0.0
    with httpx.Client(timeout=30) as client:
        ids = [_post(client, url, {"k": f"z-{i}"}) for i in range(10)]
        assert _eventually(lambda: all(_state(db, i)[0] == "done" for i in ids))
    assert receiver.stats["handled_at_receipt"] == 0
    assert Counter(_effects(db, "z-")) == Counter(f"z-{i}" for i in range(10))


def test_a_negative_budget_is_refused(served: Any) -> None:
    db = served[0]
    with pytest.raises(homing.InvalidArgument, match="handle_at_receipt_below"):
        Receiver(db, handle_at_receipt_below=-1)


def test_one_id_many_times_in_one_batch_is_stored_and_handled_once(served: Any) -> None:
    """Concurrent deliveries of one message share a group commit: the first stores it
    (and handles it at receipt), the others read it back as duplicates; a reused id with
    another body is refused with 422."""
    db, receiver, _node, url = served
    with httpx.Client(timeout=30) as client:
        _warm_up(client, db, receiver, url)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    other = str(uuid.uuid4())

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(msg_id: str, k: str) -> int:
                r = await client.post(
                    url,
                    content=json.dumps({"k": k}).encode(),
                    headers={
                        "content-type": "application/json",
                        "homing-message-id": msg_id,
                        "homing-mode": "send",
                    },
                )
                return r.status_code

            calls = [one(i, f"b-{n}") for n, i in enumerate(ids) for _ in range(10)]
            first = await asyncio.gather(*calls, one(other, "b-other"))
            again = await one(other, "b-other-changed")  # the id names another body now
            return [*first, again]

    statuses = asyncio.run(burst())
    assert statuses[:-1] == [204] * 31 and statuses[-1] == 422
    assert [_state(db, i) for i in [*ids, other]] == [("done", 1)] * 4
    time.sleep(0.2)
    assert Counter(_effects(db, "b-")) == Counter(["b-0", "b-1", "b-2", "b-other"])
