"""Data types, errors and input checks of ``homing.sessions``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from homing.errors import InvalidArgument, InvalidState, NotFound
from homing.jobs import encode_json

DEFAULT_KEEP_REPLIES = 100
DEFAULT_RETENTION_S = 30 * 24 * 3600.0
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_KEEP_REPLIES = 100_000
MAX_PREPARED = 1000
DEFAULT_SESSION_TTL_S = 30 * 24 * 3600.0
_MAX_NAME = 200

State = Literal["A", "B", "C", "D"]

# The seed's four states and what the client should do in each.
ACTIONS: dict[str, str] = {
    "A": "resubmit_or_drop",
    "B": "wait",
    "C": "process_reply",
    "D": "continue",
}
MEANINGS: dict[str, str] = {
    "A": "Transaction 1 did not commit: the request was never submitted",
    "B": "submitted, not yet executed: wait for the reply",
    "C": "executed, reply not yet processed: process the reply now",
    "D": "the reply was processed: the request is done",
}


# -- errors ------------------------------------------------------------------------------
class SessionNotFound(NotFound):
    """No session exists for this client id; open one first (``Sessions.open``)."""


class RequestNotFound(NotFound):
    """No request has this id: it was never submitted, or its retention period passed."""


class DuplicateRequest(InvalidState):
    """A request with this id was submitted already; nothing was enqueued a second time."""


class SessionFenced(InvalidState):
    """Another process opened this client's session after this one (a newer epoch): this
    handle may no longer act for the client. Open the session again to take it back."""


class TooManyPrepared(InvalidState):
    """The session holds ``MAX_PREPARED`` prepared-but-unsubmitted requests already:
    enqueue, resubmit or drop some first."""


class NotDequeued(InvalidState):
    """A reply confirmation named a request whose reply this client never dequeued."""


# -- records -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """A request the client constructed: id, target queue and JSON body."""

    id: str
    queue: str
    body: Any


@dataclass(frozen=True)
class Reply:
    """A reply taken from the client's private reply queue (Transaction 3).

    ``error`` is set (and ``body`` None) when the server gave up on the request: its
    handler raised ``PermanentFailure`` or failed ``max_attempts`` times.
    """

    request_id: str
    queue: str
    request: Any
    body: Any
    error: str | None
    replied_at: float
    taken_at: float | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class RequestStatus:
    """One request as ``recover()`` sees it: the seed's state, and what to do about it."""

    request_id: str
    state: State
    action: str
    meaning: str
    queue: str | None
    body: Any
    reply: Reply | None = None


@dataclass(frozen=True)
class Recovery:
    """What the queue manager knows of a client after a failure (seed 004, section 4.3).

    ``last`` is the state of the client's last request (``None`` if it never made one);
    ``requests`` has a state for every request the session still remembers: unfinished
    ones (B, C; a dead request is C with ``reply.error`` set), the last n replies taken
    and not yet confirmed (D), and every prepared-but-unsubmitted request (A).
    """

    client_id: str
    last_request_id: str | None
    last_enqueued_id: str | None
    last_dequeued_id: str | None
    last: RequestStatus | None
    requests: list[RequestStatus] = field(default_factory=list)

    def in_state(self, state: State) -> list[RequestStatus]:
        return [r for r in self.requests if r.state == state]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SessionInfo:
    """The persistent session of one client, as stored by the queue manager."""

    client_id: str
    created_at: float
    reconnected_at: float
    connects: int
    keep_replies: int
    last_request_id: str | None
    last_enqueued_id: str | None
    last_dequeued_id: str | None
    unfinished: list[str]
    dequeued: list[str]
    epoch: int = 0
    active_at: float | None = None
    prepared: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestRecord:
    """Everything kept about a past request, for lookups (the seed's auditability point)."""

    id: str
    client_id: str
    queue: str
    state: str  # queued | replied | taken
    body: Any
    reply: Any
    error: str | None
    attempts: int
    last_error: str | None
    server: str | None
    created_at: float
    replied_at: float | None
    taken_at: float | None
    confirmed_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- input checks ------------------------------------------------------------------------
def check_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(
            f"{what} {value[:50]!r} must be at most {_MAX_NAME} printable characters"
        )
    return value


def check_ids(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidArgument(f"request_ids must be a list of request ids, got {value!r}")
    ids = [check_name("request id", v) for v in value]
    if len(ids) > 10_000:
        raise InvalidArgument(f"at most 10000 request ids at once, got {len(ids)}")
    return list(dict.fromkeys(ids))


def check_keep(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_KEEP_REPLIES:
        raise InvalidArgument(
            f"keep_replies must be an integer from 1 to {MAX_KEEP_REPLIES}, got {value!r}"
        )
    return value


def encode_body(what: str, body: Any, limit: int) -> str:
    return encode_json(body, limit, what=what, setting="max_body_bytes")


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def no_session(client_id: str) -> SessionNotFound:
    return SessionNotFound(
        f"no session for client {client_id!r}; open one with Sessions.open(client_id) "
        "(POST /clients/{client_id}/session over HTTP)"
    )
