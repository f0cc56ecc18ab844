"""PostgreSQL's statements where they differ from SQLite's (see ``dialect.py``).

The grab is split by cost: the hot statement takes due ready jobs through an index that
holds only ready jobs (``homing_jobs_ready``), so its cost does not grow with the jobs
running or finished; the second-chance statement (expired leases, committed staged
batches) runs only when the first did not fill the request, and reads expired leases
through their own index, from a low-water mark (see ``jobs_queries.ExpiryMarks``), so it
does not walk the dead entries that finished jobs leave until VACUUM. Each is a plain
statement that PostgreSQL can plan once (prepared by psycopg, generic plan).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from homing.store.dialect import SET_LEASE, STILL_RUNNING, GrabRequest, SqlDialect
from homing.store.jobs_queries import JOBS_CHANNEL
from homing.store.protocol import Tx

_INSERT_COLS = (
    "id, type, args, priority, state, run_at, available_at, unique_key, parent_id, created_at"
)
# ctid: the leased rows are updated by their physical address (a TID scan) rather than
# looked up again through the primary key (see PostgresSql._lease).
_OLD = "ctid, seq, state AS old_state, holder_id AS old_holder, lease_expires_at AS old_exp"


# Pops up to {count} idle workers (the most recently idle first: a worker that died idle
# sinks to the end) and hands their channels to the statement's final SELECT.
_WAKE_IDLE = (
    "woken AS (DELETE FROM homing_idle_workers w WHERE w.channel IN (SELECT channel FROM "
    "homing_idle_workers ORDER BY since DESC LIMIT {count} FOR UPDATE SKIP LOCKED){only_if} "
    "RETURNING w.channel)"
)


# Listeners (see migrations/jobs.py, version 7): a registration older than this is a
# listener that died; the live ones refresh theirs every LISTENER_REFRESH_S. Server time on
# both sides, so that a client's clock (or a test's manual clock) does not enter into it.
LISTENER_REFRESH_S = 15.0
LISTENER_STALE_S = 60.0
_LISTENING = (
    f"EXISTS (SELECT 1 FROM homing_listeners WHERE channel = ? AND since > "
    f"extract(epoch FROM statement_timestamp()) - {LISTENER_STALE_S:g})"
)
REGISTER_LISTENER = (
    "INSERT INTO homing_listeners (channel, backend, since) VALUES (%s, pg_backend_pid(), "
    "extract(epoch FROM clock_timestamp())) ON CONFLICT (channel, backend) "
    "DO UPDATE SET since = excluded.since"
)
UNREGISTER_LISTENER = (
    "DELETE FROM homing_listeners WHERE channel = %s AND backend = pg_backend_pid()"
)
# The channels whose announcements ask whether anyone listens: only their listeners
# register (a worker's idle channel, the HTTP and engine channels do not need to).
GATED_CHANNELS = frozenset({JOBS_CHANNEL})


# The batches that hold ready staged jobs, one index probe each (a loose index scan of
# homing_jobs_staged_ready; open batches too, the grab keeps the committed ones).
_STAGED_BATCHES = (
    "staged_batches(batch_id) AS (SELECT min(batch_id) FROM homing_jobs "
    "WHERE batch_id IS NOT NULL AND state = 'ready' UNION ALL "
    "SELECT (SELECT min(j.batch_id) FROM homing_jobs j WHERE j.batch_id > s.batch_id "
    "AND j.state = 'ready') FROM staged_batches s WHERE s.batch_id IS NOT NULL)"
)


# A JSON string literal, by the json module's C encoder (json.dumps would take its whole
# encoder machinery per call: four calls per job of a batch insert).
_jstr = json.encoder.encode_basestring


def _uuid_array(values: Sequence[str]) -> str:
    """A uuid[] parameter as one array literal, joined in C: psycopg dumps a list element
    by element in Python (bench/results/ab-0937854-encoder-uuid-array.md). Only for UUIDs
    in their text form, as ``JobOps.id_of`` and ``_lease_of`` pass them: no quotes, commas
    or braces that the array syntax would read."""
    return "{" + ",".join(values) + "}"


def _jstr_or_null(value: str | None) -> str:
    return "null" if value is None else _jstr(value)


# After each leased row: how many expired leases the search for them found (it stops at
# the limit), and the earliest expiry among those it found but did not lease (they lost
# their place to ready jobs under the limit), for jobs_queries.ExpiryMarks.
_EXPIRED_SUMMARY = (
    ", (SELECT count(*) FROM expired) AS expired_found, (SELECT min(e.avail) FROM expired e "
    "WHERE e.ctid <> ALL (ARRAY(SELECT ctid FROM c))) AS expired_left"
)


@functools.lru_cache(maxsize=16)
def _returning(columns: str) -> str:
    cols = ", ".join(f"j.{c.strip()}" for c in columns.split(","))
    return f"RETURNING {cols}, c.old_state, c.old_holder, c.old_exp"


class PostgresSql(SqlDialect):
    name = "postgres"
    reports_expired = True
    pyformat = True
    lock_rows = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(?)", [list(values)]

    def notify(self, tx: Tx, channel: str, key: str = "") -> None:
        tx.execute("SELECT pg_notify(?, ?)", (tx.store.notify_channel(channel), key))  # type: ignore[attr-defined]

    def advisory_lock(self, tx: Tx, key: int) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(?)", (key,))

    def try_advisory_lock(self, tx: Tx, key: int) -> bool:
        row = tx.query_one("SELECT pg_try_advisory_xact_lock(?)", (key,))
        return bool(row and row[0])

    def forget_dead_listeners(self, tx: Tx, *, older_than: float) -> None:
        # the server's clock, as the registrations' (a client's clock may be a test's)
        tx.execute(
            "DELETE FROM homing_listeners WHERE since < "
            "extract(epoch FROM statement_timestamp()) - ?",
            (older_than,),
        )

    def announce_jobs(self, tx: Tx, channel: str, count: int) -> None:
        full = tx.store.notify_channel(channel)  # type: ignore[attr-defined]
        tx.execute(
            f"WITH {_WAKE_IDLE.format(count='?', only_if='')} "
            f"SELECT pg_notify(?, ?) WHERE {_LISTENING} "
            "UNION ALL SELECT pg_notify(channel, '') FROM woken",
            (count, full, str(count), full),
        )

    def json_text(self, expr: str) -> str:
        return f"{expr}::text"

    def job_id(self, expr: str) -> str:
        return f"{expr}::uuid"

    def args_field(self, name: str) -> str:
        return f"args->>'{name}'"

    def args_field_param(self) -> str:
        return "args->>(?::text)"

    # -- streams ---------------------------------------------------------------------------
    stream_key = "xid"
    below_xmin = " AND xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"

    def stream_after(self, start: tuple[int, int]) -> tuple[str, list[Any]]:
        return "(xid > ? OR (xid = ? AND seq > ?))", [start[0], start[0], start[1]]

    def stream_through(self, end: tuple[int, int]) -> tuple[str, list[Any]]:
        return "(xid < ? OR (xid = ? AND seq <= ?))", [end[0], end[0], end[1]]

    def stream_order(self, *, descending: bool = False) -> str:
        return "ORDER BY xid DESC, seq DESC" if descending else "ORDER BY xid, seq"

    def stage_jobs(
        self, tx: Tx, insert: str, rows: Sequence[tuple[Any, ...]], batch: str, now: float
    ) -> None:
        """The rows travel by COPY into a temporary table, then one upsert. An id twice in
        one upsert is an error ("cannot affect row a second time"), so a chunk with
        duplicate ids is deduplicated by a sort (DISTINCT ON); one without (the usual
        case, checked here) skips that sort."""
        tx.execute(
            "CREATE TEMP TABLE IF NOT EXISTS homing_spark_stage (id UUID, type TEXT, args TEXT, "
            "priority INTEGER, run_at DOUBLE PRECISION, parent_id TEXT) ON COMMIT DELETE ROWS"
        )
        cur = tx.connection.cursor()
        with cur.copy(
            "COPY homing_spark_stage (id, type, args, priority, run_at, parent_id) FROM STDIN"
        ) as copy:
            for r in rows:
                copy.write_row(r)
        head, _, conflict = insert.partition(" VALUES ")
        unique = len({r[0] for r in rows}) == len(rows)
        tx.execute(
            f"{head} SELECT {'' if unique else 'DISTINCT ON (id) '}id, type, args::jsonb, "
            "priority, 'ready', run_at, "
            "run_at, parent_id, ?, ?, ? FROM homing_spark_stage "
            + conflict[conflict.index("ON CONFLICT") :],
            (now, batch, batch),
        )
        tx.execute("TRUNCATE homing_spark_stage")

    def number_publication(
        self, tx: Tx, batch: str, sink: str, label: str, now: float, parents: int
    ) -> None:
        # The counter row stays locked until this transaction ends: numbers commit in order.
        row = tx.query_one("UPDATE homing_spark_sequencer SET n = n + 1 WHERE one = 1 RETURNING n")
        assert row is not None
        tx.execute(
            "INSERT INTO homing_spark_commits (commit_no, staged_batch, sink, label, "
            "committed_at, parents) VALUES (?, ?, ?, ?, ?, ?)",
            (int(row[0]), batch, sink, label, now, parents),
        )

    # -- JSON search -------------------------------------------------------------------
    def json_eq(self, path: list[str], value: Any) -> tuple[str, list[Any]]:
        return "args #> ? = ?::jsonb", [path, json.dumps(value)]

    def json_in(self, path: list[str], values: Sequence[Any]) -> tuple[str, list[Any]]:
        return "args #> ? = ANY(?::jsonb[])", [path, [json.dumps(v) for v in values]]

    def json_cmp(self, path: list[str], op: str, value: Any) -> tuple[str, list[Any]]:
        if isinstance(value, str):
            return (
                f"(CASE WHEN jsonb_typeof(args #> ?) = 'string' "
                f'THEN (args #>> ?) COLLATE "C" {op} ? ELSE false END)',
                [path, path, value],
            )
        return (
            f"(CASE WHEN jsonb_typeof(args #> ?) = 'number' "
            f"THEN (args #>> ?)::numeric {op} ?::numeric ELSE false END)",
            [path, path, value],
        )

    # -- jobs ----------------------------------------------------------------------------
    def insert_jobs(self, tx: Tx, rows: Sequence[tuple[Any, ...]], channel: str) -> None:
        full = tx.store.notify_channel(channel)  # type: ignore[attr-defined]
        # The wake-up rides in the same statement, only when something was inserted: as many
        # idle workers as jobs were inserted (each on its own channel), and the listeners of
        # the jobs channel (Database.wait_for_jobs) if there are any (a NOTIFY serialises
        # the commits of all producers: see migrations/jobs.py, version 7).
        announce = (
            ", "
            + _WAKE_IDLE.format(
                count="(SELECT count(*) FROM ins)", only_if=" AND EXISTS (SELECT 1 FROM ins)"
            )
            + f" SELECT pg_notify(?, ?) WHERE EXISTS (SELECT 1 FROM ins) AND {_LISTENING} "
            "UNION ALL SELECT pg_notify(channel, '') FROM woken"
        )
        # Only a unique_key can meet an existing job: ids are new (uuid7s made for this
        # insert). Without one, a plain INSERT: ON CONFLICT makes every row a speculative
        # insertion (a probe of each unique index first, a confirmation record after).
        conflict = " ON CONFLICT DO NOTHING" if any(r[5] is not None for r in rows) else ""
        if len(rows) == 1:
            r = rows[0]
            tx.execute(
                f"WITH ins AS (INSERT INTO homing_jobs ({_INSERT_COLS}) "
                "VALUES (?, ?, ?::jsonb, ?, 'ready', ?, ?, ?, ?, ?)"
                f"{conflict} RETURNING 1){announce}",
                (r[0], r[1], r[2], r[3], r[4], r[4], r[5], r[6], r[7], full, "1", full),
            )
            return
        # One JSON parameter for the batch: encoded in C, unpacked by the server. The args
        # are JSON already and go in as they are.
        doc = (
            "["
            + ",".join(
                f"[{_jstr(r[0])},{_jstr(r[1])},{r[2]},{r[3]},{r[4]!r},"
                f"{_jstr_or_null(r[5])},{_jstr_or_null(r[6])},{r[7]!r}]"
                for r in rows
            )
            + "]"
        )
        tx.execute(
            f"WITH ins AS (INSERT INTO homing_jobs ({_INSERT_COLS}) "
            "SELECT (e->>0)::uuid, e->>1, e->2, (e->>3)::int, 'ready', (e->>4)::float8, "
            "(e->>4)::float8, e->>5, e->>6, (e->>7)::float8 "
            f"FROM jsonb_array_elements(?::jsonb) AS e{conflict} RETURNING 1){announce}",
            (doc, full, str(len(rows)), full),
        )

    def grab(self, tx: Tx, g: GrabRequest, columns: str) -> list[tuple[Any, ...]]:
        """Ready jobs, expired leases and jobs of committed staged batches, in one statement
        (an empty grab is one round trip): the best priority first, then the longest
        waiting; staged jobs after the others (kind 1)."""
        ready, ready_params = _ready_pick(g)
        expired, expired_params = _expired_pick(g)
        staged, staged_params = _staged_pick(g)
        return self._lease(
            tx,
            g,
            columns,
            f"WITH RECURSIVE {_STAGED_BATCHES}, ready AS ({ready}), expired AS ({expired}), "
            f"staged AS ({staged}), "
            "c AS (SELECT * FROM (SELECT *, 0 AS kind FROM ready UNION ALL "
            "SELECT *, 0 AS kind FROM expired UNION ALL SELECT *, 1 AS kind FROM staged) u "
            "ORDER BY kind, priority DESC, avail, seq LIMIT ?)",
            [*ready_params, *expired_params, *staged_params, g.limit],
            tail=_EXPIRED_SUMMARY,
        )

    def grab_staged(self, tx: Tx, g: GrabRequest, columns: str) -> list[tuple[Any, ...]]:
        return []  # ``grab`` takes them in the same statement

    @staticmethod
    def _lease(
        tx: Tx, g: GrabRequest, columns: str, pick: str, params: list[Any], tail: str = ""
    ) -> list[tuple[Any, ...]]:
        """Lease the rows of CTE ``c`` (``pick``); a takeover of an expired lease is
        recorded in the failure history in the same statement. With ``idle_channel`` the
        caller is registered as an idle worker when it got fewer jobs than it asked for
        (nothing else was ready and it has room: the next insert wakes it), and
        unregistered when it got all it asked for (so that no insert wakes it while it is
        full), in the same statement too."""
        idle, idle_params = "", []
        if g.idle_channel is not None:
            channel = tx.store.notify_channel(g.idle_channel)  # type: ignore[attr-defined]
            idle = (
                ", idle AS (INSERT INTO homing_idle_workers (channel, since) SELECT ?, ? "
                "WHERE (SELECT count(*) FROM upd) < ? ON CONFLICT (channel) DO UPDATE SET "
                "since = excluded.since RETURNING 1), "
                "busy AS (DELETE FROM homing_idle_workers WHERE channel = ? "
                "AND (SELECT count(*) FROM upd) >= ? RETURNING 1)"
            )
            idle_params = [channel, g.now, g.limit, channel, g.limit]
        return tx.query(
            f"{pick}, upd AS (UPDATE homing_jobs j SET "
            f"{SET_LEASE.replace('attempts + 1', 'j.attempts + 1')} "
            # The picks by their row address (= ANY, a TID scan) as well as joined: a
            # generic plan guesses a tenth of the candidates for c and hashed all of
            # homing_jobs for the join. The rows are locked by this statement, so their
            # addresses hold; seq must match too, so that a stale address could only leave
            # a job unleased (grabbed next time), never lease another one. A grab of 100
            # took 14-26% less time than through the primary key
            # (bench/results/statements-5c38129-ctid-finish-any.txt).
            f"FROM c WHERE j.ctid = c.ctid AND j.ctid = ANY (ARRAY(SELECT ctid FROM c)) "
            f"AND j.seq = c.seq "
            f"{_returning(columns)}), "
            "hist AS (INSERT INTO homing_job_failures "
            "(job_id, attempt, at, kind, host, pid, worker, message) "
            "SELECT u.id, u.attempts - 1, ?, 'lease_expired', h.host, h.pid, h.worker, "
            "'lease expired at ' || round(u.old_exp::numeric, 3)::text "
            "|| ' without completion; handed out again' FROM upd u "
            "LEFT JOIN homing_holders h ON h.id = u.old_holder WHERE u.old_state = 'running')"
            f"{idle} SELECT *{tail} FROM upd",
            [*params, *g.lease_params, g.now, *idle_params],
        )

    def finish_leased(
        self, tx: Tx, pairs: Sequence[tuple[str, str]], *, now: float
    ) -> set[tuple[str, str]]:
        """The jobs are found by id through one scan of the id index for the whole array
        (``id = ANY``), never through the index of running jobs (STILL_RUNNING); each must
        hold its own pair's token. Joining ``unnest(ids, tokens)`` instead made PostgreSQL
        look the ids up one by one (or hash a sequential scan of the table, on a small
        one): a completion of 100 took 4.8-7.6 ms against 3.3-4.9 ms this way
        (bench/results/statements-5c38129-ctid-finish-any.txt)."""
        ids = [p[0] for p in pairs]
        tokens = {p[1] for p in pairs}
        params: list[Any]
        if len(tokens) == 1:  # one lease (the usual case): the token is one parameter
            token_sql, params = "j.lease_token = ?", [tokens.pop()]
        else:  # each job its own pair's token (a repeated id: its first pair's)
            token_sql = "j.lease_token = (?::uuid[])[array_position(?::uuid[], j.id)]"
            params = [_uuid_array([p[1] for p in pairs]), _uuid_array(ids)]
        changed = tx.rowcount(
            "UPDATE homing_jobs j SET state = 'done', finished_at = ?, lease_expires_at = NULL "
            f"WHERE j.id = ANY(?::uuid[]) AND {token_sql} AND j.state = {STILL_RUNNING}",
            (now, _uuid_array(ids), *params),
        )
        wanted = set(pairs)
        if changed == len(wanted) == len(set(ids)):  # every job, each under its pair's lease
            return wanted
        # Some were refused (or an id came twice): which pairs are done now. Returning the
        # ids from the UPDATE instead cost every completion a row per job to send and read
        # (bench/results/statements-f98069c-count-completion.txt).
        rows = tx.query(
            "SELECT id, lease_token FROM homing_jobs WHERE id = ANY(?::uuid[]) AND state = 'done'",
            (_uuid_array(ids),),
        )
        return wanted & {(str(r[0]), str(r[1])) for r in rows}

    def finish_many(self, tx: Tx, job_ids: Sequence[str], token: str, *, now: float) -> int:
        return tx.rowcount(
            "UPDATE homing_jobs j SET state = 'done', finished_at = ?, lease_expires_at = NULL "
            f"WHERE j.id = ANY(?::uuid[]) AND j.lease_token = ? AND j.state = {STILL_RUNNING}",
            (now, _uuid_array(job_ids), token),
        )


def _ready_pick(g: GrabRequest) -> tuple[str, list[Any]]:
    """Due ready jobs, through the index of ready jobs (homing_jobs_ready)."""
    if len(g.types) == 1:
        return (
            f"SELECT {_OLD}, priority, run_at AS avail FROM homing_jobs WHERE type = ? "
            f"AND state = 'ready' AND batch_id IS NULL AND run_at <= ?{g.where_sql} "
            "ORDER BY priority DESC, run_at, seq LIMIT ? FOR UPDATE SKIP LOCKED",
            [g.types[0], g.now, *g.where_params, g.limit],
        )
    # One ordered index scan per type (LATERAL), merged: `type = ANY(...)` would make
    # PostgreSQL sort every ready job of those types on each grab.
    return (
        "SELECT c.* FROM unnest(?::text[]) AS t(name) CROSS JOIN LATERAL ("
        f"SELECT {_OLD}, priority, run_at AS avail FROM homing_jobs WHERE type = t.name "
        f"AND state = 'ready' AND batch_id IS NULL AND run_at <= ?{g.where_sql} "
        "ORDER BY priority DESC, run_at, seq LIMIT ? FOR UPDATE SKIP LOCKED) c",
        [list(g.types), g.now, *g.where_params, g.limit],
    )


def _expired_pick(g: GrabRequest) -> tuple[str, list[Any]]:
    """Expired leases, through the index of running jobs, from the mark when there is one
    (jobs_queries.ExpiryMarks)."""
    low = "" if g.expired_after is None else " AND lease_expires_at > ?"
    return (
        f"SELECT {_OLD}, priority, lease_expires_at AS avail FROM homing_jobs "
        f"WHERE type = ANY(?) AND state = 'running' AND lease_expires_at <= ?{low}"
        f"{g.where_sql} ORDER BY priority DESC, lease_expires_at, seq LIMIT ? "
        "FOR UPDATE SKIP LOCKED",
        [
            list(g.types),
            g.now,
            *([] if g.expired_after is None else [g.expired_after]),
            *g.where_params,
            g.limit,
        ],
    )


def _staged_pick(g: GrabRequest) -> tuple[str, list[Any]]:
    """Ready jobs of committed staged batches: one ordered scan of
    homing_jobs_staged_ready per committed batch and type (LATERAL), each stopping at the
    limit (`batch_id IN (...)` made PostgreSQL read and sort every job of every committed
    batch on each grab). Only the batches that still hold ready jobs (staged_batches, a
    loose scan of that index): the drained ones stay for the retention, and probing each
    cost 5.4 ms a grab at 5,000 (bench/grab_cases.py). Their state is looked up per batch
    (a subquery), not joined: the planner hashed the whole table of batches for the join.
    Staged jobs come after ready jobs and expired leases (kind 1): when those two fill the
    request, none would be taken, and the search is skipped (a one-time filter), so that a
    full grab neither runs it nor locks staged rows it would not lease."""
    return (
        "SELECT c.* FROM (SELECT s.batch_id FROM staged_batches s WHERE (SELECT k.state "
        "FROM homing_job_batches k WHERE k.batch_id = s.batch_id) = 'committed' "
        "AND (SELECT count(*) FROM ready) + (SELECT count(*) FROM expired) < ?) b "
        "CROSS JOIN unnest(?::text[]) AS t(name) "
        f"CROSS JOIN LATERAL (SELECT {_OLD}, priority, run_at AS avail FROM homing_jobs "
        "WHERE batch_id = b.batch_id AND type = t.name AND state = 'ready' "
        f"AND run_at <= ?{g.where_sql} ORDER BY priority DESC, seq LIMIT ? "
        "FOR UPDATE SKIP LOCKED) c",
        [g.limit, list(g.types), g.now, *g.where_params, g.limit],
    )
