"""homing.messenger: ZeroMQ messaging with callbacks, retries and duplicate suppression (seed 003).

``Messenger.send(destination, message, callback)`` buffers a message and returns at once;
``Messenger.listen(endpoint, server_loop_callback)`` attaches a server-loop callback (SLC)
to a ``tcp://``, ``ipc://`` or ``inproc://`` endpoint. Replies invoke the message-specific
callback (MSC) given to ``send``; the messenger runs the MSC before the SLC. With a store
(``Messenger(name, db=homing.connect(url))``) pending messages and seen ids are durable.
Given-up messages reach the MSC as a ``Failure`` and stay as ``DeadLetter`` records.
"""

from homing.messenger.core import Messenger
from homing.messenger.durable import collect_garbage
from homing.messenger.model import (
    NOOP,
    Curve,
    DeadLetter,
    Failure,
    Incoming,
    MessengerError,
    MessengerFenced,
    Route,
)
from homing.messenger.seen import SeenSet, is_first_time
from homing.messenger.wire import FrameError

__all__ = [
    "NOOP",
    "Curve",
    "DeadLetter",
    "Failure",
    "FrameError",
    "Incoming",
    "Messenger",
    "MessengerError",
    "MessengerFenced",
    "Route",
    "SeenSet",
    "collect_garbage",
    "is_first_time",
]
