"""The receiver's batch endpoint: many Option 2 messages in one request (``batch_wire``).

Each message of a batch is checked as if it came alone (its node, its id, its mode, its
signature, strict JSON) and stored through the receiver's group commit like any other
(``Receipt``), so a batch of N costs one request and (up to ``GroupCommit.max_batch``
messages) one commit, where N requests cost N request cycles. The answer holds one status
a message, meaning what it would mean alone; a batch that cannot be read is refused whole
(400/413) and nothing in it is stored.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from homing import ids
from homing._failpoints import failpoint
from homing.errors import InvalidArgument
from homing.http import _ingress, batch_wire, wire
from homing.http._inbox import Refused
from homing.http._receipt import Handled, Receipt
from homing.store import http_queries as q

if TYPE_CHECKING:
    from homing.http.receiver import Receiver

#: bytes a batch may hold in all (its messages each stay within the receiver's max_body)
MAX_BATCH_BYTES = 8 * 1024 * 1024


def batch_path(root_path: str) -> str:
    """Where a receiver mounted at ``root_path`` takes batches (its ``Homing-Batch``)."""
    return f"{root_path}{wire.INTERNAL}{batch_wire.BATCH_PATH}"


def node_path(target: str, root_path: str) -> str:
    """The node a message's target names, below the receiver's mount point."""
    path = target.split("?", 1)[0]
    if root_path and path.startswith(root_path):
        path = path[len(root_path) :]
    return path or "/"


def checked_row(
    receiver: Receiver, message: batch_wire.BatchMessage, root_path: str
) -> tuple[q.InboxRow, bool, Any]:
    """The inbox row of one message of a batch, whether to handle it at receipt, and its
    body as the handler sees it; ``Refused`` with the status it would have got alone."""
    path = node_path(message.target, root_path)
    if path not in receiver._nodes:
        raise Refused(404, f"no reliable node at {path[:200]!r} on this receiver")
    if message.method not in wire.METHODS:
        raise Refused(405, f"method {message.method[:16]} is not one a node takes")
    headers = message.headers
    msg_id = headers.get(wire.MESSAGE_ID)
    if msg_id is None or not ids.is_uuid(msg_id):
        raise Refused(400, "a message in a batch needs a Homing-Message-Id (a canonical UUID)")
    if headers.get(wire.MODE, "put").lower() != "send":
        raise Refused(400, "a batch carries only Homing-Mode send messages; send others alone")
    if receiver.secrets is not None:
        problem = wire.verify(
            headers.get(wire.SIGNATURE),
            receiver.secrets,
            message.method,
            message.target,
            headers,
            message.body,
            now=time.time(),
            window=receiver.signature_window,
        )
        if problem is not None:
            raise Refused(401, problem)
    elif receiver.webhook_secrets:
        raise Refused(401, "this receiver takes Standard Webhooks-signed requests only")
    ctype = headers.get("content-type", wire.BYTES_TYPE)
    value: Any = message.body  # what the handler gets: the body, parsed if JSON
    if wire.is_json_type(ctype):
        try:
            value = wire.strict_json(message.body)
        except InvalidArgument as exc:
            raise Refused(400, str(exc)) from exc
    # the same digest as the message would have had alone: a repeat is known either way
    digest = _ingress.body_digest(message.method, path, ctype, message.body)
    row = receiver._new_row(msg_id, path, "send", digest, ctype, message.body, None)
    return row, receiver.inbox.at_receipt_for(path), value


async def receive_batch(receiver: Receiver, request: Request) -> Response:
    headers = receiver._headers()
    try:
        body = await _ingress.read_body(request, max(MAX_BATCH_BYTES, receiver.max_body))
        messages = batch_wire.decode_batch(
            body, max_messages=batch_wire.MAX_BATCH_MESSAGES, max_body=receiver.max_body
        )
    except Refused as exc:
        return _ingress.problem(exc.status, str(exc), **headers)
    except batch_wire.TooManyMessages as exc:
        return _ingress.problem(413, str(exc), **headers)
    except InvalidArgument as exc:
        return _ingress.problem(400, str(exc), **headers)
    except ClientDisconnect:
        return Response(status_code=400)
    root = str(request.scope.get("root_path", ""))
    results: list[dict[str, Any]] = [{} for _ in messages]  # each set below
    rows: list[tuple[int, q.InboxRow]] = []
    receipts: list[Receipt] = []
    for i, message in enumerate(messages):
        try:
            row, handle, value = checked_row(receiver, message, root)
        except Refused as exc:
            receiver.stats["refused"] += 1
            results[i] = {"status": exc.status, "detail": str(exc)}
            continue
        rows.append((i, row))
        receipts.append(Receipt(receiver.db, receiver.inbox, row, handle, value))
    group = receiver._group()
    outcomes = await asyncio.gather(*(group.run(r) for r in receipts), return_exceptions=True)
    stored = False
    for (i, row), outcome in zip(rows, outcomes, strict=True):
        results[i] = _result(receiver, row, outcome)
        stored = stored or outcome is None
    failpoint("http.receiver.batch_after_inbox_insert")
    if stored:
        receiver._worker.wake()
    headers[batch_wire.BATCH_HEADER] = batch_path(root)
    return Response(
        batch_wire.encode_results(results),
        status_code=200,
        media_type="application/json",
        headers=headers,
    )


def _result(receiver: Receiver, row: q.InboxRow, outcome: Any) -> dict[str, Any]:
    if outcome is None or isinstance(outcome, Handled):
        receiver.stats["received"] += 1
        return {"status": 204}
    if isinstance(outcome, BaseException):
        return {
            "status": 503,
            "detail": f"the receiver could not store the message ({type(outcome).__name__})",
        }
    receiver.stats["duplicates"] += 1
    if outcome.body_hash != row.body_hash or outcome.mode != row.mode:
        return {"status": 422, "detail": _ingress.reused_id(row.id)}
    return {"status": 204}
