"""The wire format of reliable HTTP messaging, strict JSON, HMAC signing and URL safety.

Headers (case-insensitive, as HTTP has it):

==========================  ============================================================
``Homing-Message-Id``       the sender's UUID for the message (required, canonical text)
``Homing-Mode``             ``put`` (Option 1), ``send`` (Option 2) or ``job``
``Homing-Response-Url``     where a ``job``'s result is delivered (reliably) later
``Homing-In-Reply-To``      on a job's result message: the id of the job request
``Homing-Reply-Status``     on a job's result message: 200 (result) or 501 (the job failed)
``Homing-Signature``        ``t=<unix>,k=<key id>,v2=<hex HMAC-SHA256>`` (optional)
``Homing-Confirm-Url``      on a response: ``DELETE`` it once the response is stored
``Homing-Status-Url``       on a 202: ``GET`` it for the job's state (and an undelivered result)
``Homing-Replayed``         on a response: ``true`` when it is a stored response replayed
``Homing-Inbox-Retention``  on every answer: seconds the receiver remembers message ids
==========================  ============================================================
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from homing._json import MAX_DEPTH, MAX_INT, compact, strict_loads
from homing.errors import InvalidArgument
from homing.http.errors import UnsafeURL

MESSAGE_ID = "homing-message-id"
MODE = "homing-mode"
RESPONSE_URL = "homing-response-url"
IN_REPLY_TO = "homing-in-reply-to"
REPLY_STATUS = "homing-reply-status"
SIGNATURE = "homing-signature"
CONFIRM_URL = "homing-confirm-url"
STATUS_URL = "homing-status-url"
REPLAYED = "homing-replayed"
RETENTION = "homing-inbox-retention"

INTERNAL = "/_homing"  # the receiver's own paths: /info, /inbox/<id>, /reply, /batch

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
    text = compact(body, what="body must be bytes or JSON-serialisable (no NaN/Infinity)")
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
def canonical(ts: str, method: str, target: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """What a ``Homing-Signature`` binds: the time, method, path (with query), content
    type, every ``Homing-*`` header but the signature itself (by name, sorted) and a digest
    of the body. Anything a receiver routes on is signed, so a captured signature cannot be
    replayed with another mode, response URL or content type."""
    lower = {k.lower(): v.strip() for k, v in headers.items()}
    lines = [ts, method.upper(), target, lower.get("content-type", "")]
    lines += [
        f"{name}:{lower[name]}"
        for name in sorted(lower)
        if name.startswith("homing-") and name != SIGNATURE
    ]
    lines.append(hashlib.sha256(body).hexdigest())
    return "\n".join(lines).encode()


def _mac(secret: bytes, text: bytes) -> str:
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def sign(
    key_id: str,
    secret: bytes,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float | None = None,
) -> str:
    """The ``Homing-Signature`` header value for one request (``target``: path?query)."""
    ts = str(int(time.time() if now is None else now))
    return f"t={ts},k={key_id},v2={_mac(secret, canonical(ts, method, target, headers, body))}"


def verify(
    header: str | None,
    secrets: Mapping[str, bytes],
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    window: float,
) -> str | None:
    """None if the signature is good; otherwise what is wrong with it (for a 401)."""
    if not header:
        return "the request is not signed; send a Homing-Signature header"
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    ts, key_id, mac = parts.get("t", ""), parts.get("k", ""), parts.get("v2", "")
    if not ts.isdigit() or not key_id or not mac:
        return "Homing-Signature is malformed; expected t=<unix>,k=<key id>,v2=<hex>"
    secret = secrets.get(key_id)
    if secret is None:
        return f"unknown signing key id {key_id[:40]!r}"
    if abs(now - int(ts)) > window:
        return (
            f"the signature's timestamp is {abs(now - int(ts)):.0f}s away from the receiver's "
            f"clock (window {window:g}s); check the clocks (NTP) and sign afresh"
        )
    if not hmac.compare_digest(mac, _mac(secret, canonical(ts, method, target, headers, body))):
        return (
            "the signature does not match the request (method, path, content type, Homing-* "
            "headers and body are signed); check the shared secret"
        )
    return None


# -- the sender's own headers ---------------------------------------------------------------
#: Headers homing sets itself (or that HTTP owns); a sender may not set them.
RESERVED_HEADERS = frozenset(
    {"content-type", "content-length", "host", "transfer-encoding", "connection", "te"}
)
METHODS = ("POST", "PUT", "PATCH", "DELETE")
_TOKEN = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Validate a sender's own request headers (``Authorization``, ...): names are HTTP
    tokens, values printable on one line, and none of homing's or HTTP's own."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must be a mapping of str to str, got {headers!r}")
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not name or not set(name) <= _TOKEN:
            raise InvalidArgument(f"header name {name!r} is not a valid HTTP field name")
        low = name.lower()
        if low in RESERVED_HEADERS or low.startswith(("homing-", "webhook-")):
            raise InvalidArgument(
                f"header {name!r} is set by homing or HTTP itself; use content_type= for the "
                "content type, and leave Homing-* and webhook-* headers to homing"
            )
        if not isinstance(value, str) or any(ord(c) < 32 and c != "\t" for c in value):
            raise InvalidArgument(f"header {name!r} needs a one-line str value")
        out[low] = value
    return out


def check_method(method: str) -> str:
    up = method.upper() if isinstance(method, str) else ""
    if up not in METHODS:
        raise InvalidArgument(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return up


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


Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to now (the system's resolver)."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return [str(i[4][0]).split("%", 1)[0] for i in infos]


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_COMPAT = ipaddress.ip_network("::/96")


def _embedded(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[Any]:
    """IPv4 addresses carried inside an IPv6 one (mapped, 6to4, Teredo, NAT64, ISATAP,
    IPv4-compatible): a public-looking IPv6 address may reach a private IPv4 host."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    found: list[Any] = []
    if addr.ipv4_mapped is not None:
        found.append(addr.ipv4_mapped)
    if addr.sixtofour is not None:
        found.append(addr.sixtofour)
    if addr.teredo is not None:
        found.extend(addr.teredo)
    low32 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if any(addr in net for net in _NAT64) or (addr in _COMPAT and int(addr) > 0xFFFF):
        found.append(low32)
    if (int(addr) >> 32) & 0xFDFFFFFF == 0x00005EFE:  # ISATAP interface id
        found.append(low32)
    return found


