"""The sessions API over HTTP (JSON), so that a client in any language can use sessions.

``create_app(db)`` returns a Starlette app; ``homing serve`` mounts it at ``/sessions``.
Every route and its JSON is documented in docs/sessions.md. Every route is under
``/clients/{client_id}`` and needs that client's bearer token (``Authorization: Bearer
<token>``, the token being ``client_token(secret, client_id)``), so a client reads only its
own session, requests and replies. Bad input gets a 4xx with
``{"error": "<what was wrong and what to do>", "type": "<error class>"}``, never a 500.

Each route below is one small function ``(api, http_request, client_id) -> Response``;
``_client_route`` authenticates and turns homing errors into their 4xx.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from homing.database import Database
from homing.errors import HomingError, InvalidArgument
from homing.sessions._http import (
    OVERHEAD,
    ApiConfig,
    BadInput,
    check_secret,
    client_token,
    error_response,
    flag,
    info_json,
    only,
    parse_json,
    read_body,
    recovery_json,
    reply_json,
    request_json,
    required,
    secret_from_env,
)
from homing.sessions._model import Reply, RequestNotFound, SessionInfo
from homing.sessions.client import Session
from homing.sessions.manager import Sessions

__all__ = ["client_token", "create_app", "parse_json"]

ClientRoute = Callable[[ApiConfig, HttpRequest, str], Awaitable[Response]]
EPOCH_HEADER = "x-homing-epoch"
MAX_TAKE_WAIT_S = 30


def _client_route(fn: ClientRoute) -> Callable[[HttpRequest], Awaitable[Response]]:
    async def route(request: HttpRequest) -> Response:
        api: ApiConfig = request.app.state.api
        client = str(request.path_params["client_id"])
        try:
            api.authenticate(request, client)
            return await fn(api, request, client)
        except HomingError as exc:
            return error_response(exc)

    route.__name__ = fn.__name__
    return route


def _session(api: ApiConfig, request: HttpRequest, client: str) -> Session:
    """The client's session handle: at the epoch the client names in ``X-Homing-Epoch``
    (so a newer ``open`` fences it, 409), else at the session's current epoch."""
    given = request.headers.get(EPOCH_HEADER)
    if given is None:
        return api.sessions.attach(client)
    if not given.isdigit() or len(given) > 18:
        raise BadInput(f"{EPOCH_HEADER} must be the epoch number that open returned")
    return Session(api.sessions, client, created=False, epoch=int(given))


# -- the session -----------------------------------------------------------------------------
async def open_session(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit, required=False)
    only(body, {"keep_replies"})

    def work() -> tuple[bool, SessionInfo]:
        session = api.sessions.open(client, keep_replies=body.get("keep_replies"))
        return session.created, session.info()

    created, info = await run_in_threadpool(work)
    return JSONResponse(
        info_json(info, reestablished=not created), status_code=201 if created else 200
    )


