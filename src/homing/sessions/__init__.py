"""Queued request/reply with client sessions that recover after a crash (seed 004).

    sessions = Sessions(db)                       # db = homing.connect(url)
    session = sessions.open("client-42")          # created, or re-established
    request = session.submit("orders", {"sku": 7})          # Transactions 0 and 1
    Server(db, "orders", handle).run(stop)        # Transaction 2, elsewhere
    reply = session.take_reply(handler, timeout=5)          # Transaction 3
    report = session.recover()                    # states A, B, C, D after a crash

See docs/sessions.md.
"""

from homing.sessions._model import (
    ACTIONS,
    DuplicateRequest,
    NotDequeued,
    Recovery,
    Reply,
    Request,
    RequestNotFound,
    RequestRecord,
    RequestStatus,
    SessionFenced,
    SessionInfo,
    SessionNotFound,
    TooManyPrepared,
)
from homing.sessions.client import Session
from homing.sessions.manager import Sessions
from homing.sessions.server import Server

__all__ = [
    "ACTIONS",
    "DuplicateRequest",
    "NotDequeued",
    "Recovery",
    "Reply",
    "Request",
    "RequestNotFound",
    "RequestRecord",
    "RequestStatus",
    "Server",
    "Session",
    "SessionFenced",
    "SessionInfo",
    "SessionNotFound",
    "Sessions",
    "TooManyPrepared",
]
