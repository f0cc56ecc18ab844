"""Sender-side state: channels, pending messages, and the per-channel retransmission clock.

A channel is the stream of messages from this messenger to one destination (or back to one
peer of a listener). Its messages carry the epoch that the *receiver* granted; until a
grant arrives they wait. Transmitted messages sit in ``pending`` in the order of their last
transmission, so one scan from the front finds every message due for retransmission and
one timer per channel suffices (not one per message).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from homing.messenger.model import Route


@dataclass
class Channel:
    """Shared with the API threads: the id counter (memory mode) and the route."""

    name: str
    name_bytes: bytes
    route: Route
    next_id: int = 0
    stored: bool = False
    fresh: bool = True  # ids start at 1 in this session (not resumed from the store)


@dataclass(slots=True)
class Pending:
    channel: str
    message_id: int
    source_cb: int
    dest_cb: int
    body: bytes
    callback_name: str | None = None
    deadline: float | None = None  # time.monotonic()
    max_attempts: int | None = None
    attempts: int = 0
    last_tx: float = 0.0


@dataclass(slots=True)
class Out:
    """Owned by the I/O thread: a channel's epoch, window and retransmission state."""

    channel: Channel
    rto: float
    epoch: int | None = None
    nonce: int = 0
    requested_at: float = 0.0
    fenced: bool = False
    pending: dict[int, Pending] = field(default_factory=dict)  # transmitted, by last_tx
    waiting: deque[Pending] = field(default_factory=deque)  # not transmitted yet
    timer_due: float | None = None
    next_expiry: float | None = None
    last_ping: float = 0.0

    @property
    def route(self) -> Route:
        return self.channel.route

    def low(self) -> int:
        """The lowest id this session may still send (the receiver treats lower as seen)."""
        ids = [*self.pending, *(p.message_id for p in self.waiting)]
        return min(ids) if ids else self.channel.next_id + 1

    def unsend_all(self) -> None:
        """Put every transmitted message back in front of the waiting line, in id order."""
        back = sorted(self.pending.values(), key=lambda p: p.message_id)
        self.pending.clear()
        self.waiting.extendleft(reversed(back))
