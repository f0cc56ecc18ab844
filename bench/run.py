"""The harness: ``python -m bench [--smoke] [--reps N] [--only GROUP ...] [--out DIR]``.

Each group is one workload (enqueue, drain, cycle, latency) at one batch size, run on a
list of systems. A repetition runs every group once; inside a group the systems run one
after the other, in an order rotated by one each repetition (A B C, B C A, C A B ...), so
every system is measured in the same windows as the others. The disk's fdatasync rate is
probed before each repetition and each group. Every measurement is a fresh process that
resets its store first. Ratios are medians of the per-repetition ratios (each a pair of
runs made minutes apart at most), so slow drift of the machine cancels out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.common import PG_URL, REDIS_URL, bench_dir, fsync_probe, median, postgres_settings
from bench.drivers import REGISTRY, driver_class

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"

PG_JOBS = ["homing-pg", "homing-pg-nd", "homing-worker-pg", "raw-pg", "pgqueuer", "procrastinate"]
# PostgreSQL peers with a slow start (DBOS launch, chancy's spawned pool: ~5 s a cell), so
# kept out of the smoke set. Neither has a consumer-side batch (cycle-100 / drain-100).
PG_PEERS = ["dbos", "chancy"]
SQLITE_JOBS = [
    "homing-sqlite",
    "homing-sqlite-nd",
    "homing-worker-sqlite",
    "raw-sqlite",
    "huey-sqlite",
    "litequeue",
]
OTHERS = ["celery-redis", "rq-redis", "rabbitmq", "nats-js"]
# The job API's loop with each completion and the next grab in one transaction (the loop
# docs/jobs.md recommends for a consumer of one's own): in the full cycles only.
JOINED = ["homing-sqlite-joined", "homing-pg-joined"]
BATCHED = ["homing-pg", "homing-pg-nd", "raw-pg", "pgqueuer"] + [
    "homing-sqlite",
    "homing-sqlite-nd",
    "raw-sqlite",
]
TRANSPORTS = ["zmq-pushpull", "zmq-dealer-router", "starlette"]
LATENCY = [
    "homing-pg",
    "homing-pg-nd",
    "homing-worker-pg",
    "homing-sqlite",
    "pgqueuer",
    "procrastinate",
    *PG_PEERS,
]
BATCH = 100
# Left out of drain-1 to keep the default set short: Celery, RQ and litequeue cost the most
# start-up for little news (their full cycle says it); the non-durable homing drains are in
# drain-100.
# chancy is left out because its default worker cannot drain a backlog: without a push
# (NOTIFY) it fetches at most its concurrency (2 jobs) per 5 s poll (eager_polling=False),
# so 1,500 jobs would take half an hour; the window would measure its first few jobs.
SLOW_DRAIN = (
    "celery-redis",
    "rq-redis",
    "litequeue",
    "homing-pg-nd",
    "homing-sqlite-nd",
    "chancy",
)


@dataclass
class Group:
    name: str
    workload: str
    batch: int
    systems: list[str]
    params: dict[str, Any] = field(default_factory=dict)


def plan(smoke: bool) -> list[Group]:
    """The default set (about 12 minutes with 3 repetitions) or the smoke set (< 60 s)."""
    per_job = PG_JOBS + SQLITE_JOBS + OTHERS
    if smoke:
        cyc = {"seconds": 0.3, "warmup_s": 0.1}
        return [
            Group("cycle-1", "cycle", 1, per_job + TRANSPORTS, cyc),
            Group("cycle-100", "cycle", BATCH, ["homing-sqlite", "raw-sqlite", "homing-pg"], cyc),
            Group(
                "drain-1",
                "drain",
                1,
                ["homing-sqlite", "homing-pg"],
                {"jobs": 100, "preload_s": 2, "seconds": 2},
            ),
            Group("enqueue-1", "enqueue", 1, ["homing-sqlite", "homing-pg"], {"seconds": 0.2}),
            Group("enqueue-100", "enqueue", BATCH, ["homing-sqlite"], {"seconds": 0.2}),
            Group("latency-1", "latency", 1, ["homing-pg", "homing-sqlite"], {"seconds": 0.4}),
        ]
    per_job = PG_JOBS + PG_PEERS + SQLITE_JOBS + OTHERS
    cyc = {"seconds": 2.0, "warmup_s": 0.3}
    drain = {"jobs": 1500, "preload_s": 2.5, "seconds": 2.5}
    # Timed once every worker process has completed a job ("steady"), over a backlog that
    # outlasts their start-up (see drivers/__main__.py:_steady_rate).
    scale = {"jobs": 30000, "preload_s": 10.0, "seconds": 6.0, "steady": True}
    enq = {"seconds": 0.8}
    # Enqueue-only does not involve the consumers: homing's worker adds nothing there.
    producers = [s for s in per_job if "worker" not in s]
    return [
        Group("cycle-1", "cycle", 1, per_job + JOINED, cyc),
        Group("cycle-100", "cycle", BATCH, BATCHED + JOINED, cyc),
        Group("latency-1", "latency", 1, LATENCY, {"seconds": 2.0}),
        Group("drain-1", "drain", 1, [s for s in per_job if s not in SLOW_DRAIN], drain),
        Group("drain-100", "drain", BATCH, BATCHED, {**drain, "jobs": 5000}),
        Group("enqueue-1", "enqueue", 1, producers, enq),
        Group(
            "enqueue-100",
            "enqueue",
            BATCH,
            [s for s in producers if driver_class(s).can_batch_enqueue()],
            enq,
        ),
        Group("transport-1", "cycle", 1, TRANSPORTS, {**cyc, "max_backlog": 5000}),
        # Scaling of homing's worker with processes: 1, 2 and 4 worker processes draining
        # the same backlog. Not a full cycle: there one producer inserting a job per commit
        # sets the pace (the backlog stays near 0), and extra worker processes can only take
        # CPU from it. The raw loop (one commit per job) shows what the machine gives.
        *(
            Group(
                f"workers-{n}",
                "drain",
                1,
                ["homing-worker-pg", "raw-pg"],
                {**scale, "consumers": n},
            )
            for n in (1, 2, 4)
        ),
    ]


REDIS_DB = {"celery-redis": 13, "rq-redis": 14}


def cell_env(system: str, root: Path = ROOT) -> dict[str, str]:
    """Each system gets a database of its own (and a Redis db), so cells never collide.

    ``root`` is the source tree whose code the cell runs (``bench.ab`` passes a worktree
    of another revision); its ``src`` comes before the installed homing."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root), str(root / "src"), os.environ.get("PYTHONPATH", "")]
    )
    head, _, db = PG_URL.rpartition("/")
    db, _, query = db.partition("?")
    suffix = system.replace("-", "_")
    env["HOMING_BENCH_POSTGRES"] = f"{head}/{db}_{suffix}" + (f"?{query}" if query else "")
    rhead, _, _ = REDIS_URL.rpartition("/")
    env["HOMING_BENCH_REDIS"] = f"{rhead}/{REDIS_DB.get(system, 15)}"
    return env


