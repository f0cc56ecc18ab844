"""The sessions API over HTTP (JSON), so that a client in any language can use sessions.

``create_app(db)`` returns a Starlette app; ``homing serve`` mounts it at ``/sessions``.
Every route and its JSON is documented in docs/sessions.md. Bad input gets a 4xx with
``{"error": "<what was wrong and what to do>", "type": "<error class>"}``, never a 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from homing._json import strict_loads
from homing.database import Database
from homing.errors import (
    HomingError,
    InvalidArgument,
    InvalidState,
    NotFound,
    PayloadTooLarge,
    StoreUnavailable,
)
from homing.sessions._model import Recovery, Reply, Request, RequestNotFound, SessionInfo
from homing.sessions.client import Sessions

_OVERHEAD = 64 * 1024  # room for the JSON envelope around a request body


class _BadInput(InvalidArgument):
    pass


def parse_json(raw: bytes) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys, bounded nesting and number size."""
    return strict_loads(raw, _BadInput)


def _error(status: int, exc: BaseException) -> JSONResponse:
    kind = "InvalidArgument" if isinstance(exc, _BadInput) else type(exc).__name__
    return JSONResponse({"error": str(exc), "type": kind}, status_code=status)


def _status_of(exc: HomingError) -> int:
    if isinstance(exc, PayloadTooLarge):
        return 413
    if isinstance(exc, InvalidArgument):
        return 400
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, InvalidState):
        return 409
    if isinstance(exc, StoreUnavailable):
        return 503
    return 400


def _reply_json(reply: Reply | None) -> Any:
    return None if reply is None else {**asdict(reply), "ok": reply.ok}


def _request_json(request: Request) -> dict[str, Any]:
    return {"request_id": request.id, "queue": request.queue, "body": request.body}


def _recovery_json(rec: Recovery) -> dict[str, Any]:
    def status(s: Any) -> Any:
        if s is None:
            return None
        return {
            "request_id": s.request_id,
            "state": s.state,
            "action": s.action,
            "meaning": s.meaning,
            "queue": s.queue,
            "body": s.body,
            "reply": _reply_json(s.reply),
        }

    return {
        "client_id": rec.client_id,
        "last_request_id": rec.last_request_id,
        "last_enqueued_id": rec.last_enqueued_id,
        "last_dequeued_id": rec.last_dequeued_id,
        "last": status(rec.last),
        "requests": [status(s) for s in rec.requests],
    }


def _info_json(info: SessionInfo, **extra: Any) -> dict[str, Any]:
    return {**info.as_dict(), **extra}


Handler = Callable[[HttpRequest], Awaitable[Response]]


