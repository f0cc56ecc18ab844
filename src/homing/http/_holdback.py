"""Whether a claimed row goes out now: its endpoint may be disabled (the row fails, kept
for a redrive) or over its rate limit (the row waits for a token, or gives its claim back
when the token is far off). The per-endpoint state itself is ``_endpoints.Endpoints``."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from homing.http._client import BeforeSend
from homing.http._endpoints import endpoint_key
from homing.store import http_endpoint_queries as eq
from homing.store import http_queries as q

if TYPE_CHECKING:
    from homing.http.dispatcher import Dispatcher

#: A rate-limited request whose token is further off than this gives its claim back and is
#: postponed until the token is there, rather than holding the claim and a slot.
RATE_HOLD_S = 2.0


class OverRate(Exception):
    """The endpoint's next rate-limit token is more than ``RATE_HOLD_S`` away."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"rate limited for {wait:.3f} s")
        self.wait = wait


async def held_back(d: Dispatcher, row: q.OutboxRow, token: str) -> bool:
    """True if the row is not sent now: its endpoint is disabled (the row fails, kept for
    a redrive) or over its rate limit for a while (the row is postponed)."""
    reason = d.endpoints.disabled_reason(row.url)
    if reason is not None:  # the cache may be stale: an operator may have enabled it
        reason = await d._db(_still_disabled, d, row.url)
    if reason is not None:
        error = f"the endpoint is disabled ({reason}); `homing http enable` it, then redrive"
        await d._db(d._fail_row, row, token, error, None, False)
        return True
    wait = d.endpoints.peek(row.url)  # the token itself is taken by rate_gate
    if wait > RATE_HOLD_S:
        await postpone(d, row, token, wait)
        return True
    return False


async def postpone(d: Dispatcher, row: q.OutboxRow, token: str, wait: float) -> None:
    """Give the claim back until the endpoint's rate allows a request (no attempt)."""
    at = d.db.clock.now() + wait
    assert d._group is not None
    await d._group.run(functools.partial(q.postpone, msg_id=row.id, token=token, at=at))


def rate_gate(d: Dispatcher, url: str) -> BeforeSend | None:
    """For a rate-limited endpoint, what the client awaits once it holds a connection and
    before it writes the request: a token from the endpoint's bucket (``OverRate`` when it
    is far off). Taken there and not before connecting, so a new connection's set-up does
    not bring two requests to the receiver back to back (an ad hoc probe under load: a
    first request reached the server 7-21 ms after its token, the next ones 1-5 ms after;
    tests/test_http_webhook_sender.py::test_per_endpoint_concurrency_and_rate_limit checks
    the spacing the receiver sees)."""
    if not d.endpoints.rated(url):
        return None

    async def gate() -> None:
        wait = d.endpoints.wait(url)
        while wait > 0:
            if wait > RATE_HOLD_S:
                raise OverRate(wait)
            await asyncio.sleep(wait)
            wait = d.endpoints.wait(url)

    return gate


def _still_disabled(d: Dispatcher, url: str) -> str | None:
    key = endpoint_key(url)
    with d.db.store.transaction(write=False) as tx:
        reason = eq.endpoint_disabled(tx, key)
    if reason is None:
        d.endpoints.disabled.pop(key, None)
    return reason
