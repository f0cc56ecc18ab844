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
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from homing import ids
from homing._failpoints import failpoint
from homing.database import Database
from homing.errors import InvalidArgument
from homing.http import _ingress, batch_wire, standard, wire
from homing.http._batch_in import batch_path, receive_batch
from homing.http._fastpath import NodeFastPath, route_path
from homing.http._group import GroupCommit
from homing.http._inbox import AT_RECEIPT_BELOW_S, Answer, Handler, Inbox, Refused, stored_answer
from homing.http._receipt import Handled, Receipt, ReceiptBatch
from homing.http._replies import job_status, store_reply
from homing.http._worker import InboxWorker, gc
from homing.http.dispatcher import Dispatcher, notify_changed
from homing.http.errors import UnsafeURL
from homing.http.policy import DEFAULT_ABSURD_AFTER_S, RetryPolicy
from homing.store import http_inbox_queries as iq
from homing.store import http_queries as q
from homing.store.protocol import Tx

log = logging.getLogger("homing.http")
T = TypeVar("T")

__all__ = ["Handler", "Receiver", "gc"]
DEFAULT_RETENTION_S = 7 * 24 * 3600.0
DEFAULT_MAX_BODY = 1024 * 1024
INTERNAL = wire.INTERNAL


_error = _ingress.problem
_Refused = Refused
_Answer = Answer


