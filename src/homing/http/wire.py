"""The wire format of reliable HTTP messaging, strict JSON, HMAC signing and URL safety.

Headers (case-insensitive, as HTTP has it):

==========================  ============================================================
``Homing-Message-Id``       the sender's UUID for the message (required, canonical text)
``Homing-Mode``             ``put`` (Option 1), ``send`` (Option 2) or ``job``
``Homing-Response-Url``     where a ``job``'s result is delivered (reliably) later
``Homing-In-Reply-To``      on a job's result message: the id of the job request
``Homing-Reply-Status``     on a job's result message: 200 (result) or 501 (the job failed)
``Homing-Signature``        ``t=<unix>,k=<key id>,v1=<hex HMAC-SHA256>`` (optional)
``Homing-Confirm-Url``      on a response: ``DELETE`` it once the response is stored
``Homing-Replayed``         on a response: ``true`` when it is a stored response replayed
``Homing-Inbox-Retention``  on every answer: seconds the receiver remembers message ids
==========================  ============================================================
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from homing._json import MAX_DEPTH, MAX_INT, strict_loads
from homing.errors import InvalidArgument
from homing.http.errors import UnsafeURL

MESSAGE_ID = "homing-message-id"
MODE = "homing-mode"
RESPONSE_URL = "homing-response-url"
IN_REPLY_TO = "homing-in-reply-to"
REPLY_STATUS = "homing-reply-status"
SIGNATURE = "homing-signature"
CONFIRM_URL = "homing-confirm-url"
REPLAYED = "homing-replayed"
RETENTION = "homing-inbox-retention"

JSON_TYPE = "application/json"
BYTES_TYPE = "application/octet-stream"
MODES = ("put", "send", "job")

MAX_JSON_DEPTH = MAX_DEPTH
MAX_JSON_INT = MAX_INT


class BadJSON(InvalidArgument):
    """A JSON body breaks homing's strict rules (I-JSON-like); nothing was stored."""


def encode_body(body: Any, content_type: str | None) -> tuple[str, bytes]:
    """Turn a Python value into (content type, bytes): bytes stay bytes, the rest is JSON."""
    if isinstance(body, bytes | bytearray | memoryview):
        return content_type or BYTES_TYPE, bytes(body)
    if content_type is not None and not is_json_type(content_type):
        if isinstance(body, str):
            return content_type, body.encode()
        raise InvalidArgument(
            f"body for content type {content_type!r} must be bytes or str, got "
            f"{type(body).__name__}; pass bytes, or leave content_type unset for JSON"
        )
    try:
        text = json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"body must be bytes or JSON-serialisable (no NaN/Infinity): {exc}"
        ) from exc
    return content_type or JSON_TYPE, text.encode()


def is_json_type(content_type: str) -> bool:
    main = content_type.split(";", 1)[0].strip().lower()
    return main == JSON_TYPE or main.endswith("+json")


def decode_body(content_type: str, data: bytes) -> Any:
    """Bytes to the value a handler sees: JSON parsed strictly, anything else as bytes."""
    if is_json_type(content_type):
        return strict_json(data)
    return data


def strict_json(data: bytes) -> Any:
    """Parse JSON refusing NaN/Infinity, duplicate keys, deep nesting and huge integers."""
    return strict_loads(data, BadJSON)


# -- signing -----------------------------------------------------------------------------
def _mac(secret: bytes, ts: str, method: str, path: str, msg_id: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    text = f"{ts}\n{method.upper()}\n{path}\n{msg_id}\n{digest}".encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def sign(
    key_id: str,
    secret: bytes,
    method: str,
    path: str,
    msg_id: str,
    body: bytes,
    now: float | None = None,
) -> str:
    """The ``Homing-Signature`` header value for one request."""
    ts = str(int(time.time() if now is None else now))
    return f"t={ts},k={key_id},v1={_mac(secret, ts, method, path, msg_id, body)}"


def verify(
    header: str | None,
    secrets: Mapping[str, bytes],
    method: str,
    path: str,
    msg_id: str,
    body: bytes,
    *,
    now: float,
    window: float,
) -> str | None:
    """None if the signature is good; otherwise what is wrong with it (for a 401)."""
    if not header:
        return "the request is not signed; send a Homing-Signature header"
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    ts, key_id, mac = parts.get("t", ""), parts.get("k", ""), parts.get("v1", "")
    if not ts.isdigit() or not key_id or not mac:
        return "Homing-Signature is malformed; expected t=<unix>,k=<key id>,v1=<hex>"
    secret = secrets.get(key_id)
    if secret is None:
        return f"unknown signing key id {key_id[:40]!r}"
    if abs(now - int(ts)) > window:
        return (
            f"the signature's timestamp is {abs(now - int(ts)):.0f}s away from the receiver's "
            f"clock (window {window:g}s); check the clocks (NTP) and sign afresh"
        )
    if not hmac.compare_digest(mac, _mac(secret, ts, method, path, msg_id, body)):
        return "the signature does not match the request; check the shared secret"
    return None


# -- URL safety --------------------------------------------------------------------------
def _host_port(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"URL {url[:200]!r} has a bad port") from exc
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def check_http(url: Any) -> str:
    """A destination the application chose itself: it must be an http(s) URL with a host."""
    if not isinstance(url, str) or len(url) > 2000 or any(ord(c) < 33 for c in url):
        raise InvalidArgument("the URL must be a string of at most 2000 printable characters")
    scheme, host, _ = _host_port(url)
    if scheme not in ("http", "https") or not host:
        raise InvalidArgument(f"URL {url[:200]!r} must be http:// or https:// with a host")
    return url


def check_url(url: Any, allowed_hosts: Iterable[str] = (), *, resolve: bool = True) -> str:
    """Refuse a URL the other side gave us unless it is safe to call (no SSRF).

    It must be ``http``/``https`` with a host. A host (or ``host:port``) listed in
    ``allowed_hosts`` is accepted as is; any other host must resolve only to public
    addresses (not loopback, private, link-local, multicast, reserved or unspecified).
    """
    if not isinstance(url, str) or len(url) > 2000 or any(ord(c) < 33 for c in url):
        raise InvalidArgument("the URL must be a string of at most 2000 printable characters")
    scheme, host, port = _host_port(url)
    if scheme not in ("http", "https"):
        raise UnsafeURL(
            f"URL {url[:200]!r} has scheme {scheme!r}; only http and https URLs are called"
        )
    if not host:
        raise InvalidArgument(f"URL {url[:200]!r} has no host")
    allowed = {h.lower() for h in allowed_hosts}
    if host in allowed or (port is not None and f"{host}:{port}" in allowed):
        return url
    try:
        addrs = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        if not resolve:
            return url
        try:
            infos = socket.getaddrinfo(host, port or 80, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            raise UnsafeURL(f"host {host!r} of URL {url[:200]!r} does not resolve") from exc
        addrs = [ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in infos]
    for addr in addrs:
        if (
            addr.is_loopback
            or addr.is_private
            or addr.is_link_local
            or addr.is_multicast
            or addr.is_reserved
            or addr.is_unspecified
        ):
            raise UnsafeURL(
                f"URL {url[:200]!r} points at a non-public address ({addr}); it is refused to "
                "prevent request forgery. Add the host to allowed_hosts if it is yours"
            )
    return url
