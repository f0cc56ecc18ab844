"""The queue engine (seed 001): queues and selectors as a directed graph in the store.

MOVE selectors use credit-based flow control (one credit = one message; an ack pays the
credit back, and payment flows up the graph), COPY selectors none. Limits, dead letters,
BOUNCE and self-destructive queues follow the seed; see docs/engine.md.
"""

from homing.engine.core import DEAD_LETTERS, Engine
from homing.engine.model import (
    Delivery,
    GraphCycle,
    Message,
    MessageNotFound,
    Published,
    QueueFull,
    QueueInfo,
    QueueNotFound,
    SelectorInfo,
    SelectorNotFound,
)
from homing.engine.rules import InvalidRule

__all__ = [
    "DEAD_LETTERS",
    "Delivery",
    "Engine",
    "GraphCycle",
    "InvalidRule",
    "Message",
    "MessageNotFound",
    "Published",
    "QueueFull",
    "QueueInfo",
    "QueueNotFound",
    "SelectorInfo",
    "SelectorNotFound",
]
