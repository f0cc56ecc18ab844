"""SQLite's statements where they differ from PostgreSQL's (see ``dialect.py``).

SQLite has one writer at a time, so there is nothing to skip or lock: a grab is a plain
ordered read and an update inside the ``BEGIN IMMEDIATE`` transaction. Its indexes hold no
dead entries (no MVCC in the B-tree), so the ready-jobs index alone keeps the grab flat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homing._json import stored_loads
from homing.store.dialect import SET_LEASE, SET_LEASE_READY, GrabRequest, SqlDialect
from homing.store.protocol import Tx

_MAX_VARS = 500  # bound variables per statement, well under SQLite's limit
_MAX_VARS_OLD_SQLITE = 999  # SQLite's own limit before 3.32 (32,766 since)
_INSERT_HEAD = (
    "INSERT INTO homing_jobs (id, type, args, priority, state, run_at, available_at, "
    "unique_key, parent_id, created_at) VALUES "
)
_INSERT_ROW = "(?, ?, ?, ?, 'ready', ?, ?, ?, ?, ?)"
# Rows per INSERT statement (fewer where 999 bound values, the limit of SQLite builds
# before 3.32, would not hold them). One statement of many rows instead of executemany: SQLite
# writes the AUTOINCREMENT counter and runs the statement's set-up once per statement, not
# once per row (bench/results/api-cpu-968add9.txt: the batch path's CPU per job, with
# the other changes of that commit).
_ROWS_PER_INSERT = 100
_HOLDER = "seq, state, holder_id, lease_expires_at"


# The committed batches that still hold ready jobs, found by skipping through the index of
# ready staged jobs one batch at a time (a loose index scan): every committed batch stays
# in homing_job_batches for the retention (a re-run of its Spark write must find it), and
# reading them all made each grab that did not fill its limit cost 1.9 ms at 1,000 batches
# and 9.9 ms at 5,000 (Spark streams commit one batch per micro-batch; bench/grab_cases.py).
_BATCHES_WITH_READY_JOBS = (
    "WITH RECURSIVE b(id) AS (SELECT (SELECT batch_id FROM homing_jobs "
    "WHERE batch_id IS NOT NULL AND state = 'ready' ORDER BY batch_id LIMIT 1) "
    "UNION ALL SELECT (SELECT batch_id FROM homing_jobs WHERE batch_id IS NOT NULL "
    "AND batch_id > b.id AND state = 'ready' ORDER BY batch_id LIMIT 1) FROM b "
    "WHERE b.id IS NOT NULL) "
    "SELECT b.id FROM b JOIN homing_job_batches k ON k.batch_id = b.id "
    "WHERE k.state = 'committed'"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _insert_rows(
    tx: Tx, head: str, row_sql: str, tail: str, rows: Sequence[tuple[Any, ...]]
) -> None:
    """``head`` + up to ``_ROWS_PER_INSERT`` times ``row_sql`` + ``tail`` a statement (the
    rows are inserted in order, as by executemany; at most 999 bound values a statement)."""
    if not rows:
        return
    step = min(_ROWS_PER_INSERT, _MAX_VARS_OLD_SQLITE // len(rows[0]))
    for start in range(0, len(rows), step):
        chunk = rows[start : start + step]
        values: list[Any] = []
        for r in chunk:
            values += r
        tx.execute(f"{head}{', '.join([row_sql] * len(chunk))}{tail}", values)


class SqliteSql(SqlDialect):
    name = "sqlite"
    pyformat = False
    lock_rows = ""
    skip_locked = ""

    def load_json(self, value: Any) -> Any:
        return stored_loads(value) if isinstance(value, str) else value

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"{column} IN ({_marks(len(values))})", list(values)

    def args_field(self, name: str) -> str:
        return f"json_extract(args, '$.{name}')"

    def args_field_param(self) -> str:
        return "json_extract(args, '$.' || ?)"

    # -- streams ---------------------------------------------------------------------------
    stream_key = "0"
    below_xmin = ""

    def stream_after(self, start: tuple[int, int]) -> tuple[str, list[Any]]:
        return "seq > ?", [start[1]]

    def stream_through(self, end: tuple[int, int]) -> tuple[str, list[Any]]:
        return "seq <= ?", [end[1]]

    def stream_order(self, *, descending: bool = False) -> str:
        return "ORDER BY seq DESC" if descending else "ORDER BY seq"

    def stage_jobs(
        self, tx: Tx, insert: str, rows: Sequence[tuple[Any, ...]], batch: str, now: float
    ) -> None:
        head, _, rest = insert.partition(" VALUES ")
        row_sql, tail = rest[: rest.index(")") + 1], rest[rest.index(")") + 1 :]
        _insert_rows(
            tx,
            f"{head} VALUES ",
            row_sql,
            tail,
            [(r[0], r[1], r[2], r[3], r[4], r[4], r[5], now, batch, batch) for r in rows],
        )

    def number_publication(
        self, tx: Tx, batch: str, sink: str, label: str, now: float, parents: int
    ) -> None:
        # one writer at a time: the autoincrement is in commit order
        tx.execute(
            "INSERT INTO homing_spark_commits (staged_batch, sink, label, committed_at, parents) "
            "VALUES (?, ?, ?, ?, ?)",
            (batch, sink, label, now, parents),
        )

    # -- JSON search -------------------------------------------------------------------
    @staticmethod
    def _jpath(path: list[str]) -> str:
        return "$" + "".join(f'."{s}"' for s in path)

    def json_eq(self, path: list[str], value: Any) -> tuple[str, list[Any]]:
        jpath = self._jpath(path)
        if value is None:
            return "json_type(args, ?) = 'null'", [jpath]
        if isinstance(value, bool):
            return "json_type(args, ?) = ?", [jpath, "true" if value else "false"]
        if isinstance(value, str):
            return "(json_type(args, ?) = 'text' AND json_extract(args, ?) = ?)", [
                jpath,
                jpath,
                value,
            ]
        return (
            "(json_type(args, ?) IN ('integer', 'real') AND json_extract(args, ?) = ?)",
            [jpath, jpath, value],
        )

    def json_in(self, path: list[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
        parts = [self.json_eq(path, v) for v in values]
        params: list[Any] = []
        for p in parts:
            params += p[1]
        return "(" + " OR ".join(p[0] for p in parts) + ")", params

    def json_cmp(self, path: list[str], op: str, value: Any) -> tuple[str, list[Any]]:
        jpath = self._jpath(path)
        types = "('text')" if isinstance(value, str) else "('integer', 'real')"
        return (
            f"(json_type(args, ?) IN {types} AND json_extract(args, ?) {op} ?)",
            [jpath, jpath, value],
        )

    # -- jobs ----------------------------------------------------------------------------
    def insert_jobs(self, tx: Tx, rows: Sequence[tuple[Any, ...]], channel: str) -> None:
        _insert_rows(  # run_at twice: it is the available_at of a ready job
            tx,
            _INSERT_HEAD,
            _INSERT_ROW,
            " ON CONFLICT DO NOTHING",
            [(r[0], r[1], r[2], r[3], r[4], r[4], r[5], r[6], r[7]) for r in rows],
        )

    def _lease(
        self, tx: Tx, g: GrabRequest, columns: str, found: Sequence[tuple[Any, ...]]
    ) -> list[tuple[Any, ...]]:
        """Lease the picked rows (``_HOLDER`` columns first); record lease takeovers."""
        old = {r[0]: r[1:4] for r in found}
        names = [c.strip() for c in columns.split(",")]
        i_id, i_attempts, i_seq = names.index("id"), names.index("attempts"), names.index("seq")
        seqs = list(old)
        rows: list[tuple[Any, ...]] = []
        for start in range(0, len(seqs), _MAX_VARS):
            chunk = seqs[start : start + _MAX_VARS]
            rows += [
                (*u, *old[u[i_seq]])
                for u in tx.query(
                    f"UPDATE homing_jobs SET {SET_LEASE} WHERE seq IN ({_marks(len(chunk))}) "
                    f"RETURNING {columns}",
                    [*g.lease_params, *chunk],
                )
            ]
        # each row ends with the previous (state, holder id, lease expiry)
        taken = [r for r in rows if r[-3] == "running"]
        if taken:
            tx.executemany(
                "INSERT INTO homing_job_failures (job_id, attempt, at, kind, host, pid, worker, "
                "message) SELECT ?, ?, ?, 'lease_expired', h.host, h.pid, h.worker, ? "
                "FROM (SELECT ? AS id) x LEFT JOIN homing_holders h ON h.id = x.id",
                [
                    (
                        r[i_id],
                        r[i_attempts] - 1,
                        g.now,
                        f"lease expired at {r[-1]:.3f} without completion; handed out again",
                        r[-2],
                    )
                    for r in taken
                ],
            )
        return rows

    def grab(self, tx: Tx, g: GrabRequest, columns: str) -> list[tuple[Any, ...]]:
        types_in = _marks(len(g.types))
        expired = tx.query(
            f"SELECT {_HOLDER}, priority, lease_expires_at FROM homing_jobs "
            f"WHERE type IN ({types_in}) AND state = 'running' AND lease_expires_at <= ?"
            f"{g.where_sql} ORDER BY priority DESC, lease_expires_at, seq LIMIT ?",
            [*g.types, g.now, *g.where_params, g.limit],
        )
        pick = (
            f"SELECT {_HOLDER}, priority, run_at FROM homing_jobs WHERE type = ? "
            f"AND state = 'ready' AND batch_id IS NULL AND run_at <= ?{g.where_sql} "
            "ORDER BY priority DESC, run_at, seq LIMIT ?"
        )
        if not expired and len(g.types) == 1:  # the hot path: one statement, pick and lease
            # one job: `seq = (...)`, not `seq IN (...)`, whose list SQLite builds first (the
            # one-job cycle 1.32x / 1.35x, bench/results/ab-d5a5d88-one-job-grab-eq.md;
            # the plan is pinned by tests/store/test_sqlite_grab_plan.py)
            match = "=" if g.limit == 1 else "IN"
            rows = tx.query(  # batch_id is NULL already: left out, SQLite skips its indexes
                f"UPDATE homing_jobs SET {SET_LEASE_READY} WHERE seq {match} "
                f"({pick.replace(f'{_HOLDER}, priority, run_at', 'seq', 1)}) "
                f"RETURNING {columns}",
                [*g.lease_params, g.types[0], g.now, *g.where_params, g.limit],
            )
            return [(*r, "ready", None, None) for r in rows]
        # one ordered index scan per type, merged here (an IN list would sort them all)
        found = list(expired)
        for name in g.types:
            found += tx.query(pick, [name, g.now, *g.where_params, g.limit])
        found.sort(key=lambda r: (-r[4], r[5], r[0]))
        return self._lease(tx, g, columns, found[: g.limit])

    def grab_staged(self, tx: Tx, g: GrabRequest, columns: str) -> list[tuple[Any, ...]]:
        # One ordered scan of homing_jobs_staged_ready per committed batch and type, each
        # stopping at the limit, merged here: `batch_id IN (...)` sorted every job of every
        # committed batch on each grab.
        batches = [r[0] for r in tx.query(_BATCHES_WITH_READY_JOBS)]
        candidates: list[tuple[Any, ...]] = []
        for batch in batches:
            for job_type in g.types:
                candidates += tx.query(
                    f"SELECT {_HOLDER}, priority, seq FROM homing_jobs WHERE batch_id = ? "
                    f"AND type = ? AND state = 'ready' AND run_at <= ?{g.where_sql} "
                    "ORDER BY priority DESC, seq LIMIT ?",
                    [batch, job_type, g.now, *g.where_params, g.limit],
                )
        candidates.sort(key=lambda r: (-r[-2], r[-1]))
        found = [r[:-2] for r in candidates[: g.limit]]
        return self._lease(tx, g, columns, found) if found else []

    def finish_leased(
        self, tx: Tx, pairs: Sequence[tuple[str, str]], *, now: float
    ) -> set[tuple[str, str]]:
        done: set[tuple[str, str]] = set()
        step = _MAX_VARS // 2
        for start in range(0, len(pairs), step):
            chunk = pairs[start : start + step]
            flat = [v for p in chunk for v in p]
            rows = tx.query(
                "UPDATE homing_jobs SET state = 'done', finished_at = ?, lease_expires_at = NULL "
                f"WHERE (id, lease_token) IN (VALUES {', '.join('(?, ?)' for _ in chunk)}) "
                "AND state = 'running' RETURNING id, lease_token",
                [now, *flat],
            )
            done.update((str(r[0]), str(r[1])) for r in rows)
        return done
