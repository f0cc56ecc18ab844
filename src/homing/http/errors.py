"""Errors of reliable HTTP messaging; each says what was wrong and what to do."""

from __future__ import annotations

from homing.errors import HomingError, InvalidArgument


class MessageFailed(HomingError):
    """The message will never complete: the receiver answered with a status that says so
    (501 or another of the sender's ``fatal_statuses``), or the job failed on the receiver.
    ``status`` and ``body`` are the receiver's answer (None if there was none)."""

    def __init__(self, message: str, *, msg_id: str, status: int | None, body: bytes | None):
        super().__init__(message)
        self.msg_id = msg_id
        self.status = status
        self.body = body


class DeadlineExceeded(MessageFailed):
    """The message's "absurd" deadline passed before it was delivered (or answered)."""


class UnsafeURL(InvalidArgument):
    """A URL given by a peer points somewhere homing will not call (request forgery guard)."""
