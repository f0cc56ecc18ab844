"""Helpers shared by the harness and the drivers: payloads, shared counters, resets, probes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PG_URL = os.environ.get(
    "HOMING_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/homing_bench"
)
REDIS_URL = os.environ.get("HOMING_BENCH_REDIS", "redis://127.0.0.1:6379/13")
AMQP_URL = os.environ.get("HOMING_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = os.environ.get("HOMING_BENCH_NATS", "nats://127.0.0.1:4222")
PAYLOAD_BYTES = 100
JOB_TYPE = "bench_noop"
QUEUE = "homing_bench"

FORK = mp.get_context("fork")


def payload(i: int) -> dict[str, Any]:
    """A job argument whose JSON encoding is exactly ``PAYLOAD_BYTES`` bytes; ``i`` is its seq."""
    base = len(json.dumps({"i": i, "p": ""}, separators=(",", ":")))
    return {"i": i, "p": "x" * max(0, PAYLOAD_BYTES - base)}


def payload_bytes(i: int) -> bytes:
    return json.dumps(payload(i), separators=(",", ":")).encode()


def seq_of(data: Any) -> int:
    """The seq number of a payload (dict, JSON text or bytes)."""
    if isinstance(data, bytes | bytearray | memoryview):
        data = bytes(data).decode()
    if isinstance(data, str):
        data = json.loads(data)
    return int(data["i"])


# -- shared state between the cell process, its producer and its consumers ---------------
@dataclass
class Shared:
    """Shared-memory counters. Each consumer process owns one slot: count, first, last."""

    consumers: int
    max_jobs: int
    slots: Any = field(init=False)
    starts: Any = field(init=False)
    commits: Any = field(init=False)
    ready: Any = field(init=False)
    go: Any = field(init=False)
    produced: Any = field(init=False)

    def __post_init__(self) -> None:
        self.slots = FORK.Array("d", 3 * self.consumers, lock=False)
        self.starts = FORK.Array("d", self.max_jobs, lock=False)
        self.commits = FORK.Array("d", self.max_jobs, lock=False)
        self.ready = FORK.Array("b", self.consumers, lock=False)
        self.go = FORK.Event()
        self.produced = FORK.Value("q", 0, lock=False)

    def total(self) -> int:
        return int(sum(self.slots[3 * k] for k in range(self.consumers)))

    def all_started(self) -> bool:
        """Has every consumer completed at least one job?"""
        return all(self.slots[3 * k] for k in range(self.consumers))

    def span(self) -> tuple[float, float]:
        firsts = [self.slots[3 * k + 1] for k in range(self.consumers) if self.slots[3 * k]]
        lasts = [self.slots[3 * k + 2] for k in range(self.consumers) if self.slots[3 * k]]
        return (min(firsts), max(lasts)) if firsts else (0.0, 0.0)


class Tally:
    """What a consumer process calls for every job it handled (its own slot, no lock)."""

    shared: Shared | None = None
    slot: int = 0
    track_starts: bool = False

    @classmethod
    def bind(cls, shared: Shared, slot: int, track_starts: bool) -> None:
        cls.shared, cls.slot, cls.track_starts = shared, slot, track_starts

    @classmethod
    def started(cls, data: Any) -> None:
        """The handler begins (the no-op): record the start time for latency runs."""
        sh = cls.shared
        if sh is None or not cls.track_starts:
            return
        i = seq_of(data)
        if 0 <= i < sh.max_jobs and sh.starts[i] == 0.0:
            sh.starts[i] = time.time()

    @classmethod
    def done(cls, n: int = 1) -> None:
        sh = cls.shared
        if sh is None:
            return
        base = 3 * cls.slot
        now = time.time()
        if sh.slots[base] == 0:
            sh.slots[base + 1] = now
        sh.slots[base] += n
        sh.slots[base + 2] = now


# -- PostgreSQL ---------------------------------------------------------------------------
def pg_admin_url(url: str = PG_URL) -> tuple[str, str]:
    """(URL of the ``postgres`` maintenance database, name of the bench database)."""
    head, _, dbname = url.rpartition("/")
    dbname = dbname.split("?")[0]
    return f"{head}/postgres", dbname


def reset_postgres(url: str = PG_URL) -> None:
    """Empty the bench database: every run starts with no tables, types or functions.

    The database is created once; later resets drop its non-system schemas (with
    everything in them) and re-create ``public``. (DROP DATABASE would force a checkpoint,
    slow and disturbing to everyone else on the server.)"""
    import psycopg
    from psycopg import sql

    admin, name = pg_admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
    with psycopg.connect(url, autocommit=True) as conn:
        schemas = [
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
                "AND nspname <> 'information_schema'"
            ).fetchall()
        ]
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        conn.execute("CREATE SCHEMA public")


PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "wal_buffers",
    "commit_delay",
    "max_connections",
    "checkpoint_timeout",
    "max_wal_size",
    "data_directory",
)


def postgres_settings(url: str = PG_URL) -> dict[str, str]:
    import psycopg

    admin, _ = pg_admin_url(url)
    out = {}
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in PG_SETTINGS:
            try:
                out[name] = str(conn.execute(f"SHOW {name}").fetchone()[0])
            except psycopg.Error as exc:
                out[name] = f"? ({exc.__class__.__name__})"
    return out


# -- the disk -----------------------------------------------------------------------------
def bench_dir() -> Path:
    """Where SQLite files live: on the same filesystem as PostgreSQL's data (/ here)."""
    base = Path(os.environ.get("HOMING_BENCH_DIR", tempfile.gettempdir()))
    path = base / "homing-bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fsync_probe(directory: Path, seconds: float = 0.5) -> dict[str, float]:
    """fdatasync()s per second of a 4 KiB overwrite, on the filesystem under test."""
    path = directory / f"fsync-probe-{os.getpid()}.tmp"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    block = os.urandom(4096)
    n = 0
    try:
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            os.pwrite(fd, block, (n % 16) * 4096)
            os.fdatasync(fd)
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        elapsed = now - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"fdatasync_per_s": n / elapsed, "seconds": elapsed, "count": n}


# -- statistics ---------------------------------------------------------------------------
def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """``rev`` checked out in a temporary git worktree, removed afterwards: the "before"
    side of the A/B scripts (``bench.ab``, ``api_cpu``, ``strict_json``, ``receiver_cpu``)."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="homing-rev-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "-q", "--detach", str(tree), rev],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
                check=False,
            )


def script_json(src: Path, script: str, *args: str, timeout: float = 600) -> Any:
    """Run ``python -c script *args`` with ``src`` (a source tree's ``src``) first on the
    path, and return the JSON object its last line of output prints: one side of an A/B
    cell (``api_cpu``, ``grab_cases``)."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_header(what: str) -> str:
    """The first line of a result block: the time, the load average and what ran."""
    from datetime import UTC, datetime

    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return f"## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {load}, {what}"


def append_result(path: Path, lines: list[str]) -> None:
    """Append a result block (and a blank line) to a results file under bench/results."""
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n\n")


def proc_stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds: user + system) of a live process, from /proc."""
    ppid, _, cpu = proc_stat_started(pid)
    return ppid, cpu


def proc_stat_started(pid: int) -> tuple[int, int, float]:
    """(parent pid, start time in clock ticks since boot, CPU seconds) of a live process:
    the start time tells a reused pid apart."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return int(fields[1]), int(fields[19]), cpu


def machine_jiffies() -> tuple[int, int]:
    """(all, idle or waiting on I/O) CPU clock ticks of the machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    return sum(fields), fields[3] + fields[4]
