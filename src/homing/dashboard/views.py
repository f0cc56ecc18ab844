"""What the dashboard's pages show, read from the store (one shard or many).

Plain data assembly, no HTTP: the Starlette app (``app.py``) renders it, the metrics
collector (``metrics.py``) exports part of it, and tests can call it directly.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

from homing import ids
from homing.database import Database, ShardedDatabase
from homing.errors import InvalidArgument, InvalidState, JobNotFound
from homing.store import dashboard_queries as dq
from homing.store import engine_queries as eq

log = logging.getLogger("homing.dashboard")
AUDIT = logging.getLogger("homing.dashboard.audit")

PAGE = 50
BULK_LIMIT = 1000  # one bulk redrive touches at most this many jobs
COUNT_CAP = 10_000  # "how many match" counts this far and no further
SCAN_WINDOW = 50_000  # jobs (by seq) one page of an unindexed filter scans
WINDOW = 3600.0
BUCKET = 60.0
_LIVE = ("ready", "scheduled", "waiting", "staged", "running", "expired")


class Source:
    """The store the dashboard looks at: one database, or the shards of a sharded one."""

    def __init__(self, db: Database | ShardedDatabase) -> None:
        self.db = db
        self.sharded = isinstance(db, ShardedDatabase)
        self.shards: list[Database] = list(db.shards) if isinstance(db, ShardedDatabase) else [db]

    def now(self) -> float:
        return self.shards[0].clock.now()

    def handle(self, shard: int, job_id: str) -> str:
        return f"{shard}:{job_id}" if self.sharded else job_id

    def locate(self, handle: str) -> tuple[Database, str]:
        """The shard and bare id a handle names (JobNotFound for anything malformed)."""
        shard, job_id = 0, handle
        if self.sharded:
            prefix, sep, job_id = handle.partition(":")
            if not sep or not prefix.isdigit() or int(prefix) >= len(self.shards):
                raise JobNotFound(f"{handle!r} is not a job handle of this sharded store")
            shard = int(prefix)
        if not ids.is_uuid(job_id):  # job ids are UUIDs (PostgreSQL could not even compare)
            raise JobNotFound(f"{handle!r} is not a job handle")
        return self.shards[shard], job_id.lower()


# -- overview ----------------------------------------------------------------------------
def overview(src: Source) -> dict[str, Any]:
    now = src.now()
    types: dict[str, dict[str, Any]] = {}
    slots: dict[tuple[int, str], int] = {}
    for shard in src.shards:
        with shard.store.transaction(write=False) as tx:
            counts = dq.type_counts(tx, now=now)
            recent = dq.finished(tx, now=now, window=WINDOW, bucket=BUCKET)
        last_5m = int(WINDOW / BUCKET) - int(300 / BUCKET)
        for type_, state, slot, n in recent:
            slots[(slot, state)] = slots.get((slot, state), 0) + n
            row = counts.setdefault(type_, {})
            key = f"{state}_window"
            row[key] = row.get(key, 0) + n
            if state == "done" and slot >= last_5m:
                row["done_5m"] = row.get("done_5m", 0) + n
        for type_, row in counts.items():
            merged = types.setdefault(type_, {})
            for key, value in row.items():
                if key == "oldest_ready_at":
                    merged[key] = min(merged.get(key, value), value)
                else:
                    merged[key] = merged.get(key, 0) + value
    states = sorted({"failed"} | {k for row in types.values() for k in row if _is_other_state(k)})
    rows = []
    for type_ in sorted(types):
        row = types[type_]
        oldest = row.get("oldest_ready_at")
        rows.append(
            {
                "type": type_,
                **{k: row.get(k, 0) for k in (*_LIVE, *states)},
                "done_window": row.get("done_window", 0),
                "per_min": row.get("done_5m", 0) / 5.0,
                "oldest_ready_age_s": (now - oldest) if oldest is not None else None,
            }
        )
    return {
        "now": now,
        "types": rows,
        "workers": [  # who grabbed in the last 15 minutes or holds jobs (holder registry);
            # all of them (at most 1,000): /metrics exports each, the page shows PAGE
            {**w, "seen_age_s": max(0.0, now - w["seen_at"])}
            for w in src.db.workers()
        ],
        "workers_shown": PAGE,
        "other_states": states,
        "expired": sum(r["expired"] for r in rows),
        "chart": _chart(slots),
        "window_min": int(WINDOW / 60),
    }


def _is_other_state(key: str) -> bool:
    """Unsuccessful terminal states (failed, cancelled, ...) as the store reports them."""
    return (
        key not in _LIVE
        and key not in ("oldest_ready_at", "done_5m")
        and not key.endswith("_window")
    )


def _chart(slots: dict[tuple[int, str], int]) -> dict[str, Any]:
    """Bars of finished jobs per minute over the window, as SVG coordinates."""
    n = int(WINDOW / BUCKET)
    done = [0] * n
    other = [0] * n
    for (slot, state), count in slots.items():
        if 0 <= slot < n:
            (done if state == "done" else other)[slot] += count
    top = max([d + o for d, o in zip(done, other, strict=True)] + [1])
    width, height = 600, 120
    bar = width / n
    bars = []
    for i, (d, o) in enumerate(zip(done, other, strict=True)):
        hd = height * d / top
        ho = height * o / top
        bars.append(
            {
                "x": round(i * bar, 1),
                "w": round(bar - 1, 1),
                "hd": round(hd, 1),
                "ho": round(ho, 1),
                "yd": round(height - hd, 1),
                "yo": round(height - hd - ho, 1),
                "done": d,
                "other": o,
                "ago": n - i,
            }
        )
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "top": top,
        "total": sum(done),
        "failed": sum(other),
    }


# -- jobs --------------------------------------------------------------------------------
def parse_filter(type_: str | None, state: str | None, where: str | None) -> dq.JobFilter:
    """The jobs list's query string as a filter; a bad args search is InvalidArgument."""
    parsed = None
    if where and where.strip():
        try:
            parsed = json.loads(where)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"args search is not valid JSON: {exc}") from exc
    return dq.JobFilter(type=type_ or None, state=state or None, where=parsed)


