"""Issue 19 item 3: what people expect of a webhook sender. A retry schedule they recognise
(with jitter), per-endpoint concurrency and rate limits, and the disable-after-N-days
rule with a clear record, enable and redrive. Real servers, both backends.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import homing
from homing.cli import cli
from homing.errors import InvalidArgument
from homing.http import WEBHOOK_SCHEDULE, EndpointLimit, RetryPolicy, Sender, admin
from homing.http.testing import serve_in_thread

FAST = RetryPolicy(initial=0.01, maximum=0.05)
DAY = 86400.0


def eventually(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


class Hooks:
    """A webhook receiver that counts arrivals, concurrency, and can be broken."""

    def __init__(self) -> None:
        self.arrivals: dict[str, list[float]] = {}
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.broken = False

    async def endpoint(self, request: Request) -> Response:
        arrived = time.monotonic()  # first thing: the server's own delays are not counted
        path = request.url.path
        await request.body()
        self.in_flight[path] = self.in_flight.get(path, 0) + 1
        self.max_in_flight[path] = max(self.max_in_flight.get(path, 0), self.in_flight[path])
        try:
            self.arrivals.setdefault(path, []).append(arrived)
            await asyncio.sleep(0.05)
            return Response(status_code=503 if self.broken else 204)
        finally:
            self.in_flight[path] -= 1


@pytest.fixture
def hooks() -> Iterator[tuple[Hooks, str]]:
    h = Hooks()
    app = Starlette(routes=[Route("/{p:path}", h.endpoint, methods=["POST"])])
    with serve_in_thread(app) as base:
        yield h, base


def test_the_webhook_retry_schedule_with_jitter() -> None:
    policy = RetryPolicy.webhook(rng=random.Random(7))
    for attempt in range(12):
        base = WEBHOOK_SCHEDULE[min(attempt, len(WEBHOOK_SCHEDULE) - 1)]
        wait = policy.delay(attempt)
        assert base * 0.8 <= wait <= base * 1.2, (attempt, wait)
    waits = {round(policy.delay(1), 3) for _ in range(20)}
    assert len(waits) > 10  # jittered: senders that failed together spread out
    assert policy.delay(0, retry_after=60) >= 60  # Retry-After is a lower bound
    with pytest.raises(InvalidArgument):
        RetryPolicy(schedule=(5.0, 0.0))
    with pytest.raises(InvalidArgument):
        EndpointLimit(rate=0)


def test_per_endpoint_concurrency_and_rate_limit(db: homing.Database, hooks: Any) -> None:
    h, base = hooks
    limits = {
        base + "/one-at-a-time": EndpointLimit(concurrency=1),
        base + "/rated": EndpointLimit(rate=20.0, burst=1),
    }
    with Sender(db, retry=FAST, limits=limits) as sender:
        pending = [sender.enqueue("send", base + "/one-at-a-time", {"n": i}) for i in range(6)]
        pending += [sender.enqueue("send", base + "/rated", {"n": i}) for i in range(10)]
        pending += [sender.enqueue("send", base + "/free", {"n": i}) for i in range(6)]
        for p in pending:
            assert p.wait(timeout=60) is None
    assert h.max_in_flight["/one-at-a-time"] == 1
    rated = h.arrivals["/rated"]
    assert len(rated) == 10 and max(rated) - min(rated) >= 9 / 20 * 0.9
    assert len(h.arrivals["/free"]) == 6


def test_an_endpoint_failing_for_days_is_disabled_then_enabled_and_redriven(
    db: homing.Database, clock: homing.ManualClock, hooks: Any
) -> None:
    h, base = hooks
    url = base + "/flaky"
    h.broken = True
    with Sender(db, retry=FAST, disable_after=3 * DAY, absurd_after=30 * DAY) as sender:
        first = sender.enqueue("send", url, {"n": 1})
        assert eventually(lambda: admin.endpoints(db))  # failing since now, not disabled
        assert admin.endpoints(db)[0].disabled_at is None

        def disabled() -> Any:
            clock.advance(DAY / 4)  # days pass; the message keeps failing
            return admin.failed_deliveries(db)

        failed = eventually(disabled)
        assert [f.id for f in failed] == [first.id] and "disabled" in (failed[0].last_error or "")
        (ep,) = admin.endpoints(db)
        assert ep.disabled_at is not None and "3 days" in (ep.reason or "")
        out = CliRunner().invoke(cli, ["--db", str(db.url), "http", "endpoints"])
        assert out.exit_code == 0 and "DISABLED" in out.output, out.output
        # while disabled, a new message fails at once without a request
        before = len(h.arrivals["/flaky"])
        second = sender.enqueue("send", url, {"n": 2})
        assert eventually(lambda: len(admin.failed_deliveries(db)) == 2)
        assert len(h.arrivals["/flaky"]) == before
        # the endpoint is fixed: enable it, redrive its failed deliveries
        h.broken = False
        out = CliRunner().invoke(cli, ["--db", str(db.url), "http", "enable", ep.endpoint])
        assert out.exit_code == 0, out.output
        assert admin.redrive_failed(db) == 2
        assert first.wait(timeout=30) is None and second.wait(timeout=30) is None
        assert admin.endpoints(db) == [] and admin.failed_deliveries(db) == []


def test_per_endpoint_state_in_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from homing.http import _endpoints

    monkeypatch.setattr(_endpoints, "MAX_TRACKED", 8)
    eps = _endpoints.Endpoints({"*": EndpointLimit(rate=1000.0, concurrency=2)}, 8, None)

    async def main() -> None:
        busy = eps.slot("http://busy.example/x")
        async with busy:  # in use: never forgotten
            for i in range(100):
                async with eps.slot(f"http://h{i}.example/x"):
                    pass
                assert eps.wait(f"http://h{i}.example/x") == 0.0
            assert eps.slot("http://busy.example/x") is busy
        assert len(eps._slots) <= 8

    asyncio.run(main())
