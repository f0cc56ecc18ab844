"""The store's work per message the HTTP receiver takes in, on PostgreSQL: http schema 3
against 4 (a message handled at receipt tombstoned by a HOT update).

    .venv/bin/python bench/inbox_store.py [--batch 14 64] [--messages 8000] [--reps 3]
        [--out FILE]

Replays what one receiver batch writes (``http_inbox_queries.insert_received`` of the new
messages, then ``finish_handled`` of the ones handled at receipt, in one transaction) on
two fresh schemas, alternated: one migrated to today's version, one taken back to version
3's inbox (its work index's predicate on ``state``, the default fillfactor). Reported per
message: wall time of the batch's transaction, CPU of every PostgreSQL process (from
/proc), WAL bytes, and the share of tombstones written as HOT updates (``pg_walinspect``
records). The receiver's own Python and HTTP are not in it: ``bench/receiver_cpu.py``
measures those. Linux only.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import homing  # noqa: E402
from bench.grab_cost import PG  # noqa: E402
from bench.wal_records import scratch_schema  # noqa: E402
from homing.store import http_inbox_queries as iq  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
BODY = b'{"n": 1, "p": "' + b"x" * 80 + b'"}'
# http schema version 3's inbox, restored on a schema migrated to today's version
_VERSION_3 = (
    "ALTER TABLE homing_http_inbox RESET (fillfactor)",
    "DROP INDEX homing_http_inbox_work",
    "CREATE INDEX homing_http_inbox_work ON homing_http_inbox (next_attempt_at) "
    "WHERE state = 'received' AND next_attempt_at IS NOT NULL",
)
_UPDATES = (
    "SELECT record_type, count(*) FROM pg_get_wal_records_info(%s, %s) "
    "WHERE resource_manager = 'Heap' AND record_type IN ('UPDATE', 'HOT_UPDATE') GROUP BY 1"
)


def postgres_cpu() -> float:
    """CPU seconds of every PostgreSQL process of the machine so far."""
    total = 0
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            stat = open(path).read()
        except OSError:
            continue
        if "(postgres)" in stat:
            fields = stat.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def one_run(version: int, batch: int, messages: int) -> dict[str, float]:
    with scratch_schema("inbox") as (admin, conn, schema):
        db = homing.connect(f"{PG}?schema={schema}")
        assert isinstance(db, homing.Database)
        try:
            if version == 3:
                for ddl in _VERSION_3:
                    conn.execute(ddl)

            def receive_batch() -> None:
                now = time.time()
                rows = [
                    iq.received_row(
                        msg_id=homing.uuid7(),
                        path="/node",
                        mode="send",
                        body_hash=hashlib.sha256(BODY).hexdigest(),
                        content_type="application/json",
                        body=BODY,
                        response_url=None,
                        now=now,
                        work_at=None,
                    )
                    for _ in range(batch)
                ]
                with db.store.transaction() as tx:
                    iq.insert_received(tx, rows)
                    iq.finish_handled(tx, [r.id for r in rows], now=now)

            for _ in range(max(5, 200 // batch)):
                receive_batch()
            rounds = max(1, messages // batch)
            start = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
            cpu, began = postgres_cpu(), time.perf_counter()
            for _ in range(rounds):
                receive_batch()
            wall, cpu = time.perf_counter() - began, postgres_cpu() - cpu
            end = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
            wal = admin.execute("SELECT %s::pg_lsn - %s::pg_lsn", (end, start)).fetchone()[0]  # type: ignore[index]
            kinds = dict(admin.execute(_UPDATES, (start, end)).fetchall())
        finally:
            db.close()
    n = rounds * batch
    updates = kinds.get("UPDATE", 0) + kinds.get("HOT_UPDATE", 0)
    return {
        "wall_us": wall / n * 1e6,
        "pg_cpu_us": cpu / n * 1e6,
        "wal_bytes": int(wal) / n,
        "hot_share": kinds.get("HOT_UPDATE", 0) / updates if updates else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[14, 64])
    ap.add_argument("--messages", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    lines = [
        f"# bench/inbox_store.py --batch {' '.join(map(str, args.batch))} --messages "
        f"{args.messages} --reps {args.reps}  "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load:.2f})",
        "per message: wall us / PostgreSQL CPU us / WAL bytes / tombstones HOT",
    ]
    print("\n".join(lines), flush=True)
    for batch in args.batch:
        runs: dict[int, list[dict[str, float]]] = {3: [], 4: []}
        for rep in range(args.reps):
            for version in (3, 4) if rep % 2 == 0 else (4, 3):
                res = one_run(version, batch, args.messages)
                runs[version].append(res)
                line = (
                    f"batch {batch:3d} rep {rep + 1} http v{version}: {res['wall_us']:6.1f} / "
                    f"{res['pg_cpu_us']:5.1f} / {res['wal_bytes']:5.0f} B / "
                    f"{res['hot_share']:4.0%}"
                )
                lines.append(line)
                print(line, flush=True)
        med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
        line = (
            f"batch {batch:3d} medians v4/v3: wall {med[4]['wall_us'] / med[3]['wall_us']:.2f}x, "
            f"PostgreSQL CPU {med[4]['pg_cpu_us'] / med[3]['pg_cpu_us']:.2f}x, "
            f"WAL {med[4]['wal_bytes'] / med[3]['wal_bytes']:.2f}x "
            f"({med[3]['wal_bytes']:.0f} -> {med[4]['wal_bytes']:.0f} B)"
        )
        lines.append(line)
        print(line, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
