"""The dispatcher's tombstones, written many per commit: the deliveries that finish while
one commit is in flight are tombstoned together in the next (``GroupCommit``), in one
statement on PostgreSQL (``http_queries.mark_delivered_many``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from homing.store import http_queries as q
from homing.store.protocol import Tx

if TYPE_CHECKING:
    from homing.http.dispatcher import Dispatcher


class TombstoneWrite:
    """One delivered message's tombstone, for ``GroupCommit``: written by the batch's
    ``begin`` (``TombstoneBatch``); returns whether it was stored (False: the row was no
    longer pending under this claim)."""

    __slots__ = (
        "row",
        "token",
        "state",
        "status",
        "content_type",
        "body",
        "confirm_url",
        "status_url",
        "stored",
    )

    def __init__(
        self,
        row: q.OutboxRow,
        token: str,
        state: str,
        status: int,
        content_type: str | None,
        body: bytes | None,
        confirm_url: str | None,
        status_url: str | None,
    ) -> None:
        self.row = row
        self.token = token
        self.state = state
        self.status = status
        self.content_type = content_type
        self.body = body
        self.confirm_url = confirm_url
        self.status_url = status_url
        self.stored = False

    def stone(self, now: float, job_check: float) -> q.Tombstone:
        check_at = now + job_check if self.status_url else None
        return q.Tombstone(
            self.row.id,
            self.token,
            self.state,
            self.status,
            self.content_type,
            self.body,
            self.confirm_url,
            self.status_url,
            now if self.confirm_url else check_at,
        )

    def __call__(self, tx: Tx) -> bool:
        return self.stored  # written in this transaction by TombstoneBatch.begin


class TombstoneBatch:
    """``GroupCommit`` hooks of the dispatcher: a batch's tombstones in one go (a message
    met twice in one batch: its repeat after the first, alone)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def begin(self, tx: Tx, fns: list[Callable[[Tx], Any]]) -> None:
        writes = [fn for fn in fns if isinstance(fn, TombstoneWrite)]
        if not writes:
            return
        d = self.dispatcher
        now = d.db.clock.now()
        for url in dict.fromkeys(w.row.url for w in writes):
            d.endpoints.ok(tx, url)
        firsts: dict[str, TombstoneWrite] = {}
        repeats: list[TombstoneWrite] = []
        for w in writes:
            if w.row.id in firsts:
                repeats.append(w)
            else:
                firsts[w.row.id] = w
        stored = q.mark_delivered_many(
            tx, [w.stone(now, d.job_check) for w in firsts.values()], now=now
        )
        for w in firsts.values():
            w.stored = w.row.id in stored
        for w in repeats:
            w.stored = bool(q.mark_delivered_many(tx, [w.stone(now, d.job_check)], now=now))

    def end(self, tx: Tx, state: Any) -> None:
        pass