def parse_cursor(src: Source, cursor: str | None) -> list[str]:
    """``"m0.m1..."``, one mark a shard: ``*`` from the newest, ``-`` nothing left, or a
    seq to list jobs below (keyset pagination: no OFFSET scans)."""
    if not cursor:
        return ["*"] * len(src.shards)
    parts = cursor.split(".")
    if len(parts) != len(src.shards) or not all(p in "*-" or p.isdigit() for p in parts):
        raise InvalidArgument("bad page cursor")
    return parts


def _windowed(f: dq.JobFilter) -> bool:
    """Filters no index serves (an args search, a type alone) scan a bounded seq window a
    page, so that a rare match costs a bounded scan, not the whole table."""
    return f.where is not None or (f.type is not None and f.state is None)


def jobs_page(src: Source, f: dq.JobFilter, cursor: str | None) -> dict[str, Any]:
    """One page of jobs, newest first across shards, and the cursor of the next page."""
    now = src.now()
    marks = parse_cursor(src, cursor)
    windowed = _windowed(f)
    fetched: list[list[dict[str, Any]]] = []
    floors: list[int | None] = []
    for i, shard in enumerate(src.shards):
        floors.append(None)
        if marks[i] == "-":
            fetched.append([])
            continue
        before = None if marks[i] == "*" else int(marks[i])
        with shard.store.transaction(write=False) as tx:
            if windowed:
                top = before if before is not None else dq.top_seq(tx)
                floors[i] = max(0, top - SCAN_WINDOW)
            fetched.append(
                dq.list_jobs(tx, f, now=now, before_seq=before, limit=PAGE + 1, floor_seq=floors[i])
            )
    merged = [(i, r) for i, rows in enumerate(fetched) for r in rows]
    merged.sort(key=lambda ir: (ir[1]["created_at"], ir[1]["seq"]), reverse=True)
    page = merged[:PAGE]
    nxt: list[str] = []
    for i, rows in enumerate(fetched):
        shown = [r["seq"] for s, r in page if s == i]
        if len(shown) == len(rows) and len(rows) <= PAGE:  # this shard's window is done
            floor = floors[i]
            nxt.append(str(floor) if floor else "-")
        elif len(shown) == len(rows):
            nxt.append(str(min(shown)))
        else:
            nxt.append(str(min(shown)) if shown else marks[i])
    jobs = []
    for i, r in page:
        preview = json.dumps(r["args"], separators=(",", ":"))
        jobs.append(
            {
                **r,
                "handle": src.handle(i, r["id"]),
                "preview": preview if len(preview) <= 120 else preview[:117] + "...",
                "state": _shown_state(r, now),
            }
        )
    scanned = [fl for fl in floors if fl is not None]
    return {
        "jobs": jobs,
        "next": None if set(nxt) == {"-"} else ".".join(nxt),
        "now": now,
        "window": SCAN_WINDOW if windowed else None,
        "scanned_to": min(scanned) if scanned else None,
    }