def unsafe_address(text: str) -> str | None:
    """Why homing will not connect to this IP address (None: it is public)."""
    try:
        addr = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return f"{text!r} is not an IP address"
    for a in (addr, *_embedded(addr)):
        if not a.is_global or a.is_multicast:
            return f"{text} is not a public address" + (f" (it carries {a})" if a != addr else "")
    return None


def is_allowed(host: str, port: int | None, allowed_hosts: Iterable[str]) -> bool:
    allowed = {h.lower() for h in allowed_hosts}
    host = host.lower()
    return host in allowed or (port is not None and f"{host}:{port}" in allowed)


def check_url(
    url: Any,
    allowed_hosts: Iterable[str] = (),
    *,
    resolve: bool = True,
    resolver: Resolver | None = None,
) -> str:
    """Refuse a URL the other side gave us unless it is safe to call (no SSRF).

    It must be ``http``/``https`` with a host. A host (or ``host:port``) listed in
    ``allowed_hosts`` is accepted as is; any other host must resolve only to public
    addresses (not loopback, private, shared (100.64/10), link-local, multicast, reserved or
    unspecified, nor an IPv6 form that carries such an IPv4 address: mapped, 6to4, Teredo,
    NAT64). The dispatcher checks the address again when it connects (DNS rebinding).
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
    if is_allowed(host, port, allowed_hosts):
        return url
    try:
        ipaddress.ip_address(host.strip("[]"))
        addrs = [host.strip("[]")]
    except ValueError:
        if not resolve:
            return url
        try:
            addrs = (resolver or system_resolver)(host, port or 80)
        except OSError as exc:
            raise UnsafeURL(f"host {host!r} of URL {url[:200]!r} does not resolve") from exc
    for addr in addrs:
        problem = unsafe_address(addr)
        if problem is not None:
            raise UnsafeURL(
                f"URL {url[:200]!r} points at a non-public address ({problem}); it is refused "
                "to prevent request forgery. Add the host to allowed_hosts if it is yours"
            )
    return url
