"""Pieces of the sessions HTTP API that are not routes: request bodies, JSON shapes,
error statuses and client authentication (see ``asgi.py`` for the routes)."""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import asdict, dataclass
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse

from homing._json import strict_loads
from homing.errors import (
    HomingError,
    InvalidArgument,
    InvalidState,
    NotFound,
    PayloadTooLarge,
    StoreUnavailable,
)
from homing.sessions._model import Recovery, Reply, Request, SessionInfo
from homing.sessions.manager import Sessions

OVERHEAD = 64 * 1024  # room for the JSON envelope around a request body
SECRET_ENV = "HOMING_SESSIONS_SECRET"
_TOKEN_CONTEXT = b"homing-sessions/v1:"
_MIN_SECRET = 16


class BadInput(InvalidArgument):
    """The HTTP request itself is malformed (body, field, JSON)."""


class Unauthorized(HomingError):
    """No valid bearer token for this client: send ``Authorization: Bearer <token>`` with the
    token the operator issued for it (``homing sessions token CLIENT_ID``)."""


def client_token(secret: str | bytes, client_id: str) -> str:
    """The bearer token of ``client_id``: HMAC-SHA256 of its id under the server's secret.

    Stateless (nothing stored), per client (one client's token opens no other client's
    routes); rotating the secret revokes every token."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, _TOKEN_CONTEXT + client_id.encode(), hashlib.sha256).hexdigest()


def check_secret(secret: str | bytes | None) -> bytes | None:
    if secret is None:
        return None
    key = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(key, bytes) or len(key) < _MIN_SECRET:
        raise InvalidArgument(
            f"the sessions API secret must be at least {_MIN_SECRET} bytes; generate one with "
            "python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return key


def secret_from_env() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    return check_secret(value) if value else None


@dataclass(frozen=True)
class ApiConfig:
    """What every route needs: the sessions object, the body limit and the auth secret."""

    sessions: Sessions
    limit: int
    secret: bytes | None
    insecure: bool

    def authenticate(self, request: HttpRequest, client_id: str) -> None:
        """Refuse unless the request carries ``client_id``'s bearer token."""
        if self.insecure:
            return
        if self.secret is None:
            raise Unauthorized(
                f"the sessions API has no secret configured: set {SECRET_ENV} (or pass "
                "create_app(db, secret=...)) and give each client its token"
            )
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        expected = client_token(self.secret, client_id)
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), expected):
            raise Unauthorized(
                f"no valid bearer token for client {client_id[:50]!r}: send "
                "Authorization: Bearer <the token issued for this client>"
            )


def error_response(exc: HomingError) -> JSONResponse:
    kind = "InvalidArgument" if isinstance(exc, BadInput) else type(exc).__name__
    headers = {"www-authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    return JSONResponse(
        {"error": str(exc), "type": kind}, status_code=status_of(exc), headers=headers
    )


def status_of(exc: HomingError) -> int:
    for kind, status in (
        (Unauthorized, 401),
        (PayloadTooLarge, 413),
        (InvalidArgument, 400),
        (NotFound, 404),
        (InvalidState, 409),
        (StoreUnavailable, 503),
    ):
        if isinstance(exc, kind):
            return status
    return 400


async def read_body(request: HttpRequest, limit: int, *, required: bool = True) -> dict[str, Any]:
    """The request's JSON object body, bounded by ``limit`` bytes (declared and actual)."""
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
            raise BadInput('send a JSON object body, for example {"queue": "q", "body": {}}')
        return {}
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise BadInput(f"the body must be a JSON object, not {type(value).__name__}")
    return value


def parse_json(raw: bytes) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys, bounded nesting and number size."""
    return strict_loads(raw, BadInput)


def only(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadInput(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def required(body: dict[str, Any], name: str, what: str) -> Any:
    if name not in body:
        raise BadInput(f'"{name}" is required: {what}')
    return body[name]


def flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadInput(f"{name} must be true or false, got {value!r}")
    return value


def reply_json(reply: Reply | None) -> Any:
    return None if reply is None else {**asdict(reply), "ok": reply.ok}


def request_json(request: Request) -> dict[str, Any]:
    return {"request_id": request.id, "queue": request.queue, "body": request.body}


def recovery_json(rec: Recovery) -> dict[str, Any]:
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
            "reply": reply_json(s.reply),
        }

    return {
        "client_id": rec.client_id,
        "last_request_id": rec.last_request_id,
        "last_enqueued_id": rec.last_enqueued_id,
        "last_dequeued_id": rec.last_dequeued_id,
        "last": status(rec.last),
        "requests": [status(s) for s in rec.requests],
    }


def info_json(info: SessionInfo, **extra: Any) -> dict[str, Any]:
    return {**info.as_dict(), **extra}
