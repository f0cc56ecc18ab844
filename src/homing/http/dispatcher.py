"""The dispatcher: drains the outbox over HTTP until every message is acknowledged.

It runs in a thread of its own (an asyncio loop with keep-alive HTTP/1.1 clients, ``_client``),
inside the caller's process or in ``homing serve``. Several dispatchers may share a store:
each claims rows with a lease and a token, and only the holder of the token may record the
outcome (fencing). A dispatcher killed mid-request loses nothing: the row's lease expires
and it is sent again; the receiver's inbox drops the repeat.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from homing._failpoints import failpoint
from homing._loops import loop_factory
from homing.database import Database
from homing.errors import InvalidArgument
from homing.http import _claims, _followups, _holdback, batch_wire, standard, wire
from homing.http._batch_out import Batcher
from homing.http._client import Client, HttpError, Response
from homing.http._endpoints import (
    Endpoints,
    Slot,
    for_endpoint,
    origin,
    retry_after_seconds,
    target,
)
from homing.http._group import GroupCommit
from homing.http._netguard import RefusedAddress, pinning
from homing.http._waiters import notify_changed
from homing.http.policy import DEFAULT_FATAL_STATUSES, EndpointLimit, RetryPolicy, is_fatal
from homing.store import http_endpoint_queries as eq
from homing.store import http_queries as q
from homing.store.protocol import Tx

log = logging.getLogger("homing.http")
T = TypeVar("T")

DEADLINE_PREFIX = "the absurd deadline passed"


class Clients(NamedTuple):
    trusted: Client  # destinations the application chose itself
    guarded: Client  # URLs a peer gave us: addresses checked and pinned


class Dispatcher:
    """Delivers outbox rows with retries, backoff and jitter; tombstones what was acked.

    ``per_destination`` bounds concurrent requests to one origin (scheme://host:port);
    ``max_in_flight`` bounds them overall. ``fatal_statuses`` end a message with an error
    (501 and the 4xx no retry can fix by default). ``allowed_hosts`` lists hosts that a
    confirmation URL may point at although they are private (tests run on 127.0.0.1).
    ``signing`` maps an endpoint (a full URL, an origin, or ``"*"``; the most specific
    wins) to ``(key id, secret)`` for HMAC signatures (``Homing-Signature``; the
    confirmation ``DELETE`` is signed too). ``webhook_signing`` maps endpoints the same way
    to Standard Webhooks secrets (``whsec_...``; several while rotating keys).
    ``limits`` maps endpoints the same way to an ``EndpointLimit`` (rate, concurrency).
    ``disable_after``: seconds an endpoint may fail without one success before it is
    disabled (its messages then fail at once, kept for a redrive; ``homing http enable``).
    ``job_check``: seconds after a job's 202 before asking the receiver how it went (then
    less and less often); a result the receiver could not deliver is fetched that way.
    URLs a peer gave us (job results' response URLs, confirmation URLs on another origin)
    are called through a client that checks and pins the address at connect time;
    ``resolver`` (host, port) -> addresses replaces the system's for that check.
    ``batch``: up to this many Option 2 messages in one request to a homing receiver that
    takes batches (``batch_wire``; 0 or 1: one request a message, the default).
    """

    def __init__(
        self,
        db: Database,
        *,
        retry: RetryPolicy | None = None,
        fatal_statuses: Iterable[int] = DEFAULT_FATAL_STATUSES,
        request_timeout: float = 30.0,
        per_destination: int = 8,
        max_in_flight: int = 64,
        allowed_hosts: Iterable[str] = (),
        signing: Mapping[str, tuple[str, bytes]] | None = None,
        idle_poll: float = 0.25,
        resolver: wire.Resolver | None = None,
        webhook_signing: Mapping[str, Sequence[str | bytes]] | None = None,
        limits: Mapping[str, EndpointLimit] | None = None,
        disable_after: float | None = None,
        job_check: float = 30.0,
        batch: int = 0,
    ) -> None:
        if per_destination < 1 or max_in_flight < 1:
            raise InvalidArgument("per_destination and max_in_flight must be at least 1")
        if request_timeout <= 0:
            raise InvalidArgument(f"request_timeout must be > 0 seconds, got {request_timeout}")
        self.db = db
        self.retry = retry or RetryPolicy()
        self.fatal_statuses = frozenset(fatal_statuses)
        self.request_timeout = request_timeout
        self.per_destination = per_destination
        self.max_in_flight = max_in_flight
        self.allowed_hosts = tuple(allowed_hosts)
        self.signing = dict(signing or {})
        self.idle_poll = idle_poll
        self.resolver = resolver
        if disable_after is not None and disable_after <= 0:
            raise InvalidArgument(f"disable_after must be > 0 seconds, got {disable_after}")
        self.endpoints = Endpoints(limits or {}, per_destination, disable_after)
        if job_check <= 0:
            raise InvalidArgument(f"job_check must be > 0 seconds, got {job_check}")
        self.job_check = job_check
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise InvalidArgument(f"batch must be a number of messages >= 0, got {batch!r}")
        if batch > batch_wire.MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"batch may be at most {batch_wire.MAX_BATCH_MESSAGES}")
        self.batcher = Batcher(self, batch) if batch > 1 else None
        self.webhook_signing = {k: list(v) for k, v in (webhook_signing or {}).items()}
        for secrets in self.webhook_signing.values():
            for secret in secrets:
                standard.secret_key(secret)  # a malformed secret fails here, not per request
        self.claim_lease = request_timeout + 10.0
        # rows enqueued in this process, claimed in their own transaction (_claims)
        self.handoff = _claims.Handoff(bound=2 * max_in_flight, lease=self.claim_lease)
        self._claim_now = True  # look in the store at the next turn, not only on the timer
        self.stats = {"attempts": 0, "delivered": 0, "retries": 0, "failed": 0, "deletes": 0}
        self.stats["batches"] = 0  # requests that carried a batch (batch_wire)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="homing-out")
        self._started = threading.Event()
        self._group: GroupCommit | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Dispatcher:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._main, name="homing-http-dispatcher", daemon=True
            )
            self._thread.start()
            self._started.wait(10)
            if self.db.store.capabilities.notifications:  # enqueues by other processes
                threading.Thread(
                    target=self._listen, name="homing-http-listen", daemon=True
                ).start()
        return self

    def _listen(self) -> None:
        try:
            wakeup = self.db.store.wakeup("homing_http")
        except Exception:  # the store is closing or down: the idle poll still works
            return
        while not self._stopping:
            try:
                if wakeup.wait(1.0):
                    self.wake()
            except Exception:  # the store is closing or down: the idle poll still works
                time.sleep(1.0)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Look for work in the store now (an enqueue committed, here or elsewhere)."""
        self._claim_now = True
        self._set_wake()

    def hand_off(self, *rows: q.OutboxRow) -> None:
        """Send these rows, claimed by this dispatcher in the transaction that stored them
        (called once that transaction committed); one wake-up for all of them."""
        for row in rows:
            self.handoff.put(row)
        self._set_wake()

    def _set_wake(self) -> None:
        loop, ev = self._loop, self._wake
        if loop is not None and ev is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:
                pass  # the loop closed meanwhile

    def _main(self) -> None:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(self._run())

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    # -- the loop ------------------------------------------------------------------------
    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._group = GroupCommit(self.db.store, self._db)
        token = _claims.new_token()
        self.handoff.open(token)  # before start() returns: its first enqueues hand off
        self._started.set()
        try:
            try:
                await self._db(_claims.release_dead_claims, self.db)
            except Exception as exc:
                log.warning("could not release the claims of dead dispatchers: %s", exc)
            guarded = Client(
                max_connections=self.max_in_flight,
                timeout=self.request_timeout,
                connect_to=pinning(self.allowed_hosts, self.resolver),
            )
            trusted = Client(max_connections=self.max_in_flight, timeout=self.request_timeout)
            async with trusted, guarded:
                await self._serve(Clients(trusted, guarded), token)
        finally:
            self.handoff.close()
        try:  # a graceful stop hands its claimed rows to the next dispatcher at once
            await self._db(_claims.release_claims, self.db, token)
        except Exception as exc:  # the store is closing: the claims expire with their lease
            log.info("could not release this dispatcher's claims: %s", exc)

    async def _serve(self, client: Clients, token: str) -> None:
        """Rows handed off at enqueue first; the store is asked when woken (an enqueue
        without a hand-off, another process's NOTIFY) and on a timer that backs off from
        5 ms to ``idle_poll`` while it finds nothing (retries coming due, other
        processes' rows)."""
        assert self._wake is not None
        wake = self._wake
        batcher = self.batcher
        in_flight: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            wake.set()  # a free place: hand-offs (or due rows) waiting for one go now

        if batcher is not None:
            batcher.serve(client, token, done)

        delay = 0.005
        next_claim = 0.0
        refreshed = 0.0
        while not self._stopping:
            if self.endpoints.disable_after and time.monotonic() - refreshed > 2.0:
                refreshed = time.monotonic()
                try:
                    self.endpoints.disabled = await self._db(self._read_disabled)
                except Exception as exc:
                    log.warning("reading disabled endpoints failed: %s", exc)
            free = self.max_in_flight - len(in_flight) - (batcher.rows if batcher else 0)
            rows = self.handoff.take(free) if free > 0 else []
            if free > len(rows) and (self._claim_now or time.monotonic() >= next_claim):
                self._claim_now = False
                claimed: list[q.OutboxRow] = []
                try:
                    claimed = await self._db(
                        _claims.claim_due, self.db, token, self.claim_lease, free - len(rows)
                    )
                except Exception as exc:  # the store is down: keep trying
                    log.warning("outbox claim failed: %s", exc)
                delay = 0.005 if claimed else min(self.idle_poll, delay * 2)
                next_claim = 0.0 if claimed else time.monotonic() + delay
                rows += claimed
            for row in rows:
                if batcher is not None and batcher.offer(row):
                    continue
                sem = self.endpoints.slot(
                    (row.confirm_url or row.url) if row.state != "pending" else row.url
                )
                task = asyncio.create_task(self._one(client, sem, row, token))
                in_flight.add(task)
                task.add_done_callback(done)
            if rows:
                await asyncio.sleep(0)
                continue
            # full: wait for a request to end (its task wakes us); else until the next claim
            full = len(in_flight) >= self.max_in_flight
            timeout = self.idle_poll if full else max(0.001, next_claim - time.monotonic())
            try:
                await asyncio.wait_for(wake.wait(), timeout=timeout)
            except TimeoutError:
                pass
            wake.clear()
        pending = [*in_flight, *(batcher.tasks if batcher else ())]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _one(self, client: Clients, sem: Slot, row: q.OutboxRow, token: str) -> None:
        async with sem:
            # its receiver may have said meanwhile that it takes batches
            if self.batcher is not None and self.batcher.offer(row):
                return
            try:
                if row.state == "pending":
                    if await _holdback.held_back(self, row, token):
                        return
                    await self._deliver(client, row, token)
                elif row.confirm_url:
                    await _followups.confirm(self, client, row, row.confirm_url, token)
                elif row.state == "accepted" and row.status_url:
                    await _followups.check_job(self, client, row, token)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let one row kill the loop
                log.exception("delivering %s failed unexpectedly", row.id)
                await self._retry(row, token, f"internal error: {exc}", None)

    def _read_disabled(self) -> dict[str, str]:
        with self.db.store.transaction(write=False) as tx:
            return eq.disabled_endpoints(tx)

    # -- one delivery ------------------------------------------------------------------
    def _headers(self, row: q.OutboxRow) -> dict[str, str]:
        mode = {"put": "put", "send": "send", "job": "job", "reply": "send"}[row.kind]
        headers: dict[str, str] = json.loads(row.headers) if row.headers else {}
        headers["content-type"] = row.content_type
        headers[wire.MESSAGE_ID] = row.id
        headers[wire.MODE] = mode
        if row.response_url:
            headers[wire.RESPONSE_URL] = row.response_url
        if row.in_reply_to:
            headers[wire.IN_REPLY_TO] = row.in_reply_to
            headers[wire.REPLY_STATUS] = str(row.reply_status or 200)
        self._sign(headers, row.method, row.url, row.body)
        webhook = for_endpoint(self.webhook_signing, row.url)
        if webhook:
            headers.update(standard.sign_headers(webhook, row.id, row.body, self.db.clock.now()))
        return headers

    def _sign(self, headers: dict[str, str], method: str, url: str, body: bytes) -> None:
        key = for_endpoint(self.signing, url)
        if key is not None:
            headers[wire.SIGNATURE] = wire.sign(
                key[0], key[1], method, target(url), headers, body, self.db.clock.now()
            )

    async def _deliver(self, clients: Clients, row: q.OutboxRow, token: str) -> None:
        if self.db.clock.now() > row.deadline:
            await self._db(
                self._fail_row,
                row,
                token,
                f"{DEADLINE_PREFIX} after {row.attempts} attempts (last error: {row.last_error})",
                None,
            )
            return
        failpoint("http.sender.before_request")
        self.stats["attempts"] += 1
        # a job's result goes to a URL the peer gave us: connect only to a checked address
        client = clients.guarded if row.kind == "reply" else clients.trusted
        try:
            resp = await client.request(
                row.method,
                row.url,
                content=row.body,
                headers=self._headers(row),
                before_send=_holdback.rate_gate(self, row.url),
            )
        except _holdback.OverRate as over:  # nothing was sent
            await _holdback.postpone(self, row, token, over.wait)
            return
        except HttpError as exc:  # connection refused/reset, timeout, protocol error
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, RefusedAddress):  # no retry makes it safe
                await self._db(self._fail_row, row, token, error, None)
            else:
                await self._retry(row, token, error, None)
            return
        await self._answered(clients, row, token, resp)

    async def _answered(
        self, clients: Clients, row: q.OutboxRow, token: str, resp: Response
    ) -> None:
        """The receiver's answer to a delivery: tombstone (2xx), fail (fatal) or retry."""
        status = resp.status_code
        if 200 <= status < 300:
            failpoint("http.sender.after_2xx_before_tombstone")
            if self.batcher is not None and row.kind == "send":
                self.batcher.learn(row.url, resp.headers.get(batch_wire.BATCH_HEADER))
            confirm = self._peer_url(row, resp.headers.get(wire.CONFIRM_URL))
            state = "accepted" if (row.kind == "job" and status == 202) else "delivered"
            status_url = None
            if state == "accepted":
                status_url = self._peer_url(row, resp.headers.get(wire.STATUS_URL))
            ctype = resp.headers.get("content-type", wire.BYTES_TYPE)
            assert self._group is not None
            stored = await self._group.run(
                functools.partial(
                    self._tombstone,
                    row,
                    token,
                    state,
                    status,
                    ctype,
                    resp.content,
                    confirm,
                    status_url,
                )
            )
            failpoint("http.sender.after_tombstone_before_delete")
            if stored:
                self.stats["delivered"] += 1
                notify_changed(row.id, sent=state == "delivered" and row.kind == "send")
                if confirm:
                    await _followups.confirm(self, clients, row, confirm, token)
            return
        if is_fatal(status, self.fatal_statuses):
            await self._db(
                self._fail_row,
                row,
                token,
                f"the receiver answered {status}: {resp.text[:500]}",
                (status, resp.headers.get("content-type"), resp.content),
            )
            return
        await self._retry(
            row,
            token,
            f"the receiver answered {status}",
            retry_after_seconds(resp.headers.get("retry-after")),
        )

    # -- outcomes (each one transaction) ---------------------------------------------------
    def _tombstone(
        self,
        row: q.OutboxRow,
        token: str,
        state: str,
        status: int,
        ctype: str,
        body: bytes,
        confirm: str | None,
        status_url: str | None,
        tx: Tx,
    ) -> bool:
        now = self.db.clock.now()
        keep = body if row.kind in ("put", "job") else None
        self.endpoints.ok(tx, row.url)
        return q.mark_delivered(
            tx,
            row.id,
            token,
            state=state,
            now=now,
            status=status,
            content_type=ctype if keep is not None else None,
            body=keep,
            confirm_url=confirm,
            status_url=status_url,
            check_at=now + self.job_check if status_url else None,
        )

    def _peer_url(self, row: q.OutboxRow, url: str | None) -> str | None:
        """A URL the receiver answered with: kept if on the destination's origin or safe."""
        if url and origin(url) != origin(row.url):
            try:
                wire.check_url(url, self.allowed_hosts, resolver=self.resolver)
            except InvalidArgument as exc:
                log.info("ignoring URL %s given for %s: %s", url[:200], row.id, exc)
                return None
        return url

    async def _retry(
        self, row: q.OutboxRow, token: str, error: str, retry_after: float | None
    ) -> None:
        """The row is due again later: written with the other outcomes of the moment in
        one transaction (group commit), not a commit of its own."""
        assert self._group is not None
        await self._group.run(functools.partial(self._mark_retry, row, token, error, retry_after))

    def _mark_retry(
        self, row: q.OutboxRow, token: str, error: str, retry_after: float | None, tx: Tx
    ) -> None:
        now = self.db.clock.now()
        at = now + self.retry.delay(row.attempts, retry_after)
        self.stats["retries"] += 1
        q.mark_retry(tx, row.id, token, at=min(at, max(row.deadline, now)), error=error)
        if self.endpoints.failed(tx, row.url, now=now, error=error):
            log.warning("endpoint %s disabled: %s", row.url, error)

    def _fail_row(
        self,
        row: q.OutboxRow,
        token: str,
        error: str,
        answer: tuple[int, str | None, bytes] | None,
        counts: bool = True,
    ) -> None:
        """End the row ``failed``; ``counts``: a failure of the endpoint (disable rule)."""
        status, ctype, body = answer if answer is not None else (None, None, None)
        now = self.db.clock.now()
        with self.db.store.transaction() as tx:
            done = q.mark_failed(
                tx,
                row.id,
                now=now,
                error=error,
                status=status,
                content_type=ctype,
                body=body,
                token=token,
            )
            if counts and done and self.endpoints.failed(tx, row.url, now=now, error=error):
                log.warning("endpoint %s disabled: %s", row.url, error)
        if done:
            self.stats["failed"] += 1
            notify_changed(row.id)