def run_cell(spec: dict[str, Any], log: Any, timeout: float, root: Path = ROOT) -> dict[str, Any]:
    """One cell in a process of its own, on the code in ``root``; its result record."""
    cmd = [sys.executable, "-m", "bench.drivers", json.dumps(spec)]
    started = time.monotonic()
    env = cell_env(spec["system"], root)
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=root, env=env
        )
        out, err = proc.stdout, proc.stderr
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"ok": False, "error": "no result line"}
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        err = exc.stderr if isinstance(exc.stderr, str) else ""
        result = {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    log.write(f"--- {json.dumps(spec)}\n{err[-4000:]}\n")
    log.flush()
    if not result.get("ok"):
        result["stderr_tail"] = err[-1500:]
    result["wall_s"] = time.monotonic() - started
    return result


# The HTTP and messenger parts have benchmark scripts of their own (their owners'), which
# pair homing with the bare transport inside one run; the harness runs them once per
# repetition and takes both figures of each pair, so their ratio enters the targets.
EXTERNAL: dict[str, list[str]] = {
    "messenger": ["bench/messenger.py", "--n", "1500", "--durable-n", "200"],
    "http": ["bench/http.py", "--n", "300", "--only", "none"],
}
EXTERNAL_SYSTEMS = [
    "homing-messenger",
    "zmq-pushpull (messenger.py)",
    "homing-http",
    "starlette (http.py)",
]


def run_external(name: str, out: Path, log: Any, timeout: float) -> list[dict[str, Any]]:
    """Run one external script; return cells (system, rate) for the pair it measured."""
    # A directory of its own: bench/results/<name>.json belongs to the script's owner.
    path = out / "external" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    cmd = [sys.executable, *EXTERNAL[name], "--out", str(path)]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=cell_env(name)
        )
        log.write(f"--- {' '.join(cmd)} (exit {proc.returncode})\n{proc.stderr[-4000:]}\n")
        error = None if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:.0f} s"
    wall = time.monotonic() - started
    names = (
        ("homing-messenger", "zmq-pushpull (messenger.py)")
        if name == "messenger"
        else ("homing-http", "starlette (http.py)")
    )
    try:
        if error:
            raise RuntimeError(error)
        doc = json.loads(path.read_text())
        if name == "messenger":
            rows = {
                r["system"]: r
                for r in doc["results"]
                if r["transport"] == "tcp" and r["workload"] == "one-way"
            }
            pair = (rows["homing-memory"]["rate"], rows["zmq-push-pull"]["rate"])
            what = "tcp one-way, homing messenger in memory vs PUSH/PULL"
        else:
            rows = {r["name"]: r for r in next(iter(doc["runs"].values()))["results"]}
            pair = (
                rows["homing receiver (Option 2)"]["msgs_per_s"],
                rows["plain POST (homing's client)"]["msgs_per_s"],
            )
            what = (
                "the receiver alone: Option 2 messages (stored durably, then handled) vs "
                "plain POSTs to a no-op endpoint of the same server, same HTTP client, "
                "alternated in rounds"
            )
        return [
            {"system": names[0], "ok": True, "rate": pair[0], "wall_s": wall, "durability": what},
            {"system": names[1], "ok": True, "rate": pair[1], "wall_s": wall, "durability": what},
        ]
    except Exception as exc:
        err = f"{name}: {type(exc).__name__}: {exc}"
        return [{"system": n, "ok": False, "error": err, "wall_s": wall} for n in names]


