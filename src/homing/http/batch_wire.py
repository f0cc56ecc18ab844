"""The wire format of a batch: many Option 2 messages to one receiver in one HTTP request.

A dispatcher with ``batch`` > 1 sends the Option 2 (``send``) messages that are due for
one homing receiver together: ``POST <receiver>/_homing/batch`` with
``Content-Type: application/x-homing-batch``. A receiver says that it takes batches, and
where, in the ``Homing-Batch`` header of its answers to Option 2 messages (a path on its
origin); a sender learns it from one ordinary delivery and never batches for a receiver
that did not say so.

The body is the messages one after the other, each as one line of JSON (its method,
target, headers and body length) followed by exactly that many bytes of body::

    {"method":"POST","target":"/hook/im","headers":{...},"length":123}\\n<123 bytes>

Each message carries the headers it would have carried alone (``Homing-Message-Id``,
``Homing-Mode: send``, ``Homing-Signature`` over its own method, target, headers and
body), so the receiver checks and stores it exactly as if it came alone: the same id
means the same message whether it came alone or in a batch, and a forged message in a
batch is refused like a forged request. The answer (200, JSON) has one result a message,
in order: ``{"results": [{"status": 204}, {"status": 422, "detail": "..."}]}``; each
status means what it would mean for that message alone (2xx: stored; the rest: retry or
fail it as the sender's policy says). A batch that cannot be read at all is answered
400 or 413 and every message in it is retried (or sent alone).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from homing._json import strict_loads
from homing.errors import InvalidArgument

BATCH_TYPE = "application/x-homing-batch"
BATCH_HEADER = "homing-batch"  # on a receiver's answers: the path it takes batches at
BATCH_PATH = "/batch"  # below the receiver's internal prefix (/_homing)
#: messages a receiver takes in one batch (more: 413, and the sender sends fewer)
MAX_BATCH_MESSAGES = 256
_MAX_META = 64 * 1024  # bytes of one message's JSON line (headers included)


class TooManyMessages(InvalidArgument):
    """A batch over the receiver's count of messages (413: send fewer a batch)."""


class BatchMessage(NamedTuple):
    method: str
    target: str  # path and query, as the sender signed them
    headers: dict[str, str]  # lower-case names
    body: bytes


def encode_batch(messages: Sequence[BatchMessage]) -> bytes:
    parts: list[bytes] = []
    for m in messages:
        meta = {"method": m.method, "target": m.target, "headers": m.headers, "length": len(m.body)}
        parts.append(json.dumps(meta, separators=(",", ":")).encode())
        parts.append(b"\n")
        parts.append(m.body)
    return b"".join(parts)


def decode_batch(data: bytes, *, max_messages: int, max_body: int) -> list[BatchMessage]:
    """The messages of a batch body; ``InvalidArgument`` says what is wrong with it."""
    messages: list[BatchMessage] = []
    at, end = 0, len(data)
    while at < end:
        if len(messages) >= max_messages:
            raise TooManyMessages(f"a batch holds at most {max_messages} messages")
        newline = data.find(b"\n", at, at + _MAX_META + 1)
        if newline < 0:
            raise InvalidArgument(
                f"message {len(messages)} of the batch: no JSON line of at most {_MAX_META} "
                "bytes ending in a newline"
            )
        try:
            meta = strict_loads(data[at:newline])
        except (InvalidArgument, ValueError) as exc:
            raise InvalidArgument(f"message {len(messages)} of the batch: {exc}") from exc
        message, length = _message(meta, len(messages), max_body)
        start = newline + 1
        if start + length > end:
            raise InvalidArgument(
                f"message {len(messages)} of the batch says {length} bytes of body but "
                f"{end - start} are left"
            )
        messages.append(message._replace(body=data[start : start + length]))
        at = start + length
    if not messages:
        raise InvalidArgument("the batch holds no message")
    return messages


def _message(meta: Any, index: int, max_body: int) -> tuple[BatchMessage, int]:
    where = f"message {index} of the batch"
    if not isinstance(meta, dict):
        raise InvalidArgument(f"{where}: its line must be a JSON object")
    method, target, headers, length = (
        meta.get("method"),
        meta.get("target"),
        meta.get("headers"),
        meta.get("length"),
    )
    if not isinstance(method, str) or not method.isalpha() or len(method) > 16:
        raise InvalidArgument(f"{where}: method must be an HTTP method name")
    if not isinstance(target, str) or not target.startswith("/") or len(target) > 8192:
        raise InvalidArgument(f"{where}: target must be a path starting with '/'")
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise InvalidArgument(f"{where}: headers must be an object of strings")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise InvalidArgument(f"{where}: length must be a byte count >= 0")
    if length > max_body:
        raise InvalidArgument(
            f"{where}: its body is {length} bytes, over this receiver's limit of {max_body}"
        )
    lowered = {k.lower(): v for k, v in headers.items()}
    return BatchMessage(method.upper(), target, lowered, b""), length


def encode_results(results: Sequence[Mapping[str, Any]]) -> bytes:
    return json.dumps({"results": list(results)}, separators=(",", ":")).encode()


def decode_results(data: bytes, count: int) -> list[tuple[int, str]]:
    """(status, detail) a message from a batch's answer; ``InvalidArgument`` if the
    answer is not one result for each of the ``count`` messages."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise InvalidArgument(f"the batch's answer is not JSON: {exc}") from exc
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or len(results) != count:
        raise InvalidArgument(f"the batch's answer does not hold {count} results")
    out: list[tuple[int, str]] = []
    for r in results:
        status = r.get("status") if isinstance(r, dict) else None
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise InvalidArgument("a result of the batch's answer has no HTTP status")
        detail = r.get("detail", "")
        out.append((status, detail if isinstance(detail, str) else ""))
    return out