async def show_session(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    return JSONResponse(info_json(await run_in_threadpool(api.sessions.info, client)))


async def close_session(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    await run_in_threadpool(lambda: _session(api, request, client).close())
    return Response(status_code=204)


# -- Transactions 0 and 1 ----------------------------------------------------------------------
async def submit(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit)
    only(body, {"queue", "body", "request_id", "remember"})
    queue = required(body, "queue", "the name of the request queue")
    remember = flag(body, "remember", True)
    done = await run_in_threadpool(
        lambda: _session(api, request, client).submit(
            queue, body.get("body"), request_id=body.get("request_id"), remember=remember
        )
    )
    return JSONResponse(request_json(done), status_code=201)


async def prepare(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit)
    only(body, {"queue", "body", "request_id"})
    queue = required(body, "queue", "the name of the request queue")
    done = await run_in_threadpool(
        lambda: _session(api, request, client).prepare(
            queue, body.get("body"), request_id=body.get("request_id")
        )
    )
    return JSONResponse(request_json(done), status_code=201)


async def resubmit(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit, required=False)
    only(body, {"request_id"})
    done = await run_in_threadpool(
        lambda: _session(api, request, client).resubmit(body.get("request_id"))
    )
    return JSONResponse(request_json(done), status_code=201)


async def drop(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit, required=False)
    only(body, {"request_id"})
    done = await run_in_threadpool(
        lambda: _session(api, request, client).drop(body.get("request_id"))
    )
    return JSONResponse(request_json(done))


# -- Transaction 3 -----------------------------------------------------------------------------
async def peek(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    rid = request.query_params.get("request_id")
    reply = await run_in_threadpool(
        lambda: _session(api, request, client).peek_reply(request_id=rid)
    )
    return Response(status_code=204) if reply is None else JSONResponse(reply_json(reply))


async def take(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit, required=False)
    only(body, {"request_id", "timeout"})
    timeout = body.get("timeout", 0.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise BadInput(f"timeout must be a number of seconds, got {timeout!r}")
    if timeout > MAX_TAKE_WAIT_S:
        raise BadInput(f"timeout must be a number of seconds up to 30, got {timeout!r}")
    rid = body.get("request_id")

    def work() -> tuple[Reply | None, bool]:
        reply = _session(api, request, client).take_reply(request_id=rid, timeout=timeout)
        if reply is not None or rid is None:
            return reply, False
        return _replay_taken(api.sessions, client, rid), True

    reply, already = await run_in_threadpool(work)
    if reply is None:
        return Response(status_code=204)
    return JSONResponse({**reply_json(reply), "already_taken": already})


def _replay_taken(sessions: Sessions, client: str, rid: Any) -> Reply | None:
    """A retried take whose first response was lost: the reply again, taking nothing."""
    record = _own_record(sessions, client, rid)
    if record.state != "taken":
        return None
    return Reply(
        request_id=record.id,
        queue=record.queue,
        request=record.body,
        body=record.reply,
        error=record.error,
        replied_at=float(record.replied_at or 0.0),
        taken_at=record.taken_at,
    )


async def confirm(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    body = await read_body(request, api.limit)
    only(body, {"request_ids"})
    ids = required(body, "request_ids", "a list of request ids")
    n = await run_in_threadpool(lambda: _session(api, request, client).confirm(ids))
    return JSONResponse({"forgotten": n})


# -- recovery and lookups ----------------------------------------------------------------------
async def recover(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    last = request.query_params.get("last_request_id")
    rec = await run_in_threadpool(
        lambda: _session(api, request, client).recover(last_request_id=last)
    )
    return JSONResponse(recovery_json(rec))


async def lookup(api: ApiConfig, request: HttpRequest, client: str) -> Response:
    rid = str(request.path_params["request_id"])
    record = await run_in_threadpool(_own_record, api.sessions, client, rid)
    return JSONResponse(record.as_dict())


def _own_record(sessions: Sessions, client: str, rid: Any) -> Any:
    """The record of request ``rid`` if it is ``client``'s; another client's request is
    reported exactly like an unknown one (no way to probe which ids exist)."""
    try:
        record = sessions.lookup(rid)
    except RequestNotFound:
        record = None
    if record is None or record.client_id != client:
        raise RequestNotFound(
            f"client {client!r} has no request {str(rid)[:60]!r} (never submitted, another "
            "client's, or past its retention)"
        )
    return record


_ROUTES: list[tuple[str, ClientRoute, str]] = [
    ("/session", open_session, "POST"),
    ("/session", show_session, "GET"),
    ("/session", close_session, "DELETE"),
    ("/requests", submit, "POST"),
    ("/requests/{request_id}", lookup, "GET"),
    ("/prepare", prepare, "POST"),
    ("/resubmit", resubmit, "POST"),
    ("/drop", drop, "POST"),
    ("/replies/next", peek, "GET"),
    ("/replies/take", take, "POST"),
    ("/replies/confirm", confirm, "POST"),
    ("/recover", recover, "GET"),
]


def create_app(
    db: Database,
    *,
    sessions: Sessions | None = None,
    secret: str | bytes | None = None,
    insecure: bool = False,
) -> Starlette:
    """The sessions HTTP API on ``db`` (or on a configured ``sessions`` object).

    ``secret`` (default: the ``HOMING_SESSIONS_SECRET`` environment variable, at least 16
    bytes) signs the clients' bearer tokens. Without one every route answers 401 and says
    how to configure it; ``insecure=True`` turns authentication off (local experiments
    only: anyone who reaches the API can then act as any client).
    """
    api = sessions if sessions is not None else Sessions(db)
    if not isinstance(insecure, bool):
        raise InvalidArgument(f"insecure must be True or False, got {insecure!r}")
    key = check_secret(secret) if secret is not None else secret_from_env()
    app = Starlette(
        routes=[
            Route(f"/clients/{{client_id}}{path}", _client_route(fn), methods=[method])
            for path, fn, method in _ROUTES
        ]
    )
    app.state.api = ApiConfig(api, api.max_body_bytes + OVERHEAD, key, insecure)
    app.state.sessions = api
    return app
