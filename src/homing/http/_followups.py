"""Follow-ups of a delivered message: the confirmation ``DELETE`` of a stored response,
and status checks of an accepted job, which fetch a result the receiver could not deliver
to our reply node (a wrong ``local_url``, a reply node of another store) instead of
leaving the caller waiting for the absurd deadline."""

from __future__ import annotations

import base64
import functools
import json
import logging
from typing import TYPE_CHECKING, Any

from homing.http import wire
from homing.http._client import HttpError
from homing.http._endpoints import origin
from homing.http._waiters import notify_changed
from homing.store import http_queries as q
from homing.store.protocol import Tx

if TYPE_CHECKING:
    from homing.http.dispatcher import Clients, Dispatcher

log = logging.getLogger("homing.http")


async def confirm(d: Dispatcher, clients: Clients, row: q.OutboxRow, url: str, token: str) -> None:
    """Send the signed confirmation ``DELETE`` of a stored response (only an ack)."""
    msg_id = row.id
    client = clients.trusted if origin(url) == origin(row.url) else clients.guarded
    headers = {wire.MESSAGE_ID: msg_id}
    d._sign(headers, "DELETE", url, b"")
    try:
        resp = await client.delete(url, headers=headers)
        ok = resp.status_code < 500 and resp.status_code not in (408, 429)
        error = f"DELETE {url} answered {resp.status_code}"
    except HttpError as exc:
        ok, error = False, f"DELETE {url}: {type(exc).__name__}: {exc}"
    d.stats["deletes"] += 1
    assert d._group is not None
    await d._group.run(functools.partial(_confirm_outcome, d, msg_id, token, ok, error))


async def check_job(d: Dispatcher, clients: Clients, row: q.OutboxRow, token: str) -> None:
    """Ask the receiver how an accepted job went; a result it could not deliver to our
    reply node is taken from its answer, so the caller is not left waiting."""
    assert row.status_url is not None
    client = clients.trusted if origin(row.status_url) == origin(row.url) else clients.guarded
    headers = {wire.MESSAGE_ID: row.id}
    d._sign(headers, "GET", row.status_url, b"")
    result: dict[str, Any] | None = None
    try:
        resp = await client.get(row.status_url, headers=headers)
        if resp.status_code == 200:
            found = json.loads(resp.content).get("result")
            if isinstance(found, dict) and found.get("state") == "failed":
                result = found
    except (HttpError, ValueError, AttributeError) as exc:
        log.info("status check of job %s failed: %s", row.id, exc)
    assert d._group is not None
    await d._group.run(functools.partial(_job_checked, d, row, token, result))
    if result is not None:
        notify_changed(row.id)


def _job_checked(
    d: Dispatcher, row: q.OutboxRow, token: str, result: dict[str, Any] | None, tx: Tx
) -> None:
    now = d.db.clock.now()
    if result is not None:
        try:
            body = base64.b64decode(str(result.get("body", "")), validate=True)
            status = int(result.get("status") or 200)
            ctype = str(result.get("content_type") or wire.BYTES_TYPE)
        except (ValueError, TypeError) as exc:
            log.warning("job %s: malformed result in the status answer: %s", row.id, exc)
        else:
            q.record_job_result(tx, row.id, now=now, status=status, content_type=ctype, body=body)
            return
    # still running (or unknown): look again later, less and less often
    wait = min(3600.0, max(d.job_check, (now - row.created_at) / 2))
    q.check_later(tx, row.id, token, at=now + wait)


def _confirm_outcome(d: Dispatcher, msg_id: str, token: str, ok: bool, error: str, tx: Tx) -> None:
    if ok:
        q.confirm_done(tx, msg_id, token)
        return
    row = q.outgoing(tx, msg_id)
    now = d.db.clock.now()
    if row is None or now > row.deadline:  # give up: the DELETE is only an ack
        q.confirm_done(tx, msg_id, token)
        return
    at = now + d.retry.delay(row.attempts)
    q.confirm_retry(tx, msg_id, token, at=at, error=error)
