"""The receiving side of seed 000: an ASGI app (Starlette) with reliable nodes at URL paths.

On a request the message is stored in the durable inbox unless its id is already there
(same id, different body: 422). Option 2 (``send``) is acked with 204 at once and handled
by a worker thread; ``job`` is acked with 202 and its result goes back to the sender's
response URL as a reliable message. Option 1 (``put``) runs the handler while the request
waits and stores its return value as the response, replayed to every retry of the id.

The handler is ``handler(body, tx)``: ``tx`` is the open ``homing.Transaction`` in which the
inbox entry is marked done, so its writes (``tx.connection``) happen exactly once.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from homing import ids
from homing._failpoints import failpoint
from homing.database import Database, Transaction
from homing.errors import InvalidArgument, PermanentFailure
from homing.http import wire
from homing.http._group import GroupCommit, write_lock
from homing.http.dispatcher import Dispatcher, notify_changed
from homing.http.errors import UnsafeURL
from homing.http.policy import DEFAULT_ABSURD_AFTER_S, RetryPolicy
from homing.store import http_queries as q
from homing.store.protocol import Tx

log = logging.getLogger("homing.http")

Handler = Callable[[Any, Transaction], Any]
DEFAULT_RETENTION_S = 7 * 24 * 3600.0
DEFAULT_MAX_BODY = 1024 * 1024
INTERNAL = "/_homing"
_BATCH = 32  # Option-2/job messages handled per transaction by one inbox worker


@dataclass(frozen=True)
class _Answer:
    status: int
    content_type: str | None
    body: bytes
    replayed: bool = False
    confirm: bool = False


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Receiver:
    """Reliable nodes at URL paths, as a Starlette app (``receiver.app``).

    ``allowed_hosts``: hosts a response URL may name although they are private (by default
    only public addresses are called). ``secrets``: key id -> shared secret; when given,
    every request must carry a valid ``Homing-Signature`` within ``signature_window``
    seconds. ``retention``: how long message ids are remembered (published as
    ``Homing-Inbox-Retention``); keep it above every sender's ``absurd_after``.
    ``dispatch``: run a dispatcher for the job results this receiver sends back.
    """

    def __init__(
        self,
        db: Database,
        *,
        allowed_hosts: Iterable[str] = (),
        max_body: int = DEFAULT_MAX_BODY,
        secrets: Mapping[str, bytes] | None = None,
        signature_window: float = 300.0,
        retention: float = DEFAULT_RETENTION_S,
        workers: int = 2,
        handler_retry: RetryPolicy | None = None,
        max_handler_attempts: int = 10,
        absurd_after: float = DEFAULT_ABSURD_AFTER_S,
        dispatch: bool = True,
        dispatcher_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(db, Database):
            raise InvalidArgument(
                f"Receiver needs a homing.Database (homing.connect(url)), got {type(db).__name__}"
            )
        if max_body < 1 or workers < 1 or max_handler_attempts < 1:
            raise InvalidArgument("max_body, workers and max_handler_attempts must be >= 1")
        self.db = db
        self.allowed_hosts = tuple(allowed_hosts)
        self.max_body = max_body
        self.secrets = dict(secrets) if secrets else None
        self.signature_window = signature_window
        self.retention = float(retention)
        self.workers = workers
        self.handler_retry = handler_retry or RetryPolicy(initial=0.5, maximum=300.0)
        self.max_handler_attempts = max_handler_attempts
        self.absurd_after = absurd_after
        self.reply_path = INTERNAL + "/reply"
        self._nodes: dict[str, Handler] = {}
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit] = (
            weakref.WeakKeyDictionary()
        )
        self._running: set[str] = set()
        self._running_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._start_lock = threading.Lock()
        self._dispatch = dispatch
        self._dispatcher_options = dict(dispatcher_options or {})
        self._dispatcher_options.setdefault("allowed_hosts", self.allowed_hosts)
        self.dispatcher: Dispatcher | None = None
        self.stats = {"received": 0, "duplicates": 0, "handled": 0, "refused": 0}
        self.app = Starlette(
            routes=[
                Route(INTERNAL + "/info", self._info, methods=["GET"]),
                Route(INTERNAL + "/inbox/{msg_id}", self._confirm, methods=["DELETE"]),
                Route("/{rest:path}", self._receive, methods=["POST", "PUT"]),
            ],
            lifespan=self._lifespan,
        )

    # -- registration --------------------------------------------------------------------
    def node(self, path: str) -> Callable[[Handler], Handler]:
        """Decorator: register ``handler(body, tx)`` for reliable messages to ``path``."""

        def register(fn: Handler) -> Handler:
            self.add_node(path, fn)
            return fn

        return register

    @property
    def nodes(self) -> list[str]:
        """The registered node paths."""
        return sorted(self._nodes)

    def add_node(self, path: str, handler: Handler) -> None:
        if not isinstance(path, str) or not path.startswith("/") or path.startswith(INTERNAL):
            raise InvalidArgument(
                f"node path must start with '/' and not with {INTERNAL}, got {path!r}"
            )
        if not callable(handler):
            raise InvalidArgument(f"handler for {path} must be callable, got {handler!r}")
        self._nodes[path] = handler

    # -- lifecycle -----------------------------------------------------------------------
    def _lifespan(self, app: Starlette) -> Any:
        receiver = self

        class _Span:
            async def __aenter__(self) -> None:
                await run_in_threadpool(receiver.start)

            async def __aexit__(self, *exc: object) -> None:
                await run_in_threadpool(receiver.stop)

        return _Span()

    def start(self) -> Receiver:
        """Start the worker that handles Option 2 and job messages (idempotent).
        Also started on the first request, so mounting the app in another one works."""
        with self._start_lock:
            if self._thread is not None:
                return self
            self._stop.clear()
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="homing-in")
            self._thread = threading.Thread(
                target=self._work_loop, name="homing-http-inbox", daemon=True
            )
            self._thread.start()
            if self._dispatch and self.dispatcher is None:
                self.dispatcher = Dispatcher(self.db, **self._dispatcher_options).start()
        return self

    def stop(self) -> None:
        with self._start_lock:
            self._stop.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(10)
                self._thread = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self.dispatcher is not None:
                self.dispatcher.stop()
                self.dispatcher = None

    def _group(self) -> GroupCommit:
        loop = asyncio.get_running_loop()
        group = self._groups.get(loop)
        if group is None:
            group = self._groups[loop] = GroupCommit(self.db.store, run_in_threadpool)
        return group

    # -- HTTP endpoints ------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {wire.RETENTION: str(int(self.retention))}

    async def _info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "inbox_retention_s": self.retention,
                "max_body": self.max_body,
                "nodes": sorted(self._nodes),
                "signed": self.secrets is not None,
            },
            headers=self._headers(),
        )

    async def _confirm(self, request: Request) -> Response:
        msg_id = request.path_params["msg_id"]
        if not ids.is_uuid(msg_id):
            return _error(400, "the message id in the URL is not a UUID")
        found = await self._group().run(functools.partial(q.confirm_incoming, msg_id=msg_id))
        if not found:
            return _error(404, f"no answered message {msg_id} in this inbox")
        return Response(status_code=204, headers=self._headers())

    def _route_path(self, request: Request) -> str:
        path = str(request.scope.get("path", ""))
        root = str(request.scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root) :]
        return path or "/"

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise _Refused(400, f"Content-Length {declared[:40]!r} is not a number")
            if int(declared) > self.max_body:
                raise _Refused(
                    413,
                    f"the body is {declared} bytes, over this receiver's limit of "
                    f"{self.max_body}; send less or ask for a bigger max_body",
                )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise _Refused(
                    413, f"the body is over this receiver's limit of {self.max_body} bytes"
                )
            chunks.append(chunk)
        data = b"".join(chunks)
        if declared is not None and int(declared) != len(data):
            raise _Refused(
                400, f"Content-Length says {declared} bytes but {len(data)} arrived; resend"
            )
        return data

    async def _receive(self, request: Request) -> Response:
        if self._thread is None:
            await run_in_threadpool(self.start)
        try:
            return await self._receive_checked(request)
        except _Refused as exc:
            self.stats["refused"] += 1
            return _error(exc.status, str(exc), **self._headers())
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening; nothing was stored
        except InvalidArgument as exc:
            self.stats["refused"] += 1
            return _error(400, str(exc), **self._headers())
        except Exception as exc:  # the store is unavailable, or a bug: the sender retries
            log.exception("receiving a message failed")
            return _error(
                503,
                f"the receiver could not store the message ({type(exc).__name__}); retry later",
                **{"retry-after": "1", **self._headers()},
            )

    async def _receive_checked(self, request: Request) -> Response:
        path = self._route_path(request)
        is_reply = path == self.reply_path
        if not is_reply and path not in self._nodes:
            raise _Refused(404, f"no reliable node at {path[:200]!r} on this receiver")
        msg_id = request.headers.get(wire.MESSAGE_ID)
        if msg_id is None:
            raise _Refused(400, "missing the Homing-Message-Id header (a UUID made by the sender)")
        if not ids.is_uuid(msg_id):
            raise _Refused(400, f"Homing-Message-Id {msg_id[:60]!r} is not a canonical UUID")
        mode = request.headers.get(wire.MODE, "put").lower()
        if mode not in wire.MODES:
            raise _Refused(400, f"Homing-Mode {mode[:20]!r} must be put, send or job")
        body = await self._read_body(request)
        if self.secrets is not None:
            problem = wire.verify(
                request.headers.get(wire.SIGNATURE),
                self.secrets,
                request.method,
                str(request.scope.get("path", "")),
                msg_id,
                body,
                now=time.time(),
                window=self.signature_window,
            )
            if problem is not None:
                raise _Refused(401, problem)
        ctype = request.headers.get("content-type", wire.BYTES_TYPE)
        if wire.is_json_type(ctype):
            wire.strict_json(body)  # refuse bad JSON before anything is stored
        response_url = request.headers.get(wire.RESPONSE_URL)
        if mode == "job":
            if not response_url:
                raise _Refused(400, "Homing-Mode job needs a Homing-Response-Url header")
            try:
                # may resolve DNS: keep it off the event loop
                await run_in_threadpool(wire.check_url, response_url, self.allowed_hosts)
            except UnsafeURL as exc:
                raise _Refused(422, str(exc)) from exc
        elif response_url:
            raise _Refused(400, "Homing-Response-Url is only for Homing-Mode job")
        digest = hashlib.sha256(path.encode() + b"\0" + ctype.encode() + b"\0" + body).hexdigest()
        if is_reply:
            return await self._receive_reply(request, msg_id, digest, ctype, body)
        if mode == "put":
            store = functools.partial(self._store, msg_id, path, mode, digest, ctype, body, None)
            return await self._receive_put(request, msg_id, digest, store)
        existing = await self._group().run(
            functools.partial(self._store, msg_id, path, mode, digest, ctype, body, response_url)
        )
        if existing is None:
            self.stats["received"] += 1
            failpoint("http.receiver.after_inbox_insert")
            if mode != "put":
                self._wake.set()
        else:
            self.stats["duplicates"] += 1
            if existing.body_hash != digest or existing.mode != mode:
                raise _Refused(
                    422,
                    f"message {msg_id} was already received with a different body, path "
                    "or mode; a message id names one message: make a new id for a new message",
                )
        if mode == "send":
            return Response(status_code=204, headers=self._headers())
        return Response(status_code=202, headers=self._headers())

    async def _receive_put(
        self,
        request: Request,
        msg_id: str,
        digest: str,
        store: Callable[[Tx], q.InboxRow | None],
    ) -> Response:
        """Option 1: store and handle in one transaction (a repeat replays the response)."""
        with self._running_lock:
            busy = msg_id in self._running
            if not busy:
                self._running.add(msg_id)
        if busy:
            return self._in_progress(msg_id)
        try:
            answer = await run_in_threadpool(self._handle, msg_id, False, store, digest)
        finally:
            with self._running_lock:
                self._running.discard(msg_id)
        if answer is None:
            return self._in_progress(msg_id)
        failpoint("http.receiver.after_commit_before_response")
        return self._answer(request, msg_id, answer)

    def _in_progress(self, msg_id: str) -> Response:
        return _error(
            409,
            f"message {msg_id} is being handled now; retry later for its response",
            **{"retry-after": "1", **self._headers()},
        )

    def _answer(self, request: Request, msg_id: str, answer: _Answer) -> Response:
        headers = self._headers()
        if answer.replayed:
            headers[wire.REPLAYED] = "true"
        if answer.confirm and 200 <= answer.status < 300:
            base = (
                f"{request.url.scheme}://{request.url.netloc}{request.scope.get('root_path', '')}"
            )
            headers[wire.CONFIRM_URL] = f"{base}{INTERNAL}/inbox/{msg_id}"
        return Response(
            answer.body,
            status_code=answer.status,
            media_type=answer.content_type,
            headers=headers,
        )

    @staticmethod
    def _stored(row: q.InboxRow, *, replayed: bool) -> _Answer:
        if row.confirmed and row.resp_body is None:
            return _Answer(
                410,
                wire.JSON_TYPE,
                json.dumps({"error": f"message {row.id} was answered and confirmed"}).encode(),
                replayed,
            )
        return _Answer(
            row.status or 200, row.resp_content_type, row.resp_body or b"", replayed, True
        )

    # -- storing and handling --------------------------------------------------------------
    def _store(
        self,
        msg_id: str,
        path: str,
        mode: str,
        digest: str,
        ctype: str,
        body: bytes,
        response_url: str | None,
        tx: Tx,
    ) -> q.InboxRow | None:
        now = self.db.clock.now()
        return q.insert_incoming(
            tx,
            msg_id=msg_id,
            path=path,
            mode=mode,
            body_hash=digest,
            content_type=ctype,
            body=body,
            response_url=response_url,
            now=now,
            work_at=None if mode == "put" else now,
        )

    def _handle(
        self,
        msg_id: str,
        background: bool,
        store: Callable[[Tx], q.InboxRow | None] | None = None,
        digest: str | None = None,
    ) -> _Answer | None:
        """Run the node's handler for one inbox entry in one transaction; None if busy.

        With ``store`` the entry is inserted in that same transaction first (Option 1: one
        commit stores the request, the handler's writes and the response); a repeat with
        another body is refused with 422 and changes nothing."""
        try:
            with write_lock(self.db.store), self.db.transaction() as t:
                if store is not None:
                    existing = store(t.tx)
                    if existing is not None and (
                        existing.body_hash != digest or existing.mode != "put"
                    ):
                        raise _Refused(
                            422,
                            f"message {msg_id} was already received with a different body, "
                            "path or mode; a message id names one message: make a new id "
                            "for a new message",
                        )
                    self.stats["duplicates" if existing else "received"] += 1
                ok, row = q.lock_incoming(t.tx, msg_id)
                if not ok:
                    return None
                if row is None:
                    return _Answer(404, wire.JSON_TYPE, b'{"error": "unknown message"}')
                if row.state != "received":
                    return self._stored(row, replayed=True)
                handler = self._nodes.get(row.path)
                if handler is None:
                    raise PermanentFailure(f"no node at {row.path} handles this message any more")
                value = wire.decode_body(row.content_type, row.body or b"")
                result = handler(value, t)
                ctype, data = wire.encode_body(result, None)
                failpoint("http.receiver.in_handler_before_commit")
                self._finish(t.tx, row, "done", 200, ctype, data, None)
            self.stats["handled"] += 1
            return _Answer(200, ctype, data, False, True)
        except _Refused:
            raise
        except PermanentFailure as exc:
            self._keep(store)
            return self._give_up(msg_id, f"the handler refused the message: {exc}")
        except Exception as exc:
            log.warning("handler for message %s failed: %s", msg_id, exc, exc_info=True)
            self._keep(store)
            return self._later(msg_id, background, f"{type(exc).__name__}: {exc}")

    def _keep(self, store: Callable[[Tx], q.InboxRow | None] | None) -> None:
        """The handler's transaction rolled back: store the request on its own so that the
        failure is recorded against it (the insert is idempotent)."""
        if store is not None:
            with write_lock(self.db.store), self.db.store.transaction() as tx:
                store(tx)

    def _finish(
        self,
        tx: Tx,
        row: q.InboxRow,
        state: str,
        status: int,
        ctype: str,
        data: bytes,
        error: str | None,
    ) -> None:
        now = self.db.clock.now()
        keep = row.mode == "put"
        q.finish_incoming(
            tx,
            row.id,
            state=state,
            now=now,
            status=status if keep else None,
            content_type=ctype if keep else None,
            body=data if keep else None,
            error=error,
        )
        if row.mode == "job" and row.response_url:
            q.insert_outgoing(
                tx,
                [
                    q.NewOutgoing(
                        id=ids.uuid7(),
                        kind="reply",
                        method="POST",
                        url=row.response_url,
                        content_type=ctype,
                        body=data,
                        response_url=None,
                        in_reply_to=row.id,
                        reply_status=status,
                        deadline=now + self.absurd_after,
                        created_at=now,
                    )
                ],
            )
            if self.dispatcher is not None:
                tx.call_after_commit(self.dispatcher.wake)

    def _give_up(self, msg_id: str, error: str) -> _Answer:
        data = json.dumps({"error": error}).encode()
        with write_lock(self.db.store), self.db.store.transaction() as tx:
            row = q.incoming(tx, msg_id)
            if row is None or row.state != "received":
                return _Answer(404, wire.JSON_TYPE, b'{"error": "unknown message"}')
            self._finish(tx, row, "failed", 501, wire.JSON_TYPE, data, error)
        return _Answer(501, wire.JSON_TYPE, data, False, True)

    def _later(self, msg_id: str, background: bool, error: str) -> _Answer:
        with write_lock(self.db.store), self.db.store.transaction() as tx:
            row = q.incoming(tx, msg_id)
            attempts = row.attempts + 1 if row is not None else 1
        if attempts >= self.max_handler_attempts:
            return self._give_up(msg_id, f"the handler failed {attempts} times; last: {error}")
        at = None
        if background:
            at = self.db.clock.now() + self.handler_retry.delay(attempts)
        with write_lock(self.db.store), self.db.store.transaction() as tx:
            q.retry_incoming(tx, msg_id, at=at, error=error)
        data = json.dumps({"error": f"the handler failed, retry later: {error}"}).encode()
        return _Answer(503, wire.JSON_TYPE, data)

    # -- job results arriving at this sender (the reply node) ----------------------------------
    async def _receive_reply(
        self, request: Request, msg_id: str, digest: str, ctype: str, body: bytes
    ) -> Response:
        job_id = request.headers.get(wire.IN_REPLY_TO, "")
        status = request.headers.get(wire.REPLY_STATUS, "200")
        if not ids.is_uuid(job_id):
            raise _Refused(400, "a job result needs Homing-In-Reply-To with the job's message id")
        if not status.isdigit() or not 100 <= int(status) <= 599:
            raise _Refused(400, f"Homing-Reply-Status {status[:10]!r} is not an HTTP status")
        outcome = await run_in_threadpool(
            self._store_reply, msg_id, job_id, int(status), digest, ctype, body
        )
        if outcome == "conflict":
            raise _Refused(422, f"message {msg_id} was already received with a different body")
        if outcome == "unknown":
            raise _Refused(404, f"no job {job_id} in this sender's outbox")
        if outcome == "new":
            failpoint("http.receiver.after_inbox_insert")
            notify_changed(job_id)
        return Response(status_code=204, headers=self._headers())

    def _store_reply(
        self, msg_id: str, job_id: str, status: int, digest: str, ctype: str, body: bytes
    ) -> str:
        now = self.db.clock.now()
        try:
            return self._store_reply_tx(msg_id, job_id, status, digest, ctype, body, now)
        except _UnknownJob:
            return "unknown"  # rolled back: nothing was stored

    def _store_reply_tx(
        self,
        msg_id: str,
        job_id: str,
        status: int,
        digest: str,
        ctype: str,
        body: bytes,
        now: float,
    ) -> str:
        with write_lock(self.db.store), self.db.store.transaction() as tx:
            existing = q.insert_incoming(
                tx,
                msg_id=msg_id,
                path=self.reply_path,
                mode="reply",
                body_hash=digest,
                content_type=ctype,
                body=b"",
                response_url=None,
                now=now,
                work_at=None,
            )
            if existing is not None:
                return "conflict" if existing.body_hash != digest else "duplicate"
            if (
                q.record_job_result(
                    tx, job_id, now=now, status=status, content_type=ctype, body=body
                )
                is None
            ):
                raise _UnknownJob
            q.finish_incoming(
                tx,
                msg_id,
                state="done",
                now=now,
                status=204,
                content_type=None,
                body=None,
                error=None,
            )
        return "new"

    # -- the background worker -------------------------------------------------------------
    def _work_loop(self) -> None:
        last_gc = time.monotonic()
        while not self._stop.is_set():
            try:
                with self.db.store.transaction(write=False) as tx:
                    due = q.due_incoming(tx, now=self.db.clock.now(), limit=self.workers * _BATCH)
            except Exception as exc:
                log.warning("inbox poll failed: %s", exc)
                due = []
            for msg_id in list(due):
                with self._running_lock:
                    if msg_id in self._running:
                        due.remove(msg_id)
                    else:
                        self._running.add(msg_id)
            assert self._pool is not None
            chunks = [due[i :: self.workers] for i in range(self.workers)]
            futures = [self._pool.submit(self._background, chunk) for chunk in chunks if chunk]
            for f in futures:
                f.result()
            if not due:
                self._wake.wait(0.1)
                self._wake.clear()
            if time.monotonic() - last_gc > 600:
                last_gc = time.monotonic()
                try:
                    gc(self.db, older_than=self.retention)
                except Exception as exc:
                    log.warning("inbox gc failed: %s", exc)

    def _background(self, msg_ids: list[str]) -> None:
        """Handle due messages: as one batch (one commit), then any that failed in it one
        by one, so that each failure is recorded against its own message."""
        try:
            try:
                alone = self._handle_batch(msg_ids)
            except Exception as exc:  # the batch's transaction failed: one by one
                log.warning("handling a batch of %d inbox entries failed: %s", len(msg_ids), exc)
                alone = msg_ids
            for msg_id in alone:
                try:
                    if self._handle(msg_id, True) is not None:
                        failpoint("http.receiver.after_commit_before_response")
                except Exception as exc:  # the store is down: the entry stays due
                    log.warning("handling inbox entry %s failed: %s", msg_id, exc)
                    self._stop.wait(1.0)
        finally:
            with self._running_lock:
                self._running.difference_update(msg_ids)

    def _handle_batch(self, msg_ids: list[str]) -> list[str]:
        """Run the handlers of several due messages in one transaction, each in a savepoint
        (a group commit for the inbox: one fsync for the batch on SQLite). Returns the ids
        whose handler raised (their writes undone) for ``_handle`` to run alone."""
        alone: list[str] = []
        handled = 0
        with write_lock(self.db.store), self.db.transaction() as t:
            for msg_id in msg_ids:
                ok, row = q.lock_incoming(t.tx, msg_id)
                if not ok or row is None or row.state != "received":
                    continue
                handler = self._nodes.get(row.path)
                if handler is None:
                    alone.append(msg_id)
                    continue
                try:
                    with t.tx.savepoint():
                        value = wire.decode_body(row.content_type, row.body or b"")
                        result = handler(value, t)
                        ctype, data = wire.encode_body(result, None)
                        failpoint("http.receiver.in_handler_before_commit")
                        self._finish(t.tx, row, "done", 200, ctype, data, None)
                except Exception:
                    alone.append(msg_id)
                    continue
                handled += 1
        self.stats["handled"] += handled
        if handled:
            failpoint("http.receiver.after_commit_before_response")
        return alone


class _UnknownJob(Exception):
    pass


def gc(db: Database, *, older_than: float) -> tuple[int, int]:
    """Forget delivered outbox rows and handled inbox ids older than ``older_than`` seconds.
    Returns (outbox rows, inbox rows) deleted. Run it with the inbox retention period."""
    with write_lock(db.store), db.store.transaction() as tx:
        return q.gc(tx, before=db.clock.now() - older_than)
