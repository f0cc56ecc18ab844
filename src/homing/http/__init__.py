"""Reliable HTTP messaging (seed 000): exactly-once requests between stores over HTTP.

``Sender`` (``put`` / ``send`` / ``perform_job``, and ``AsyncSender``) stores each request
in a durable outbox; a ``Dispatcher`` delivers it with retries until acknowledged; a
``Receiver`` (a Starlette app) drops repeats by message id in its durable inbox and runs the
handler in the transaction that marks the message done.
"""

from homing.http._async_sender import AsyncSender
from homing.http.dispatcher import Dispatcher
from homing.http.errors import DeadlineExceeded, MessageFailed, UnsafeURL
from homing.http.policy import DEFAULT_FATAL_STATUSES, WEBHOOK_SCHEDULE, EndpointLimit, RetryPolicy
from homing.http.receiver import Handler, Receiver, gc
from homing.http.sender import Pending, Response, Sender
from homing.http.wire import BadJSON

__all__ = [
    "DEFAULT_FATAL_STATUSES",
    "AsyncSender",
    "BadJSON",
    "DeadlineExceeded",
    "EndpointLimit",
    "Dispatcher",
    "Handler",
    "MessageFailed",
    "Pending",
    "Receiver",
    "Response",
    "RetryPolicy",
    "Sender",
    "UnsafeURL",
    "WEBHOOK_SCHEDULE",
    "gc",
]