def run_cell_retry(spec: dict[str, Any], log: Any, timeout: float) -> dict[str, Any]:
    """A failed cell is run once more (the server is shared: another test may restart
    PostgreSQL or terminate our connections); the first error is kept in the record."""
    res = run_cell(spec, log, timeout)
    if res.get("ok"):
        return res
    again = run_cell(spec, log, timeout)
    again["retried_after"] = res.get("error")
    return again


def collect_settings() -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "bench_dir": str(bench_dir()),
    }
    try:
        out["postgres"] = postgres_settings()
    except Exception as exc:
        out["postgres"] = {"error": str(exc)}
    try:
        from bench.drivers.celery_q import redis_settings

        out["redis"] = redis_settings()
    except Exception as exc:
        out["redis"] = {"error": str(exc)}
    try:
        load = os.getloadavg()
        out["loadavg_at_start"] = [round(x, 2) for x in load]
    except OSError:
        pass
    return out


def write_outputs(doc: dict[str, Any], out: Path) -> None:
    doc["summary"] = report.summarize(doc)
    doc["targets"] = report.check_targets(doc)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "results.md").write_text(report.markdown(doc))
    try:
        report.chart(doc, out / "results.png")
    except Exception as exc:  # the numbers matter more than the picture
        print(f"chart failed: {exc}", file=sys.stderr)
    print()
    print(report.targets_text(doc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="everything tiny, once (< 60 s)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3; smoke 1)")
    ap.add_argument("--only", nargs="*", default=None, help="group names to run (e.g. cycle-1)")
    ap.add_argument("--systems", nargs="*", default=None, help="restrict to these systems")
    ap.add_argument("--consumers", type=int, default=2, help="consumer processes (default 2)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    ap.add_argument(
        "--external-reps",
        type=int,
        default=1,
        help="repetitions that also run bench/http.py and bench/messenger.py (default 1; "
        "each pairs homing with its bare transport inside one run)",
    )
    ap.add_argument(
        "--report-only",
        type=Path,
        default=None,
        metavar="JSON",
        help="rewrite the targets, table and chart of an earlier results.json into --out",
    )
    ap.add_argument(
        "--no-external",
        action="store_true",
        help="skip bench/http.py and bench/messenger.py (skipped anyway with --smoke)",
    )
    ap.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="cells run at once (default 1; smoke 4). Above 1 the numbers are not comparable",
    )
    args = ap.parse_args(argv)

    if args.report_only:
        doc = json.loads(args.report_only.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        write_outputs(doc, args.out)
        return 0
    reps = args.reps if args.reps is not None else (1 if args.smoke else 3)
    parallel = args.parallel or (4 if args.smoke else 1)
    groups = plan(args.smoke)
    if not (args.smoke or args.no_external or args.systems):
        groups.append(Group("external", "external", 1, list(EXTERNAL_SYSTEMS)))
    if args.only:
        groups = [g for g in groups if g.name in args.only]
    if args.systems:
        for g in groups:
            g.systems = [s for s in g.systems if s in args.systems]
        groups = [g for g in groups if g.systems]
    for g in groups:
        unknown = [s for s in g.systems if s not in REGISTRY and g.workload != "external"]
        if unknown:
            ap.error(f"unknown systems {unknown}")
    if args.list:
        for g in groups:
            print(f"{g.name:12} {g.workload:8} batch={g.batch:<4} {' '.join(g.systems)}")
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    t_start = time.monotonic()
    doc: dict[str, Any] = {
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": started.isoformat(timespec="seconds"),
        "smoke": args.smoke,
        "reps": reps,
        "consumers": args.consumers,
        "parallel": parallel,
        "batch": BATCH,
        "groups": [asdict(g) for g in groups],
        "settings": collect_settings(),
        "probes": [],
        "cells": [],
    }
    probe_dir = bench_dir()
    cycle_rates: dict[tuple[int, str], float] = {}
    timeout = 60.0 if args.smoke else 120.0
    with open(args.out / "bench.log", "w") as log:
        for rep in range(reps):
            probe = fsync_probe(probe_dir, 0.3 if args.smoke else 0.5)
            doc["probes"].append({"rep": rep, "group": None, **probe})
            print(f"rep {rep + 1}/{reps}: fdatasync {probe['fdatasync_per_s']:.0f}/s", flush=True)
            for g in groups:
                if g.workload == "external":
                    if rep >= args.external_reps:
                        continue
                    for name in EXTERNAL:
                        for res in run_external(name, args.out, log, 180.0):
                            doc["cells"].append({"group": g.name, "rep": rep, **res})
                            print("  " + report.cell_line(g.name, res["system"], res), flush=True)
                    continue
                if rep > 0 or g is not groups[0]:
                    probe = fsync_probe(probe_dir, 0.2)
                    doc["probes"].append({"rep": rep, "group": g.name, **probe})
                k = rep % len(g.systems)
                order = g.systems[k:] + g.systems[:k]
                specs = []
                for system in order:
                    spec: dict[str, Any] = {
                        "system": system,
                        "workload": g.workload,
                        "batch": g.batch,
                        "consumers": args.consumers,
                        **g.params,
                    }
                    if g.workload == "latency":
                        peak = cycle_rates.get((rep, system)) or median(
                            [v for (r, s), v in cycle_rates.items() if s == system]
                        )
                        if not peak or peak != peak:
                            peak = 100.0
                        spec["rate"] = max(10.0, min(2000.0, peak / 2))
                        spec["max_jobs"] = 20000
                    specs.append(spec)
                with ThreadPoolExecutor(parallel) as pool:
                    results = list(pool.map(lambda sp: run_cell_retry(sp, log, timeout), specs))
                for spec, res in zip(specs, results, strict=True):
                    system = spec["system"]
                    if g.workload == "cycle" and g.batch == 1 and res.get("ok"):
                        cycle_rates[(rep, system)] = res["rate"]
                    doc["cells"].append(
                        {"group": g.name, "rep": rep, "system": system, "spec": spec, **res}
                    )
                    print("  " + report.cell_line(g.name, system, res), flush=True)
    doc["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    doc["elapsed_s"] = time.monotonic() - t_start
    write_outputs(doc, args.out)
    print(f"\nwrote {args.out}/results.json, results.md, results.png in {doc['elapsed_s']:.0f} s")
    return 0
