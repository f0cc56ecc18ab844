"""The receiver's background worker: polls the inbox for due Option 2 and job entries and
hands them, in batches, to a small thread pool (each batch one transaction). It also keeps
the set of entries being handled in this process, so that a put being served and its
retries are told apart (409). A thread of its own refreshes the receiver's retention
promise (``retention_queries``) and runs gc with the inbox retention."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from homing.database import Database
from homing.http._inbox import Inbox
from homing.store import http_inbox_queries as iq
from homing.store import http_queries as q
from homing.store import retention_queries as rq

log = logging.getLogger("homing.http")

_BATCH = 32  # Option-2/job messages handled per transaction by one inbox worker
GC_EVERY_S = rq.REFRESH_EVERY_S  # gc, and a refresh of the receiver's retention promise
UPKEEP_RETRY_S = 10.0


def gc(db: Database, *, older_than: float) -> tuple[int, int]:
    """Forget delivered outbox rows and handled inbox ids older than ``older_than`` seconds
    (never a dead letter, never an id a running receiver promised to remember longer).
    Returns (outbox rows, inbox rows) deleted. Run it with the inbox retention period."""
    now = db.clock.now()
    with db.store.transaction() as tx:
        return q.gc(tx, before=now - older_than, now=now)


def promise(db: Database, retention: float) -> None:
    """Record the retention this receiver tells its senders (``retention_queries.promise``), so
    that no gc of the store forgets their ids sooner."""
    with db.store.transaction() as tx:
        rq.promise(tx, rq.HTTP_INBOX, retention, now=db.clock.now())


class InboxWorker:
    def __init__(self, db: Database, inbox: Inbox, *, workers: int, retention: float) -> None:
        self.db = db
        self.inbox = inbox
        self.workers = workers
        self.retention = retention
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._upkeep_thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    # -- entries being handled in this process ---------------------------------------------
    def claim(self, msg_id: str) -> bool:
        """Mark ``msg_id`` as being handled here; False if it already is."""
        with self._lock:
            if msg_id in self._running:
                return False
            self._running.add(msg_id)
            return True

    def release(self, msg_ids: Iterable[str]) -> None:
        with self._lock:
            self._running.difference_update(msg_ids)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        try:  # before the first message: its sender is told the retention
            promise(self.db, self.retention)
            first_upkeep = GC_EVERY_S
        except Exception as exc:  # the store is down: the upkeep thread tries again soon
            log.warning("could not record the inbox retention (%s); retrying", exc)
            first_upkeep = UPKEEP_RETRY_S
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="homing-in")
        self._thread = threading.Thread(target=self._loop, name="homing-http-inbox", daemon=True)
        self._thread.start()
        # a thread of its own: a long handler batch in the loop must not hold up the
        # promise's refresh past its grace (retention_queries.PROMISE_GRACE_S)
        self._upkeep_thread = threading.Thread(
            target=self._keep_up, args=(first_upkeep,), name="homing-http-gc", daemon=True
        )
        self._upkeep_thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if self._upkeep_thread is not None:
            self._upkeep_thread.join(10)
            self._upkeep_thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def wake(self) -> None:
        self._wake.set()

    def _keep_up(self, first: float) -> None:
        """Every ``GC_EVERY_S`` until stopped: refresh this receiver's retention promise
        (``retention_queries``) and run gc; after a failure, again in ``UPKEEP_RETRY_S``."""
        wait = first
        while not self._stop.wait(wait):
            try:
                promise(self.db, self.retention)
                gc(self.db, older_than=self.retention)
                wait = GC_EVERY_S
            except Exception as exc:
                log.warning("inbox gc failed (%s); retrying in %gs", exc, UPKEEP_RETRY_S)
                wait = UPKEEP_RETRY_S

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.db.store.transaction(write=False) as tx:
                    due = iq.due_incoming(tx, now=self.db.clock.now(), limit=self.workers * _BATCH)
            except Exception as exc:
                log.warning("inbox poll failed: %s", exc)
                due = []
            due = [msg_id for msg_id in due if self.claim(msg_id)]
            assert self._pool is not None
            chunks = [due[i :: self.workers] for i in range(self.workers)]
            futures = [self._pool.submit(self._background, chunk) for chunk in chunks if chunk]
            for f in futures:
                f.result()
            if not due:
                self._wake.wait(0.1)
                self._wake.clear()

    def _background(self, msg_ids: list[str]) -> None:
        try:
            self.inbox.background(msg_ids, self._stop.wait)
        finally:
            self.release(msg_ids)
