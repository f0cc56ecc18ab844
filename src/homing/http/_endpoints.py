"""Per-endpoint behaviour of the dispatcher: concurrency, rate limit and the
disable-after-N-days rule (a webhook sender's endpoint that has failed for days is
disabled with a clear record, instead of being retried until every message's deadline).

An endpoint's limits are looked up by its full URL, then its origin, then ``"*"``; without
one, ``per_destination`` concurrent requests per origin and no rate limit. The disable rule
keys on ``origin + path`` (no query).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from typing import TypeVar
from urllib.parse import urlsplit

from homing.http.policy import EndpointLimit
from homing.store import http_endpoint_queries as eq
from homing.store.protocol import Tx

T = TypeVar("T")


@functools.lru_cache(maxsize=4096)  # called for every row: a few destinations, many rows
def origin(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}".lower()


def for_endpoint(by_endpoint: Mapping[str, T], url: str) -> T | None:
    """The setting for ``url``: by the URL itself, else its origin, else ``"*"``."""
    if not by_endpoint:
        return None
    for key in (url, origin(url), "*"):
        if key in by_endpoint:
            return by_endpoint[key]
    return None


def target(url: str) -> str:
    """The request target that a signature binds: path and query."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (an HTTP date is ignored)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def endpoint_key(url: str) -> str:
    """What the disable rule counts: scheme://host:port/path."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}".lower() + (p.path or "/")


class _Bucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> float:
        """0 and one token taken, or the seconds until a token is there (none taken)."""
        wait = self.peek()
        if wait == 0.0:
            self.tokens -= 1
        return wait

    def peek(self) -> float:
        """The seconds until a token is there (0: one is), taking none."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate


#: Endpoints tracked in memory before idle ones are forgotten (bounded with many origins).
MAX_TRACKED = 4096


class Slot:
    """A concurrency slot of one endpoint; counts its users so an idle one can be dropped."""

    def __init__(self, n: int) -> None:
        self.sem = asyncio.Semaphore(n)
        self.users = 0

    async def __aenter__(self) -> None:
        self.users += 1
        try:
            await self.sem.acquire()
        except BaseException:
            self.users -= 1
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.sem.release()
        self.users -= 1


class Endpoints:
    """Lives on the dispatcher's event loop (no locks: one thread)."""

    def __init__(
        self,
        limits: Mapping[str, EndpointLimit],
        per_destination: int,
        disable_after: float | None,
    ) -> None:
        self.limits = dict(limits)
        self.per_destination = per_destination
        self.disable_after = disable_after
        self.disabled: dict[str, str] = {}
        self._slots: dict[str, Slot] = {}
        self._buckets: dict[str, _Bucket] = {}

    def _limit(self, url: str) -> tuple[str, EndpointLimit | None]:
        for key in (url, origin(url), "*"):
            if key in self.limits:
                # "*" limits each origin on its own, not all of them together
                return (origin(url) if key == "*" else key), self.limits[key]
        return origin(url), None

    def limited(self, url: str) -> bool:
        """Whether ``url`` has a rate or concurrency limit of its own."""
        return self._limit(url)[1] is not None

    def slot(self, url: str) -> Slot:
        key, limit = self._limit(url)
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= MAX_TRACKED:
                self._slots = {k: v for k, v in self._slots.items() if v.users}
            n = limit.concurrency if limit and limit.concurrency else self.per_destination
            slot = self._slots[key] = Slot(n)
        return slot

    def rated(self, url: str) -> bool:
        """Whether requests to ``url`` have a rate limit."""
        limit = self._limit(url)[1]
        return limit is not None and limit.rate is not None

    def wait(self, url: str) -> float:
        """Seconds to wait before a request to ``url`` (0: go, a token was taken)."""
        bucket = self._bucket(url)
        return 0.0 if bucket is None else bucket.take()

    def peek(self, url: str) -> float:
        """Seconds until a request to ``url`` could go; no token taken."""
        bucket = self._bucket(url)
        return 0.0 if bucket is None else bucket.peek()

    def _bucket(self, url: str) -> _Bucket | None:
        key, limit = self._limit(url)
        if limit is None or limit.rate is None:
            return None
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED:  # forget buckets idle for a minute
                now = time.monotonic()
                self._buckets = {k: b for k, b in self._buckets.items() if now - b.at < 60}
            bucket = self._buckets[key] = _Bucket(limit.rate, limit.burst)
        return bucket

    def disabled_reason(self, url: str) -> str | None:
        return self.disabled.get(endpoint_key(url)) if self.disable_after else None

    # -- the disable rule, in the outcome's transaction ----------------------------------
    def failed(self, tx: Tx, url: str, *, now: float, error: str) -> bool:
        if self.disable_after is None:
            return False
        key = endpoint_key(url)
        disabled = eq.endpoint_failed(
            tx, key, now=now, error=error, disable_after=self.disable_after
        )
        if disabled:
            self.disabled[key] = f"disabled after failing for {self.disable_after / 86400:g} days"
        return disabled

    def ok(self, tx: Tx, url: str) -> None:
        if self.disable_after is not None:
            eq.endpoint_ok(tx, endpoint_key(url))
