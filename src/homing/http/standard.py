"""Standard Webhooks (standardwebhooks.com) signing and verification, both ways.

A request carries ``webhook-id``, ``webhook-timestamp`` (unix seconds) and
``webhook-signature``: space-separated ``v1,<base64 HMAC-SHA256 of id.timestamp.body>``,
one per secret while keys rotate. Secrets are ``whsec_<base64 key>`` strings (the key bytes
are the base64-decoded part), as Svix and the reference ``standardwebhooks`` package use.
homing's sender signs this way when given ``webhook_secrets``; homing's receiver verifies it
and uses ``webhook-id`` as the message id, so a replayed delivery is dropped by the inbox.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence

from homing.errors import InvalidArgument

WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"
PREFIX = "whsec_"
#: Longest webhook-id accepted (Svix ids are ~30 characters).
MAX_ID = 255


def secret_key(secret: str | bytes) -> bytes:
    """The HMAC key of a ``whsec_...`` secret (raw bytes are taken as the key itself)."""
    if isinstance(secret, bytes):
        if not secret:
            raise InvalidArgument("a Standard Webhooks secret must not be empty")
        return secret
    text = secret[len(PREFIX) :] if secret.startswith(PREFIX) else secret
    text += "=" * (-len(text) % 4)  # unpadded base64 is common in whsec_ secrets
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(
            "a Standard Webhooks secret must be 'whsec_' followed by base64 (as the "
            f"standardwebhooks and svix packages make them): {exc}"
        ) from exc
    if not key:
        raise InvalidArgument("a Standard Webhooks secret must not be empty")
    return key


def _signature(key: bytes, msg_id: str, ts: str, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def sign_headers(
    secrets: Sequence[str | bytes], msg_id: str, body: bytes, now: float
) -> dict[str, str]:
    """The three ``webhook-*`` headers, one ``v1`` signature per secret (key rotation)."""
    ts = str(int(now))
    sigs = " ".join(f"v1,{_signature(secret_key(s), msg_id, ts, body)}" for s in secrets)
    return {WEBHOOK_ID: msg_id, WEBHOOK_TIMESTAMP: ts, WEBHOOK_SIGNATURE: sigs}


def verify(
    headers: Mapping[str, str],
    secrets: Iterable[str | bytes],
    body: bytes,
    *,
    now: float,
    tolerance: float = 300.0,
) -> str | None:
    """None if the request is signed by one of ``secrets`` within ``tolerance`` seconds;
    otherwise what is wrong (for a 401)."""
    msg_id = headers.get(WEBHOOK_ID, "")
    ts = headers.get(WEBHOOK_TIMESTAMP, "")
    header = headers.get(WEBHOOK_SIGNATURE, "")
    if not msg_id or not header:
        return "the webhook is not signed: webhook-id and webhook-signature are required"
    if not ts.isdigit():
        return "webhook-timestamp must be unix seconds"
    if abs(now - int(ts)) > tolerance:
        return (
            f"webhook-timestamp is {abs(now - int(ts)):.0f}s away from the receiver's clock "
            f"(tolerance {tolerance:g}s); check the clocks and sign afresh"
        )
    given = [p.split(",", 1)[1] for p in header.split() if p.startswith("v1,")]
    for secret in secrets:
        want = _signature(secret_key(secret), msg_id, ts, body)
        if any(hmac.compare_digest(want, g) for g in given):
            return None
    return "no webhook-signature matches (v1, HMAC-SHA256 of id.timestamp.body); check the secret"
