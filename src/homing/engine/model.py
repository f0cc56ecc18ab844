"""The engine's public data types and errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from homing.errors import HomingError, InvalidArgument, NotFound


class QueueNotFound(NotFound):
    """No queue has this name; nothing was changed."""


class SelectorNotFound(NotFound):
    """The queue has no selector of this name; nothing was changed."""


class MessageNotFound(NotFound):
    """No message entry has this sequence number (any more); nothing was changed."""


class QueueFull(HomingError):
    """The queue is at its limit of unprocessed messages and rejects new ones; nothing was stored."""


class GraphCycle(InvalidArgument):
    """The selector would close a loop in the queue graph, so messages could circle forever."""


EntryState = Literal["ready", "outstanding", "done"]


@dataclass(frozen=True)
class QueueInfo:
    """A queue and its depths: ``ready`` unprocessed, ``outstanding`` given to a selector and
    not yet paid for, ``done`` kept as history; ``discarded`` counts messages dropped.
    ``max_deliveries`` bounds how often a message is taken before it is dead-lettered,
    ``message_ttl`` how long (s) a message may wait unprocessed, ``expires`` how long (s)
    the queue may stay unused (no selectors, no publishes) before it deletes itself."""

    name: str
    dead_letter: str | None
    max_unprocessed: int | None
    on_overflow: str
    max_history: int | None
    self_destruct: bool
    discarded: int
    created_at: float
    ready: int = 0
    outstanding: int = 0
    done: int = 0
    max_deliveries: int | None = None
    message_ttl: float | None = None
    expires: float | None = None


@dataclass(frozen=True)
class SelectorInfo:
    """A selector: ``credits`` held now, ``granted`` in total; the difference is the number
    of messages it has outstanding (given to its destination, not yet paid for)."""

    queue: str
    name: str
    mode: str  # move | copy | bounce
    role: str  # normal | default | overflow
    match: dict[str, Any]
    dest_kind: str  # queue | consumer | job | bounce
    dest: str | None
    credits: int
    granted: int
    seen_at: float | None = None  # a consumer's last take (absent after consumer_timeout)


@dataclass(frozen=True)
class Message:
    """One message in one queue (an *entry*).

    ``body`` is ``bytes`` if it was published as bytes, otherwise the decoded JSON value.
    ``seq`` is the store sequence number of this entry; ``id`` the message's UUIDv7, kept
    when the message moves or is copied. ``address`` is where it is addressed now; after a
    BOUNCE, ``original_address`` keeps where it was first sent. ``reason`` says why a
    dead letter is one; ``deaths`` is its death history, newest first, as RabbitMQ's
    ``x-death``: one dict per (queue, reason) with ``count``, ``time`` (first) and ``last``.
    ``expires_at`` is when it expires if still unprocessed (its queue's ``message_ttl``).
    """

    seq: int
    id: str
    queue: str
    state: EntryState
    headers: dict[str, Any]
    body: Any
    address: str
    return_address: str | None
    original_address: str | None
    reason: str | None
    consumer: str | None
    job: str | None
    attempts: int
    created_at: float
    deaths: list[dict[str, Any]] = field(default_factory=list)
    expires_at: float | None = None


@dataclass(frozen=True)
class Delivery:
    """A message leased to a consumer by ``take``; hand it back to ``ack`` (pay) or ``nack``."""

    message: Message
    lease_token: str
    lease_until: float

    @property
    def seq(self) -> int:
        return self.message.seq

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def headers(self) -> dict[str, Any]:
        return self.message.headers

    @property
    def body(self) -> Any:
        return self.message.body


@dataclass(frozen=True)
class Published:
    """What ``publish`` did: ``outcome`` is routed, held, processed, discarded or
    dead-lettered; ``duplicate`` is true when the id had been published before (nothing new
    was stored and the first outcome is reported)."""

    id: str
    queue: str
    seq: int | None
    outcome: str
    duplicate: bool = False
