"""Storing the receiver's new messages in its group commit, a batch at a time.

Each Option 2 or job request becomes a ``Receipt`` (a write for ``GroupCommit``). The
batch's hooks store all of its receipts first (``iq.insert_received``: one statement on
PostgreSQL), then each receipt runs: a duplicate reads the entry it repeats, a message
whose node's handler has proved short gets its first attempt at once (``Inbox.
at_receipt``), and before the commit the handled ones are marked done together
(``iq.finish_handled``). So a batch of N new messages costs two statements plus a
savepoint per handled message, and one commit: entries, the handlers' writes and the
done marks, or none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from homing._failpoints import failpoint
from homing.database import Database
from homing.http._inbox import UNPARSED, Inbox
from homing.store import http_inbox_queries as iq
from homing.store import http_queries as q
from homing.store.protocol import Tx


class Handled:
    """What a receipt returns when its message got its first attempt in the batch."""


HANDLED = Handled()


class Receipt:
    """One new request to store (``row``), and to handle at once when ``handle``;
    ``value``: its body as the handler sees it, when the receiver parsed it already (a
    JSON body, checked before anything is stored), so that it is not parsed twice."""

    __slots__ = ("db", "inbox", "row", "handle", "value", "stored", "done")

    def __init__(
        self, db: Database, inbox: Inbox, row: q.InboxRow, handle: bool, value: Any = UNPARSED
    ) -> None:
        self.db = db
        self.inbox = inbox
        self.row = row
        self.handle = handle
        self.value = value
        self.stored = False  # set by the batch's begin, in the same transaction
        self.done: list[str] = []

    def __call__(self, tx: Tx) -> q.InboxRow | Handled | None:
        """None: stored (the background handles it); ``HANDLED``: stored and attempted;
        an ``InboxRow``: the id was known, this is the entry it names."""
        if not self.stored:
            return iq.incoming(tx, self.row.id)
        if not self.handle:
            return None
        self.inbox.at_receipt(self.db.bind(tx), self.row, self.done, self.value)
        failpoint("http.receiver.at_receipt_before_commit")
        return HANDLED


class ReceiptBatch:
    """``GroupCommit`` hooks: store a batch's receipts in one go, mark its handled ones
    done in one go."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def begin(self, tx: Tx, fns: list[Callable[[Tx], Any]]) -> list[str]:
        receipts = [fn for fn in fns if isinstance(fn, Receipt)]
        done: list[str] = []
        if receipts:
            flags = iq.insert_received(tx, [r.row for r in receipts])
            for receipt, stored in zip(receipts, flags, strict=True):
                receipt.stored = stored
                receipt.done = done
        return done

    def end(self, tx: Tx, done: list[str]) -> None:
        iq.finish_handled(tx, done, now=self.db.clock.now())
