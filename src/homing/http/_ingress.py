"""Who a request is and what it names: the message id from homing's header, the IETF
``Idempotency-Key`` or a Standard Webhooks ``webhook-id``; RFC 9457 problem answers.

An Idempotency-Key (draft-ietf-httpapi-idempotency-key-header) names a request only within
its client's scope, so two clients using the same key do not collide: the inbox id is a
UUIDv5 of (scope, key). A ``webhook-id`` names a message within the sender's Standard
Webhooks stream and becomes a UUIDv5 the same way.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from homing import ids
from homing.errors import InvalidArgument
from homing.http import standard, wire
from homing.http._inbox import PROBLEM_TYPE, Refused, problem_body

IDEMPOTENCY_KEY = "idempotency-key"
#: Longest Idempotency-Key accepted (characters); any printable ASCII, not only UUIDs.
MAX_IDEMPOTENCY_KEY = 255
_NAMESPACE = uuid.UUID("5b7d1a52-6f0e-4c2a-9d0e-686f6d696e67")

Scope = str | Callable[[Request], str]


def problem(status: int, detail: str, **headers: str) -> Response:
    """An RFC 9457 problem answer (``error`` repeats ``detail`` for older homing clients)."""
    return Response(
        problem_body(status, detail), status_code=status, headers=headers, media_type=PROBLEM_TYPE
    )


def body_digest(method: str, path: str, content_type: str, body: bytes) -> str:
    """What a message id names: its method (but POST), node path, content type and body. A
    message sent alone and the same message in a batch must hash alike, or a repeat of the
    one would be taken for a new message (or refused as another)."""
    verb = b"" if method == "POST" else method.encode() + b"\0"  # POST keeps the old hashes
    return hashlib.sha256(
        verb + path.encode() + b"\0" + content_type.encode() + b"\0" + body
    ).hexdigest()


def reused_id(msg_id: str) -> str:
    """The 422 detail of a message id sent again with another body, path or mode."""
    return (
        f"message {msg_id} was already received with a different body, path or mode; a "
        "message id names one message: make a new id for a new message"
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


async def read_body(request: Request, max_body: int) -> bytes:
    """The request body, refused (413/400) past ``max_body`` or if Content-Length lies."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Refused(400, f"Content-Length {declared[:40]!r} is not a number")
        if int(declared) > max_body:
            raise Refused(
                413,
                f"the body is {declared} bytes, over this receiver's limit of "
                f"{max_body}; send less or ask for a bigger max_body",
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise Refused(413, f"the body is over this receiver's limit of {max_body} bytes")
        chunks.append(chunk)
    data = b"".join(chunks)
    if declared is not None and int(declared) != len(data):
        raise Refused(400, f"Content-Length says {declared} bytes but {len(data)} arrived; resend")
    return data


def identify(
    request: Request,
    body: bytes,
    *,
    target: str,
    secrets: Mapping[str, bytes] | None,
    window: float,
    webhook_secrets: Sequence[bytes],
    tolerance: float,
    scope: Scope,
) -> tuple[str, str]:
    """(message id, mode) of a request, after checking who signed it.

    With ``secrets`` or ``webhook_secrets`` every request must be signed: homing's
    ``Homing-Signature`` or a Standard Webhooks signature (which covers no homing header,
    so such a request is taken as a webhook: its id, Option 2)."""
    headers = header_map(request)
    msg_id = headers.get(wire.MESSAGE_ID)
    # a Standard Webhooks delivery, unless a homing signature this receiver checks is there
    webhook = standard.WEBHOOK_ID in headers and (
        msg_id is None
        or (bool(webhook_secrets) and (wire.SIGNATURE not in headers or secrets is None))
    )
    if webhook:  # homing's own headers are not signed by a Standard Webhooks signature
        return _identify_webhook(headers, body, secrets, webhook_secrets, tolerance)
    if msg_id is not None:
        if not ids.is_uuid(msg_id):
            raise Refused(400, f"Homing-Message-Id {msg_id[:60]!r} is not a canonical UUID")
        mode = headers.get(wire.MODE, "put").lower()
        if mode not in wire.MODES:
            raise Refused(400, f"Homing-Mode {mode[:20]!r} must be put, send or job")
    elif IDEMPOTENCY_KEY in headers:
        key = parse_key(headers[IDEMPOTENCY_KEY])
        if wire.MODE in headers or wire.RESPONSE_URL in headers:
            raise Refused(400, "Homing-Mode and Homing-Response-Url need Homing-Message-Id")
        scope = client_scope(request, scope)
        msg_id, mode = derived_id("idempotency-key", scope, key), "put"
    else:
        raise Refused(
            400,
            "missing the Homing-Message-Id header (a UUID made by the sender); any HTTP "
            'client may send an Idempotency-Key header instead (e.g. Idempotency-Key: "k-1")',
        )
    if secrets is not None:
        problem = wire.verify(
            headers.get(wire.SIGNATURE),
            secrets,
            request.method,
            target,
            headers,
            body,
            now=time.time(),
            window=window,
        )
        if problem is not None:
            raise Refused(401, problem)
    elif webhook_secrets:
        raise Refused(401, "the request is not signed; send Standard Webhooks headers")
    return msg_id, mode


def _identify_webhook(
    headers: Mapping[str, str],
    body: bytes,
    secrets: Mapping[str, bytes] | None,
    webhook_secrets: Sequence[bytes],
    tolerance: float,
) -> tuple[str, str]:
    """A Standard Webhooks delivery: verified with ``webhook_secrets`` (required when the
    receiver is signed at all); its ``webhook-id`` names the message (Option 2)."""
    webhook_id = headers[standard.WEBHOOK_ID]
    if not webhook_id or len(webhook_id) > standard.MAX_ID:
        raise Refused(400, f"webhook-id must be 1 to {standard.MAX_ID} characters")
    if webhook_secrets:
        problem = standard.verify(
            headers,
            webhook_secrets,
            body,
            now=time.time(),
            tolerance=tolerance,
        )
        if problem is not None:
            raise Refused(401, problem)
    elif secrets is not None:
        raise Refused(401, "this receiver takes no Standard Webhooks (no webhook secret)")
    return derived_id("webhook-id", "", webhook_id), "send"
