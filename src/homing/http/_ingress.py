"""Who a request is and what it names: the message id from homing's header, the IETF
``Idempotency-Key`` or a Standard Webhooks ``webhook-id``; RFC 9457 problem answers.

An Idempotency-Key (draft-ietf-httpapi-idempotency-key-header) names a request only within
its client's scope, so two clients using the same key do not collide: the inbox id is a
UUIDv5 of (scope, key). A ``webhook-id`` names a message within the sender's Standard
Webhooks stream and becomes a UUIDv5 the same way.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from homing.errors import InvalidArgument
from homing.http._inbox import Refused

IDEMPOTENCY_KEY = "idempotency-key"
#: Longest Idempotency-Key accepted (characters); any printable ASCII, not only UUIDs.
MAX_IDEMPOTENCY_KEY = 255
PROBLEM_TYPE = "application/problem+json"
_NAMESPACE = uuid.UUID("5b7d1a52-6f0e-4c2a-9d0e-686f6d696e67")

Scope = str | Callable[[Request], str]


def problem(status: int, detail: str, **headers: str) -> JSONResponse:
    """An RFC 9457 problem answer (``error`` repeats ``detail`` for older homing clients)."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return JSONResponse(
        {**body, "error": detail}, status_code=status, headers=headers, media_type=PROBLEM_TYPE
    )


def header_map(request: Request) -> dict[str, str]:
    """Request headers by lower-case name; repeated fields joined with ', ' (RFC 9110)."""
    out: dict[str, str] = {}
    for name, value in request.headers.items():
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def parse_key(raw: str) -> str:
    """The key of an ``Idempotency-Key`` field: a structured-field string (``"..."``), or
    for lenient clients the bare text; 1..255 printable ASCII characters."""
    key = raw.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or any(not 32 <= ord(c) < 127 for c in key):
        raise Refused(
            400,
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters "
            '(a structured-field string such as "8e03978e-40d5-43e8-bc93-6894a57f9324")',
        )
    return key


def client_scope(request: Request, scope: Scope) -> str:
    """The namespace of a client's idempotency keys: its source address (``address``), its
    ``Authorization`` credentials (``authorization``) or what a callable says."""
    if callable(scope):
        value = scope(request)
        if not isinstance(value, str) or not value:
            raise Refused(401, "this client could not be identified for its Idempotency-Key")
        return "custom:" + value
    if scope == "authorization":
        auth = request.headers.get("authorization")
        if not auth:
            raise Refused(
                401, "Idempotency-Key needs an authenticated client: send an Authorization header"
            )
        return "auth:" + hashlib.sha256(auth.encode()).hexdigest()
    host = request.client.host if request.client is not None else "unknown"
    return "addr:" + host


def derived_id(kind: str, scope: str, key: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{kind}\0{scope}\0{key}"))


def check_scope(scope: Any) -> Scope:
    if callable(scope) or scope in ("address", "authorization"):
        return scope
    raise InvalidArgument("idempotency_scope must be 'address', 'authorization' or a callable")
