"""What a handler gets besides the job (``ctx``): its transaction, ``replace``,
``on_complete`` and whether the lease is still held."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import traceback
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from homing.database import Transaction
from homing.errors import InvalidArgument, InvalidState, JobCancelled, JobTimedOut, StaleLease
from homing.jobs import Job, JobSpec
from homing.worker.handler import Handler

if TYPE_CHECKING:
    from homing.worker.runtime import Worker


class LeaseLost(StaleLease):
    """The worker lost the job's lease (another worker holds it, or it was released at
    shutdown); the handler's transaction was rolled back and the job was not completed here."""


def lost_label(exc: BaseException | None) -> str:
    """The outcome a refused completion counts as: cancelled, timed_out or lease_lost."""
    if isinstance(exc, JobCancelled):
        return "cancelled"
    if isinstance(exc, JobTimedOut):
        return "timed_out"
    return "lease_lost"


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_tb(exc.__traceback__, limit=-8)) if exc.__traceback__ else ""
    return text + ("\n" + tb if tb else "")


class JobContext:
    """What a handler gets besides the job: its transaction, replace, and the lease state.

    ``ctx.connection`` / ``ctx.transaction`` open (on first use) the transaction in which the
    job will be completed: writes made through it commit atomically with the completion, or
    not at all. On SQLite that transaction holds the database's single write lock until the
    handler returns, so do slow work (network calls) *before* the first use.
    """

    def __init__(self, worker: Worker, job: Job, handler: Handler) -> None:
        self.job = job
        self.handler = handler
        self.attempt = job.attempts
        self.worker_id = worker.worker_id
        self.phase = "queued"  # queued | running | completing | done
        self.started = 0.0
        self._worker = worker
        self._stack: ExitStack | None = None
        self._tx: Transaction | None = None
        self._children: list[JobSpec | tuple[str, Any]] | None = None
        self._on_complete: list[Callable[[Transaction], Any]] = []
        # set once, from another thread (heartbeat, watcher, timer): a flag, not an Event,
        # which costs a Condition and a lock per job and is never waited on
        self._lost = False
        self._lost_reason = ""
        self.lost_kind = "lease_lost"  # or "cancelled", "timed_out"
        self.deadline: float | None = None  # store-clock time this attempt must end by
        self._timer: threading.Timer | None = None
        self._runner_ident: int | None = None
        self._requests: queue.SimpleQueue[Any] | None = None
        self._task: asyncio.Task[Any] | None = None

    # -- the lease -------------------------------------------------------------------------
    @property
    def lease_lost(self) -> bool:
        """True once this worker no longer holds the job; the handler should stop early."""
        return self._lost

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled (``db.cancel``): stop early; its completion is
        refused anyway. An async handler is cancelled (``asyncio.CancelledError``)."""
        return self._lost and self.lost_kind == "cancelled"

    @property
    def timed_out(self) -> bool:
        """True once this attempt ran past its timeout (the job was failed, retryable)."""
        return self._lost and self.lost_kind == "timed_out"

    def _mark_lost(self, reason: str, kind: str = "lease_lost") -> None:
        if self._lost:
            return
        self._lost_reason = reason
        self.lost_kind = kind
        self._lost = True
        task, loop = self._task, self._worker._loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    # -- the transaction -------------------------------------------------------------------
    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgres"``: which SQL ``ctx.connection`` speaks."""
        return self._worker.dialect

    @property
    def transaction(self) -> Transaction:
        """The transaction the job will be completed in (opened now if not yet open)."""
        if self._tx is not None:
            return self._tx
        if threading.get_ident() == self._runner_ident:
            return self._open()
        if self._requests is None:
            raise InvalidState(
                "ctx.transaction / ctx.connection must be used in the handler's own thread "
                "(or in its coroutine); pass the connection to helper threads instead"
            )
        raise InvalidState(
            "an async handler must open its transaction with `await ctx.atransaction()` (or "
            "`await ctx.aconnection()`) first; blocking the event loop while the transaction "
            "opens could deadlock with another handler's transaction. After that, "
            "ctx.connection returns it"
        )

    @property
    def connection(self) -> Any:
        """The DB-API connection of ``ctx.transaction`` (sqlite3 or psycopg)."""
        return self.transaction.connection

    async def atransaction(self) -> Transaction:
        """Open ``ctx.transaction`` from an async handler without blocking the event loop
        (on SQLite it may wait for the write lock). Statements on the connection still
        block the loop while they run; keep them short."""
        if self._tx is not None:
            return self._tx
        if self._requests is None:
            return self.transaction
        return await asyncio.wrap_future(self._via_runner())

    async def aconnection(self) -> Any:
        """``ctx.connection`` for async handlers; see ``atransaction``."""
        return (await self.atransaction()).connection

    def _via_runner(self) -> concurrent.futures.Future[Transaction]:
        fut: concurrent.futures.Future[Transaction] = concurrent.futures.Future()
        assert self._requests is not None
        self._requests.put((self._open, fut))
        return fut

    def _open(self) -> Transaction:
        if self._tx is not None:
            return self._tx
        if self._lost:
            raise LeaseLost(f"job {self.job.handle}: {self._lost_reason}")
        stack = ExitStack()
        self._tx = stack.enter_context(self._worker.transaction_for(self.job))
        self._stack = stack
        return self._tx

    def _close(self, exc: BaseException | None) -> None:
        """Commit (``exc`` None) or roll back the handler's transaction, if one is open."""
        stack, self._stack, self._tx = self._stack, None, None
        if stack is None:
            return
        if exc is None:
            stack.close()
        else:
            stack.__exit__(type(exc), exc, exc.__traceback__)

    def on_complete(self, write: Callable[[Transaction], Any]) -> None:
        """Run ``write(tx)`` in the transaction that records this job's completion.

        Its writes commit if and only if the job is completed: not if the handler fails
        afterwards, not if the lease was lost meanwhile. Unlike ``ctx.transaction``, which
        commits each job on its own and (on SQLite) holds the write lock while the handler
        runs, these writes are batched with other jobs' completions in one commit: the
        transactional outbox at the disk's group-commit rate (for example
        ``ctx.on_complete(lambda tx: sender.enqueue("send", url, body, tx=tx))``). Keep
        ``write`` short and free of network calls; if it raises, the job is retried (or
        failed) by its retry policy and nothing it wrote is kept."""
        if not callable(write):
            raise InvalidArgument(f"on_complete takes a callable write(tx), got {write!r}")
        self._on_complete.append(write)

    def _run_on_complete(self, tx: Transaction) -> None:
        for write in self._on_complete:
            write(tx)

    # -- fan-out ---------------------------------------------------------------------------
    def replace(self, jobs: Iterable[JobSpec | tuple[str, Any]]) -> None:
        """Replace this job with ``jobs`` when the handler returns: the job is marked done
        and the new jobs are inserted in the same transaction (all or nothing). An empty
        list completes the job with no children."""
        if self._children is not None:
            raise InvalidState(f"job {self.job.handle} was already replaced; call replace once")
        children = list(jobs)
        self._children = children
