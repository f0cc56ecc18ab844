"""What differs between the backends' SQL, in one object per backend.

The shared query modules (``*_queries``) are written once; where SQLite and PostgreSQL
really differ (the grab, bulk writes, JSON search, locking clauses, notifications) they
call ``tx.sql``, the backend's ``SqlDialect``. Nothing outside ``homing.store`` needs to
know which backend it runs on: it asks ``store.capabilities`` or ``store.wakeup``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from homing.store.protocol import Dialect, Tx


@dataclass(frozen=True)
class GrabRequest:
    """One grab: which types, the lease to hand out, how many, and an optional search."""

    types: Sequence[str]
    now: float
    token: str
    until: float
    holder: int  # homing_holders.id of the grabbing worker (holders_queries.register_holder)
    limit: int
    where_sql: str = ""  # " AND <clause>" over the column ``args``, or ""
    where_params: Sequence[Any] = ()
    expired_after: float | None = None  # only leases that expired after this (None: all)
    idle_channel: str | None = None  # a worker's wake-up channel: registered idle if empty

    @property
    def lease_params(self) -> list[Any]:
        return [self.token, self.until, self.until, self.holder]


# The state of a job whose lease is still held, written as an InitPlan rather than the
# constant 'running'. With the constant, and statistics that say few jobs run (autovacuum
# analyzes the table only now and then), PostgreSQL proves the predicate of
# homing_jobs_leases (the partial index of running jobs) and may read it instead of the id
# index; that index keeps an entry for every job that ran since the last VACUUM, and each
# completion read them all. Test: tests/store/test_contract.py::
# test_completions_do_not_read_the_index_of_running_jobs (fails with the constant).
STILL_RUNNING = "(SELECT 'running')"

SET_LEASE = (
    "state = 'running', attempts = attempts + 1, lease_token = ?, lease_expires_at = ?, "
    "available_at = ?, holder_id = ?, batch_id = NULL"
)
# The same for jobs picked as ready and not staged, whose batch_id is NULL already (setting
# it anyway makes SQLite visit the staged-job indexes on every lease).
SET_LEASE_READY = SET_LEASE.removesuffix(", batch_id = NULL")


class SqlDialect:
    """The statements that differ between backends. Subclasses: ``PostgresSql``, ``SqliteSql``."""

    name: ClassVar[Dialect]
    pyformat: ClassVar[bool]  # psycopg wants %s placeholders; statements are written with ?
    # grab's rows end with (expired leases found, earliest expiry found and not leased)
    reports_expired: ClassVar[bool] = False
    lock_rows: ClassVar[str]  # " FOR UPDATE" where rows are locked, "" on a single-writer store
    skip_locked: ClassVar[str]  # " FOR UPDATE SKIP LOCKED", or "" on a single-writer store

    # -- general -----------------------------------------------------------------------
    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column IN (values)`` with bound parameters (values: at most 500)."""
        raise NotImplementedError

    def notify(self, tx: Tx, channel: str, key: str = "") -> None:
        """Announce work on ``channel`` at commit, for ``key``'s waiters if given (no-op
        where nobody listens)."""

    def forget_dead_listeners(self, tx: Tx, *, older_than: float) -> None:
        """Delete listener registrations not refreshed for ``older_than`` seconds (their
        process died); nothing where nobody listens."""

    def announce_jobs(self, tx: Tx, channel: str, count: int) -> None:
        """Announce ``count`` new jobs at commit: wake that many idle workers, and the
        listeners of ``channel`` (no-op where nobody listens)."""

    def advisory_lock(self, tx: Tx, key: int) -> None:
        """Serialise writers on ``key`` until the transaction ends (a single-writer store
        is serialised already: no-op)."""

    def try_advisory_lock(self, tx: Tx, key: int) -> bool:
        """Take ``key`` until the transaction ends if nobody holds it; True if taken (always
        on a single-writer store, whose write transaction already excludes the others)."""
        return True

    def load_json(self, value: Any) -> Any:
        """A JSON column's value as Python (PostgreSQL's driver decodes jsonb itself)."""
        return value

    # -- JSON search over args ---------------------------------------------------------
    def json_eq(self, path: list[str], value: Any) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def json_in(self, path: list[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def json_cmp(self, path: list[str], op: str, value: Any) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def json_text(self, expr: str) -> str:
        """``expr`` (a JSON column) as JSON text."""
        return expr

    def job_id(self, expr: str) -> str:
        """``expr`` (a job id kept as text by another component) comparable with
        ``homing_jobs.id`` (a native uuid on PostgreSQL)."""
        return expr

    def args_field(self, name: str) -> str:
        """The text of top-level field ``name`` (a constant identifier) of ``args``."""
        raise NotImplementedError

    def args_field_param(self) -> str:
        """The text of the top-level field of ``args`` named by one bound parameter."""
        raise NotImplementedError

    # -- streams (Spark) ---------------------------------------------------------------
    # A stream position is (key, seq): PostgreSQL's key is the inserting transaction's id,
    # read only below the snapshot's xmin (sequences are not visible in commit order);
    # SQLite commits one writer at a time, so seq alone is in commit order and key is 0.
    stream_key: ClassVar[str]
    below_xmin: ClassVar[str]  # " AND <only rows of transactions every snapshot sees>"

    def stream_after(self, start: tuple[int, int]) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def stream_through(self, end: tuple[int, int]) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def stream_order(self, *, descending: bool = False) -> str:
        raise NotImplementedError

    def stage_jobs(
        self, tx: Tx, insert: str, rows: Sequence[tuple[Any, ...]], batch: str, now: float
    ) -> None:
        """Write staged jobs (id, type, args_json, priority, run_at, parent_id) with
        ``insert`` (an INSERT of the staging columns, ending in its ON CONFLICT clause)."""
        raise NotImplementedError

    def number_publication(
        self, tx: Tx, batch: str, sink: str, label: str, now: float, parents: int
    ) -> None:
        """Record a Spark publication with the next commit-ordered number."""
        raise NotImplementedError

    # -- jobs ----------------------------------------------------------------------------
    def insert_jobs(self, tx: Tx, rows: Sequence[tuple[Any, ...]], channel: str) -> None:
        """Insert new jobs (id, type, args_json, priority, run_at, unique_key, parent_id,
        created_at), skipping conflicts on id or unique_key; announce them on ``channel``."""
        raise NotImplementedError

    def grab(self, tx: Tx, g: GrabRequest, columns: str) -> list[tuple[Any, ...]]:
        """Lease due ready jobs and jobs whose lease expired, best priority first (then the
        longest waiting), recording each takeover of an expired lease in its history.
        Each row: ``columns``, then the previous state, holder id and lease expiry."""
        raise NotImplementedError

    def grab_staged(self, tx: Tx, g: GrabRequest, columns: str) -> list[tuple[Any, ...]]:
        """Lease jobs of committed staged batches, asked for when ``grab`` did not fill the
        request (a dialect whose ``grab`` takes them itself returns [])."""
        raise NotImplementedError

    def finish_leased(
        self, tx: Tx, pairs: Sequence[tuple[str, str]], *, now: float
    ) -> set[tuple[str, str]]:
        """Mark done every (job id, lease token) that still holds its lease; the pairs done."""
        raise NotImplementedError

    def finish_many(self, tx: Tx, job_ids: Sequence[str], token: str, *, now: float) -> int:
        """Mark done the running jobs of one lease; how many changed."""
        clause, params = self.in_list("id", job_ids)
        return tx.rowcount(
            "UPDATE homing_jobs SET state = 'done', finished_at = ?, lease_expires_at = NULL "
            f"WHERE {clause} AND lease_token = ? AND state = 'running'",
            (now, *params, token),
        )