class Receiver:
    """Reliable nodes at URL paths, as a Starlette app (``receiver.app``).

    ``allowed_hosts``: hosts a response URL may name although they are private (by default
    only public addresses are called). ``secrets``: key id -> shared secret; when given,
    every request must carry a valid ``Homing-Signature`` within ``signature_window``
    seconds. ``retention``: how long message ids are remembered (published as
    ``Homing-Inbox-Retention``); keep it above every sender's ``absurd_after``.
    ``dispatch``: run a dispatcher for the job results this receiver sends back.

    Any HTTP client may send an IETF ``Idempotency-Key`` instead of homing's headers (an
    Option 1 request): ``idempotency_scope`` says whose keys are one namespace
    (``address``: the source address; ``authorization``: the Authorization credentials; or
    a callable of the request). ``webhook_secrets`` (``whsec_...``, several while rotating)
    verify Standard Webhooks deliveries, whose ``webhook-id`` names the message.
    ``resolver`` replaces the system's DNS for checking response URLs (tests).
    ``handle_at_receipt_below``: an Option 2 message to a node whose handlers have run
    shorter than this on average (seconds) is handled in the commit that stores it,
    before the answer; 0 handles every one in the background (see docs/http.md).
    ``batches``: take batches of Option 2 messages (``batch_wire``) and say so in the
    ``Homing-Batch`` header of the answers to them.
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
        idempotency_scope: _ingress.Scope = "address",
        webhook_secrets: Sequence[str | bytes] | None = None,
        webhook_tolerance: float = 300.0,
        resolver: wire.Resolver | None = None,
        handle_at_receipt_below: float = AT_RECEIPT_BELOW_S,
        batches: bool = True,
    ) -> None:
        if not isinstance(db, Database):
            raise InvalidArgument(
                f"Receiver needs a homing.Database (homing.connect(url)), got {type(db).__name__}"
            )
        if max_body < 1 or workers < 1 or max_handler_attempts < 1:
            raise InvalidArgument("max_body, workers and max_handler_attempts must be >= 1")
        if not 0 <= handle_at_receipt_below < float("inf"):
            raise InvalidArgument("handle_at_receipt_below must be a number of seconds >= 0")
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
        self.idempotency_scope = _ingress.check_scope(idempotency_scope)
        self.webhook_secrets = [standard.secret_key(k) for k in webhook_secrets or ()]
        self.webhook_tolerance = webhook_tolerance
        self.resolver = resolver
        self.batches = batches
        self._nodes: dict[str, Handler] = {}
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit] = (
            weakref.WeakKeyDictionary()
        )
        self._start_lock = threading.Lock()
        self._dispatch = dispatch
        self._dispatcher_options = dict(dispatcher_options or {})
        self._dispatcher_options.setdefault("allowed_hosts", self.allowed_hosts)
        if resolver is not None:
            self._dispatcher_options.setdefault("resolver", resolver)
        self.dispatcher: Dispatcher | None = None
        self.stats = {"received": 0, "duplicates": 0, "handled": 0, "refused": 0, "dead": 0}
        self.stats["handled_at_receipt"] = 0  # first attempts made in the storing commit
        self.inbox = Inbox(
            db,
            self._nodes,
            retry=self.handler_retry,
            max_attempts=max_handler_attempts,
            absurd_after=absurd_after,
            stats=self.stats,
            on_reply=self._wake_dispatcher,
            at_receipt_below=handle_at_receipt_below,
        )
        self._worker = InboxWorker(db, self.inbox, workers=workers, retention=self.retention)
        self._commit_pool = ThreadPoolExecutor(2, thread_name_prefix="homing-in-commit")
        fast = Middleware(
            NodeFastPath, nodes=self._nodes, reply_path=self.reply_path, endpoint=self._receive
        )
        self.app = Starlette(
            middleware=[fast],
            routes=[
                Route(INTERNAL + "/info", self._info, methods=["GET"]),
                Route(INTERNAL + batch_wire.BATCH_PATH, self._receive_batch, methods=["POST"]),
                Route(INTERNAL + "/inbox/{msg_id}", self._confirm, methods=["DELETE"]),
                Route(INTERNAL + "/inbox/{msg_id}", self._status, methods=["GET"]),
                Route("/{rest:path}", self._receive, methods=list(wire.METHODS)),
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
            if self._worker.started:
                return self
            self._worker.start()
            if self._dispatch and self.dispatcher is None:
                self.dispatcher = Dispatcher(self.db, **self._dispatcher_options).start()
        return self

    def stop(self) -> None:
        with self._start_lock:
            self._worker.stop()
            if self.dispatcher is not None:
                self.dispatcher.stop()
                self.dispatcher = None

    def _group(self) -> GroupCommit:
        loop = asyncio.get_running_loop()
        group = self._groups.get(loop)
        if group is None:
            # inbox inserts go to threads of their own (anyio's to_thread cost more CPU)
            group = self._groups[loop] = GroupCommit(
                self.db.store, self._in_commit_thread, batch=ReceiptBatch(self.db)
            )
        return group

    def _in_commit_thread(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._commit_pool, fn)

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
        problem = self._unsigned(request)  # an unsigned DELETE could drop a stored response
        if problem is not None:
            return _error(401, problem, **self._headers())
        found = await self._group().run(functools.partial(iq.confirm_incoming, msg_id=msg_id))
        if not found:
            return _error(404, f"no answered message {msg_id} in this inbox")
        return Response(status_code=204, headers=self._headers())

    def _unsigned(self, request: Request) -> str | None:
        """What is wrong with a body-less request's signature (None: fine or not needed)."""
        if self.secrets is None:
            return None
        return wire.verify(
            request.headers.get(wire.SIGNATURE),
            self.secrets,
            request.method,
            self._target(request),
            _ingress.header_map(request),
            b"",
            now=time.time(),
            window=self.signature_window,
        )

    async def _status(self, request: Request) -> Response:
        """How a job went: its inbox state and, once its result could not be delivered to
        the response URL, the result itself (the sender fetches it instead of waiting)."""
        msg_id = request.path_params["msg_id"]
        if not ids.is_uuid(msg_id):
            return _error(400, "the message id in the URL is not a UUID")
        problem = self._unsigned(request)
        if problem is not None:
            return _error(401, problem, **self._headers())
        found = await run_in_threadpool(job_status, self.db, msg_id)
        if found is None:
            return _error(404, f"no message {msg_id} in this inbox", **self._headers())
        return JSONResponse(found, headers=self._headers())

    @staticmethod
    def _target(request: Request) -> str:
        """Path and query as the sender signed them."""
        path = str(request.scope.get("path", "")) or "/"
        query = request.scope.get("query_string", b"").decode("latin-1")
        return f"{path}?{query}" if query else path

    def _wake_dispatcher(self, tx: Tx) -> None:
        if self.dispatcher is not None:
            tx.call_after_commit(self.dispatcher.wake)

    def _route_path(self, request: Request) -> str:
        return route_path(request.scope)

    async def _receive(self, request: Request) -> Response:
        if not self._worker.started:
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

    async def _receive_batch(self, request: Request) -> Response:
        """Many Option 2 messages in one request (``batch_wire``)."""
        if not self.batches:
            return _error(404, "this receiver takes no batches; send each message alone")
        if not self._worker.started:
            await run_in_threadpool(self.start)
        return await receive_batch(self, request)

    async def _receive_checked(self, request: Request) -> Response:
        path = self._route_path(request)
        is_reply = path == self.reply_path
        if not is_reply and path not in self._nodes:
            raise _Refused(404, f"no reliable node at {path[:200]!r} on this receiver")
        body = await _ingress.read_body(request, self.max_body)
        msg_id, mode = self._identify(request, body)
        ctype = request.headers.get("content-type", wire.BYTES_TYPE)
        value: Any = body  # what the handler gets: the body, parsed if JSON
        if wire.is_json_type(ctype):
            value = wire.strict_json(body)  # refuse bad JSON before anything is stored
        response_url = request.headers.get(wire.RESPONSE_URL)
        if mode == "job":
            if not response_url:
                raise _Refused(400, "Homing-Mode job needs a Homing-Response-Url header")
            try:
                # may resolve DNS: keep it off the event loop
                await run_in_threadpool(
                    functools.partial(
                        wire.check_url, response_url, self.allowed_hosts, resolver=self.resolver
                    )
                )
            except UnsafeURL as exc:
                raise _Refused(422, str(exc)) from exc
        elif response_url:
            raise _Refused(400, "Homing-Response-Url is only for Homing-Mode job")
        digest = _ingress.body_digest(request.method, path, ctype, body)
        if is_reply:
            return await self._receive_reply(request, msg_id, digest, ctype, body)
        if mode == "put":
            new = self._new_row(msg_id, path, mode, digest, ctype, body, None)
            store = functools.partial(iq.insert_incoming, row=new)
            return await self._receive_put(request, msg_id, digest, store)
        row = self._new_row(msg_id, path, mode, digest, ctype, body, response_url)
        handle = mode == "send" and self.inbox.at_receipt_for(path)
        existing = await self._group().run(Receipt(self.db, self.inbox, row, handle, value))
        if existing is None or isinstance(existing, Handled):
            self.stats["received"] += 1
            failpoint("http.receiver.after_inbox_insert")
            if existing is None:
                self._worker.wake()
        else:
            self.stats["duplicates"] += 1
            if existing.body_hash != digest or existing.mode != mode:
                raise _Refused(422, _ingress.reused_id(msg_id))
        if mode == "send":  # says where a sender may send the next ones in batches
            headers = self._headers()
            if self.batches:
                root = str(request.scope.get("root_path", ""))
                headers[batch_wire.BATCH_HEADER] = batch_path(root)
            return Response(status_code=204, headers=headers)
        # the sender may ask here how its job went (and fetch a result it did not get)
        status_url = f"{self._base(request)}{INTERNAL}/inbox/{msg_id}"
        return Response(status_code=202, headers={**self._headers(), wire.STATUS_URL: status_url})

    @staticmethod
    def _base(request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}{request.scope.get('root_path', '')}"

    def _identify(self, request: Request, body: bytes) -> tuple[str, str]:
        """(message id, mode) of a request, after checking who signed it."""
        return _ingress.identify(
            request,
            body,
            target=self._target(request),
            secrets=self.secrets,
            window=self.signature_window,
            webhook_secrets=self.webhook_secrets,
            tolerance=self.webhook_tolerance,
            scope=self.idempotency_scope,
        )

    async def _receive_put(
        self,
        request: Request,
        msg_id: str,
        digest: str,
        store: Callable[[Tx], q.InboxRow | None],
    ) -> Response:
        """Option 1: store and handle in one transaction (a repeat replays the response)."""
        if not self._worker.claim(
            msg_id
        ):  # a request with this id is being served: replay if it is already done
            row = await run_in_threadpool(self._read, msg_id)
            if row is None or row.state == "received":
                return self._in_progress(msg_id)
            if row.body_hash != digest or row.mode != "put":
                raise _Refused(422, f"message {msg_id} was already received with a different body")
            self.stats["duplicates"] += 1
            return self._answer(request, msg_id, stored_answer(row, replayed=True))
        try:
            answer = await run_in_threadpool(self.inbox.handle, msg_id, False, store, digest)
        finally:
            self._worker.release([msg_id])
        if answer is None:
            return self._in_progress(msg_id)
        failpoint("http.receiver.after_commit_before_response")
        return self._answer(request, msg_id, answer)

    def _read(self, msg_id: str) -> q.InboxRow | None:
        with self.db.store.transaction(write=False) as tx:
            return iq.incoming(tx, msg_id)

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
            headers[wire.CONFIRM_URL] = f"{self._base(request)}{INTERNAL}/inbox/{msg_id}"
        return Response(
            answer.body,
            status_code=answer.status,
            media_type=answer.content_type,
            headers=headers,
        )

    # -- storing and handling --------------------------------------------------------------
    def _new_row(
        self,
        msg_id: str,
        path: str,
        mode: str,
        digest: str,
        ctype: str,
        body: bytes,
        response_url: str | None,
    ) -> q.InboxRow:
        """The inbox row for a new request (a put is handled at once: no work time)."""
        now = self.db.clock.now()
        return iq.received_row(
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
            store_reply, self.db, self.reply_path, msg_id, job_id, int(status), digest, ctype, body
        )
        if outcome == "conflict":
            raise _Refused(422, f"message {msg_id} was already received with a different body")
        if outcome == "unknown":
            raise _Refused(404, f"no job {job_id} in this sender's outbox")
        if outcome == "new":
            failpoint("http.receiver.after_inbox_insert")
            notify_changed(job_id)
        return Response(status_code=204, headers=self._headers())