def _shown_state(row: dict[str, Any], now: float) -> str:
    if row["state"] == "ready" and row["run_at"] > now:
        return "scheduled"
    if row["state"] == "running" and (row["lease_expires_at"] or 0) <= now:
        return "expired"
    return str(row["state"])


def count_matching(src: Source, f: dq.JobFilter) -> int:
    now = src.now()
    total = 0
    for shard in src.shards:
        with shard.store.transaction(write=False) as tx:
            total += dq.count_matching(tx, f, now=now, cap=COUNT_CAP - total)
        if total >= COUNT_CAP:
            break
    return total


def job_page(src: Source, handle: str, *, children: bool = False) -> dict[str, Any]:
    """A job; its children (the jobs a replace made of it) only when asked: no index
    serves that search, so the page does not pay for it unasked."""
    shard, job_id = src.locate(handle)
    details = shard.details(handle)
    with shard.store.transaction(write=False) as tx:
        links = dq.job_links(tx, job_id, limit=50 if children else 0)
    index = src.shards.index(shard)
    if links["parent"]:
        links["parent"]["handle"] = src.handle(index, links["parent"]["id"])
    for child in links["children"]:
        child["handle"] = src.handle(index, child["id"])
    job = asdict(details)
    job["handle"] = src.handle(index, job_id)
    job["args_json"] = json.dumps(details.args, indent=2, sort_keys=True)
    return {
        "job": job,
        "links": links,
        "now": src.now(),
        "children_asked": children,
        "can_cancel": True,
    }


# -- actions -----------------------------------------------------------------------------
def act(src: Source, handle: str, action: str, who: str) -> str:
    """Run one operator action on a job; returns a line for the page, logs an audit line."""
    shard, job_id = src.locate(handle)
    now = src.now()
    if action == "redrive":
        shard.redrive(handle)
    elif action in ("perm_fail", "delete"):
        with shard.store.transaction() as tx:
            if action == "perm_fail":
                ok = dq.kill(
                    tx, job_id, now=now, message=f"perm-failed from the dashboard by {who}"
                )
            else:
                ok = dq.delete_job(tx, job_id)
        if not ok:
            state = shard.details(handle).state
            raise InvalidState(f"cannot {action.replace('_', '-')} job {handle}: it is {state}")
    elif action == "cancel":
        shard.cancel(handle)  # a running job's holder sees ctx.cancelled; its completion fails
    else:
        raise InvalidArgument(f"unknown action {action!r}")
    AUDIT.info("dashboard action=%s job=%s by=%s", action, handle, who)
    return f"{action.replace('_', '-')}: job {handle} done"


def bulk_redrive(src: Source, f: dq.JobFilter, who: str) -> int:
    """Redrive up to BULK_LIMIT perm-failed jobs that match ``f`` (oldest first)."""
    if f.state != "failed":
        raise InvalidArgument("bulk redrive works on failed jobs: filter the list by state=failed")
    now = src.now()
    total = 0
    for i, shard in enumerate(src.shards):
        with shard.store.transaction() as tx:
            ids = dq.matching_ids(tx, f, now=now, limit=BULK_LIMIT - total)
            n = dq.redrive_ids(tx, ids, now=now)
        total += n
        if n:
            AUDIT.info(
                "dashboard action=bulk_redrive shard=%d count=%d filter=%s by=%s",
                i,
                n,
                json.dumps(asdict(f), default=str),
                who,
            )
        if total >= BULK_LIMIT:
            break
    return total


# -- engine ------------------------------------------------------------------------------
def engine_state(src: Source) -> dict[str, Any]:
    """Queues (depths) and selectors (credits) of the queue engine, per shard."""
    queues: list[dict[str, Any]] = []
    selectors: list[dict[str, Any]] = []
    for i, shard in enumerate(src.shards):
        with shard.store.transaction(write=False) as tx:
            qs = eq.list_queues(tx)
            ss = eq.all_selectors(tx)
        prefix = f"{i}/" if src.sharded else ""
        queues += [{**q, "key": prefix + q["name"]} for q in qs]
        selectors += [
            {
                **s,
                "queue_key": prefix + s["queue"],
                "dest_key": (prefix + s["dest"])
                if s["dest_kind"] == "queue" and s["dest"]
                else None,
            }
            for s in ss
        ]
    return {"queues": queues, "selectors": selectors}