def create_app(db: Database, *, sessions: Sessions | None = None) -> Starlette:
    """The sessions HTTP API on ``db`` (or on a configured ``sessions`` object)."""
    api = sessions if sessions is not None else Sessions(db)
    limit = api.max_body_bytes + _OVERHEAD

    async def body_of(request: HttpRequest, *, required: bool = True) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise PayloadTooLarge(
                f"Content-Length {declared[:20]!r} is over the limit of {limit} bytes or invalid"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"the body is over the limit of {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            if required:
                raise _BadInput('send a JSON object body, for example {"queue": "q", "body": {}}')
            return {}
        value = parse_json(raw)
        if not isinstance(value, dict):
            raise _BadInput(f"the body must be a JSON object, not {type(value).__name__}")
        return value

    def guarded(fn: Handler) -> Handler:
        async def wrapper(request: HttpRequest) -> Response:
            try:
                return await fn(request)
            except HomingError as exc:
                return _error(_status_of(exc), exc)

        return wrapper

    def only(body: dict[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise _BadInput(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")

    def flag(body: dict[str, Any], name: str, default: bool) -> bool:
        value = body.get(name, default)
        if not isinstance(value, bool):
            raise _BadInput(f"{name} must be true or false, got {value!r}")
        return value

    def client_of(request: HttpRequest) -> str:
        return str(request.path_params["client_id"])

    async def open_session(request: HttpRequest) -> Response:
        body = await body_of(request, required=False)
        only(body, {"keep_replies"})
        client = client_of(request)

        def work() -> tuple[bool, SessionInfo]:
            session = api.open(client, keep_replies=body.get("keep_replies"))
            return session.created, session.info()

        created, info = await run_in_threadpool(work)
        return JSONResponse(
            _info_json(info, reestablished=not created), status_code=201 if created else 200
        )

    async def show_session(request: HttpRequest) -> Response:
        info = await run_in_threadpool(api.info, client_of(request))
        return JSONResponse(_info_json(info))

    async def close_session(request: HttpRequest) -> Response:
        client = client_of(request)
        await run_in_threadpool(lambda: api.attach(client).close())
        return Response(status_code=204)

    async def submit(request: HttpRequest) -> Response:
        body = await body_of(request)
        only(body, {"queue", "body", "request_id", "remember"})
        if "queue" not in body:
            raise _BadInput('"queue" is required: the name of the request queue')
        remember = flag(body, "remember", True)
        client = client_of(request)

        def work() -> Request:
            return api.attach(client).submit(
                body["queue"],
                body.get("body"),
                request_id=body.get("request_id"),
                remember=remember,
            )

        return JSONResponse(_request_json(await run_in_threadpool(work)), status_code=201)

    async def prepare(request: HttpRequest) -> Response:
        body = await body_of(request)
        only(body, {"queue", "body", "request_id"})
        if "queue" not in body:
            raise _BadInput('"queue" is required: the name of the request queue')
        client = client_of(request)

        def work() -> Request:
            return api.attach(client).prepare(
                body["queue"], body.get("body"), request_id=body.get("request_id")
            )

        return JSONResponse(_request_json(await run_in_threadpool(work)), status_code=201)

    async def resubmit(request: HttpRequest) -> Response:
        client = client_of(request)
        done = await run_in_threadpool(lambda: api.attach(client).resubmit())
        return JSONResponse(_request_json(done), status_code=201)

    async def drop(request: HttpRequest) -> Response:
        client = client_of(request)
        dropped = await run_in_threadpool(lambda: api.attach(client).drop())
        return JSONResponse(_request_json(dropped))

    async def peek(request: HttpRequest) -> Response:
        client = client_of(request)
        rid = request.query_params.get("request_id")
        reply = await run_in_threadpool(lambda: api.attach(client).peek_reply(request_id=rid))
        if reply is None:
            return Response(status_code=204)
        return JSONResponse(_reply_json(reply))

    async def take(request: HttpRequest) -> Response:
        body = await body_of(request, required=False)
        only(body, {"request_id", "timeout"})
        timeout = body.get("timeout", 0.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout > 30:
            raise _BadInput(f"timeout must be a number of seconds up to 30, got {timeout!r}")
        client = client_of(request)

        rid = body.get("request_id")

        def work() -> tuple[Reply | None, bool]:
            reply = api.attach(client).take_reply(request_id=rid, timeout=timeout)
            if reply is not None or rid is None:
                return reply, False
            # A retried take whose first response was lost: replay the reply, take nothing.
            try:
                record = api.lookup(rid)
            except RequestNotFound:
                record = None
            if record is None or record.client_id != client:
                raise RequestNotFound(
                    f"client {client!r} has no request {rid!r} (never submitted, another "
                    "client's, or past its retention)"
                )
            if record.state != "taken":
                return None, False
            return (
                Reply(
                    request_id=record.id,
                    queue=record.queue,
                    request=record.body,
                    body=record.reply,
                    error=record.error,
                    replied_at=float(record.replied_at or 0.0),
                    taken_at=record.taken_at,
                ),
                True,
            )

        reply, already = await run_in_threadpool(work)
        if reply is None:
            return Response(status_code=204)
        return JSONResponse({**_reply_json(reply), "already_taken": already})

    async def confirm(request: HttpRequest) -> Response:
        body = await body_of(request)
        only(body, {"request_ids"})
        if "request_ids" not in body:
            raise _BadInput('"request_ids" is required: a list of request ids')
        client = client_of(request)
        n = await run_in_threadpool(lambda: api.attach(client).confirm(body["request_ids"]))
        return JSONResponse({"forgotten": n})

    async def recover(request: HttpRequest) -> Response:
        client = client_of(request)
        last = request.query_params.get("last_request_id")
        rec = await run_in_threadpool(lambda: api.attach(client).recover(last_request_id=last))
        return JSONResponse(_recovery_json(rec))

    async def lookup(request: HttpRequest) -> Response:
        record = await run_in_threadpool(api.lookup, str(request.path_params["request_id"]))
        return JSONResponse(record.as_dict())

    c = "/clients/{client_id}"
    routes = [
        Route(f"{c}/session", guarded(open_session), methods=["POST"]),
        Route(f"{c}/session", guarded(show_session), methods=["GET"]),
        Route(f"{c}/session", guarded(close_session), methods=["DELETE"]),
        Route(f"{c}/requests", guarded(submit), methods=["POST"]),
        Route(f"{c}/prepare", guarded(prepare), methods=["POST"]),
        Route(f"{c}/resubmit", guarded(resubmit), methods=["POST"]),
        Route(f"{c}/drop", guarded(drop), methods=["POST"]),
        Route(f"{c}/replies/next", guarded(peek), methods=["GET"]),
        Route(f"{c}/replies/take", guarded(take), methods=["POST"]),
        Route(f"{c}/replies/confirm", guarded(confirm), methods=["POST"]),
        Route(f"{c}/recover", guarded(recover), methods=["GET"]),
        Route("/requests/{request_id}", guarded(lookup), methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.sessions = api
    return app
