"""The seed's recovery states A-D of a client's requests, from their stored rows."""

from __future__ import annotations

from typing import Any

from homing.errors import InvalidArgument
from homing.sessions._model import ACTIONS, MEANINGS, Reply, RequestStatus, State, decode


def reply_of(row: dict[str, Any]) -> Reply:
    return Reply(
        request_id=str(row["id"]),
        queue=str(row["queue"]),
        request=decode(row["body"]),
        body=decode(row["reply"]),
        error=row["reply_error"],
        replied_at=float(row["replied_at"]),
        taken_at=None if row["taken_at"] is None else float(row["taken_at"]),
    )


def make_status(
    request_id: str,
    state: State,
    queue: str | None,
    body: Any,
    reply: Reply | None = None,
    note: str | None = None,
) -> RequestStatus:
    meaning = MEANINGS[state] + (f" ({note})" if note else "")
    return RequestStatus(request_id, state, ACTIONS[state], meaning, queue, body, reply)


def row_status(row: dict[str, Any]) -> RequestStatus:
    state: State = {"queued": "B", "replied": "C", "taken": "D"}[row["state"]]  # type: ignore[assignment]
    reply = reply_of(row) if state in ("C", "D") else None
    return make_status(str(row["id"]), state, str(row["queue"]), decode(row["body"]), reply)


def last_status(
    client_id: str, s: dict[str, Any], last_id: str, row: dict[str, Any] | None, client_kept: bool
) -> RequestStatus:
    """The state of the client's last request by the seed's rules (see ``Session.recover``)."""
    if row is not None and row["client_id"] != client_id:
        raise InvalidArgument(f"request {last_id!r} belongs to another client, not {client_id!r}")
    if last_id != s["last_enqueued_id"] and row is None:
        own = s["last_request_id"] == last_id and not client_kept
        return make_status(
            last_id,
            "A",
            s["last_request_queue"] if own else None,
            decode(s["last_request_body"]) if own else None,
        )
    if last_id == s["last_dequeued_id"]:
        return make_status(
            last_id,
            "D",
            None if row is None else str(row["queue"]),
            None if row is None else decode(row["body"]),
            None if row is None else reply_of(row),
        )
    if row is None:  # enqueued once, and its record has passed the retention period
        return make_status(last_id, "D", None, None, None, "its record passed the retention")
    return row_status(row)
