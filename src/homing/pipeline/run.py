"""The pipeline end to end: data, receivers, workers, Spark stages, chaos, check, report."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from homing.database import Database, ShardedDatabase, connect
from homing.errors import ConfigurationError, HomingError
from homing.jobs import JobSpec
from homing.pipeline import data
from homing.pipeline.data import HOOK_CHANNELS, HOOK_RECEIVED
from homing.pipeline.stages import (
    EVENT,
    NOTIFICATION,
    SUBSCRIPTION,
    StageStats,
    fan_out_events,
    fan_out_subscriptions,
)
from homing.spark import check_session, register
from homing.store import http_queries as hq
from homing.store import spark_queries as sq


@dataclass
class PipelineConfig:
    db: str
    master: str = "local[*]"
    events: int = 20
    subscribers: int = 1000
    workers: int = 3
    concurrency: int = 8
    kills: int = 3
    lock_for: float = 5.0
    retry_scale: float = 1 / 600
    temp_pct: int = 3
    chunk: int = 20_000
    data_dir: Path = Path("pipeline-data")
    run_id: str = ""
    timeout: float = 1800.0
    progress: bool = True
    kill_executor: bool = False  # SIGKILL one executor JVM while a replace is staging


@dataclass
class Report:
    run: str
    db: str
    master: str
    expected: data.Expected
    stages: list[dict[str, Any]] = field(default_factory=list)
    deliveries: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    spark: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks.get("ok"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "db": self.db,
            "master": self.master,
            "expected": self.expected.__dict__,
            "stages": self.stages,
            "deliveries": self.deliveries,
            "checks": self.checks,
            "spark": self.spark,
            "seconds": round(self.seconds, 2),
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HomingError(f"the receiver process exited early (code {proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise HomingError(f"the local receiver did not listen on port {port} within {timeout:g}s")


def java_missing() -> str | None:
    """How to install Java when it is missing (Spark needs Java 17 or 21), else None."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return None
    return (
        "Spark needs Java 17: install it with `sudo apt-get install -y openjdk-17-jre-headless` "
        "(Debian/Ubuntu), `brew install openjdk@17` (macOS) or `sudo dnf install "
        "java-17-openjdk-headless` (Fedora), or set JAVA_HOME to a Java 17 installation"
    )


def spark_session(master: str, *, hold_first_write_ms: int = 0) -> Any:
    """A SparkSession for the pipeline. ``hold_first_write_ms``: each executor Python
    worker's first write task waits that long after staging its rows (a failpoint), so that
    ``--kill-executor`` lands between the tasks' writes and the driver's commit."""
    problem = java_missing()
    if problem:
        raise ConfigurationError(problem)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("homing-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # rich draws the progress
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
    )
    if master.startswith(("spark://127.0.0.1:", "spark://localhost:")):
        # a cluster on this host: executors must reach the driver on the loopback address
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if hold_first_write_ms:
        builder = builder.config(
            "spark.executorEnv.HOMING_FAILPOINTS",
            f"spark.write.task_done=1*sleep({int(hold_first_write_ms)})",
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Fleet:
    """The delivery worker processes; kills some with SIGKILL and replaces them."""

    def __init__(
        self,
        cfg: PipelineConfig,
        smtp_port: int,
        http_port: int,
        logs: Path,
        shards: list[str] | None = None,
    ) -> None:
        self.cfg = cfg
        # On a sharded store each worker serves one shard (its jobs, and the outbox rows
        # their transactions wrote there): at least one worker per shard.
        self.shards = shards or [cfg.db]
        self.args = [
            sys.executable,
            "-m",
            "homing.pipeline.deliver",
            "--smtp-port",
            str(smtp_port),
            "--http-port",
            str(http_port),
            "--concurrency",
            str(cfg.concurrency),
            "--lock-for",
            str(cfg.lock_for),
            "--retry-scale",
            str(cfg.retry_scale),
            # messages may wait in this run's backlog longer than the compressed
            # "4.5 days": give up no earlier than the run's own timeout
            "--give-up-after",
            str(max(4.5 * 86400 * cfg.retry_scale, cfg.timeout)),
        ]
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.serves: dict[subprocess.Popen[bytes], str] = {}
        self.killed = 0
        self.started = 0

    def spawn(self, shard: str | None = None) -> None:
        if shard is None:  # the first shard with the fewest workers
            serving = [self.serves[p] for p in self.procs]
            shard = min(self.shards, key=serving.count)
        log = (self.logs / f"worker-{self.started}.log").open("ab")
        proc = subprocess.Popen(
            [*self.args, "--db", shard], stdout=log, stderr=subprocess.STDOUT, env=_child_env()
        )
        self.procs.append(proc)
        self.serves[proc] = shard
        self.started += 1

    def start(self) -> None:
        for i in range(max(self.cfg.workers, len(self.shards))):
            self.spawn(self.shards[i % len(self.shards)])

    def kill_one(self) -> None:
        alive = [p for p in self.procs if p.poll() is None]
        if not alive:
            return
        victim = random.choice(alive)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.procs.remove(victim)
        self.killed += 1
        self.spawn(self.serves.pop(victim))

    def respawn_dead(self) -> int:
        dead = [p for p in self.procs if p.poll() is not None]
        for p in dead:
            self.procs.remove(p)
            self.spawn(self.serves.pop(p))
        return len(dead)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _read_receipts(logs: list[Path], hooks: Database, run: str) -> dict[str, Any]:
    """Every delivery's effect, counted: emails from the SMTP server's receipt log, webhooks
    and IM from the ``WebhookReceived`` rows in the webhook receiver's store; refusals and
    lost answers from both receivers' logs."""
    new: dict[str, int] = {}
    dups = temps = lost_acks = 0
    by_channel: dict[str, int] = {}
    first = last = None
    lines = (ln for p in logs if p.exists() for ln in p.read_text().splitlines())
    for rec in map(json.loads, lines):
        if rec["kind"] == "new":
            new[rec["id"]] = new.get(rec["id"], 0) + 1
            by_channel[rec["ch"]] = by_channel.get(rec["ch"], 0) + 1
            first = rec["t"] if first is None else min(first, rec["t"])
            last = rec["t"] if last is None else max(last, rec["t"])
        elif rec["kind"] == "dup":
            dups += 1
        elif rec["kind"] == "temp":
            temps += 1
        elif rec["kind"] == "ack_lost":
            lost_acks += 1
    with hooks.store.transaction(write=False) as tx:
        per_note = sq.run_arg_counts(tx, run, HOOK_RECEIVED, "notification_id")
        per_channel = sq.run_arg_counts(tx, run, HOOK_RECEIVED, "channel")
    for note_id, n, lo, hi in per_note:
        new[note_id] = new.get(note_id, 0) + n
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    for channel, n, _, _ in per_channel:
        by_channel[channel] = by_channel.get(channel, 0) + n
    return {
        "new": new,
        "duplicates_suppressed": dups,
        "temporary_refusals": temps,
        "acks_lost": lost_acks,
        "by_channel": by_channel,
        "first": first,
        "last": last,
    }


def _shards(db: Database | ShardedDatabase) -> list[Database]:
    return list(db.shards) if isinstance(db, ShardedDatabase) else [db]


def _add(total: dict[Any, int], part: dict[Any, int]) -> dict[Any, int]:
    for k, v in part.items():
        total[k] = total.get(k, 0) + v
    return total


def _http_state(
    db: Database | ShardedDatabase, hooks: Database
) -> tuple[dict[str, int], dict[str, int]]:
    """(sender's outbox over every shard, receiver's inbox) message counts by state."""
    outbox: dict[str, int] = {}
    for shard in _shards(db):
        with shard.store.transaction(write=False) as tx:
            _add(outbox, hq.outbox_counts(tx))
    with hooks.store.transaction(write=False) as tx:
        inbox = hq.inbox_counts(tx)
    return outbox, inbox


def _counts(db: Database | ShardedDatabase, run: str) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for shard in _shards(db):
        with shard.store.transaction(write=False) as tx:
            _add(out, sq.run_counts(tx, run))
    return out


def _stats(db: Database | ShardedDatabase) -> dict[str, dict[str, Any]]:
    return {row["type"]: row for row in db.stats(window=5.0)}


def run_pipeline(cfg: PipelineConfig, *, spark: Any = None, console: Any = None) -> Report:
    """Run seed 002's fan-out once, end to end, and check every delivery happened once."""
    from rich.console import Console

    console = console or Console()
    if cfg.events < 1 or cfg.subscribers < 1:
        raise ConfigurationError("--events and --subscribers must be at least 1")
    killing = cfg.kill_executor
    if killing and (cfg.master == "local" or cfg.master.startswith("local[")):
        raise ConfigurationError(
            "--kill-executor needs executors in JVMs of their own: a spark:// master "
            "(make run-cluster) or local-cluster[N,C,MB], not " + repr(cfg.master)
        )
    run = cfg.run_id or uuid.uuid4().hex[:12]
    data_dir = cfg.data_dir.resolve()
    work = data_dir / f"run-{run}"
    work.mkdir(parents=True, exist_ok=True)
    url = cfg.db
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        url = "sqlite:///" + os.path.abspath(url[len("sqlite:///") :])
    cfg.db = url

    t0 = time.monotonic()
    db = connect(url.split(",") if "," in url else url)
    subscriptions, subscribers, expected = data.write_tables(data_dir, cfg.events, cfg.subscribers)
    report = Report(run=run, db=url, master=cfg.master, expected=expected)

    smtp_port, http_port = free_port(), free_port()
    logs = [work / "smtp-receipts.jsonl", work / "network.jsonl"]
    hooks = connect(f"sqlite:///{work / 'webhook-receiver.db'}")  # migrated before the sinks
    assert isinstance(hooks, Database)

    def receiver(service: str, log: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "homing.pipeline.sinks", service, "--log", str(log)]
            + ["--port", str(port), "--temp-pct", str(cfg.temp_pct), *extra],
            stdout=(work / f"{service}.log").open("ab"),
            stderr=subprocess.STDOUT,
            env=_child_env(),
        )

    sinks = [
        receiver("smtp", logs[0], smtp_port),
        receiver("hooks", logs[1], http_port, "--hooks-db", hooks.url),
    ]
    fleet = Fleet(cfg, smtp_port, http_port, work, [s.url for s in _shards(db)])
    own_spark = spark is None
    try:
        _wait_port(smtp_port, sinks[0])
        _wait_port(http_port, sinks[1])
        fleet.start()
        db.insert_many(
            [
                JobSpec(
                    EVENT,
                    {"run": run, "event_id": i, "topic": i, "actor": f"user{i}", "verb": "posted"},
                    unique_key=f"{run}:event:{i}",
                )
                for i in range(cfg.events)
            ]
        )
        from homing.pipeline.cluster import HOLD_MS, start_executor_killer

        if spark is None:
            console.print(f"[dim]starting Spark ({cfg.master}) ...[/dim]")
            spark = spark_session(cfg.master, hold_first_write_ms=HOLD_MS if killing else 0)
        register(spark)
        check_session(spark, url)
        killer = start_executor_killer(spark, db) if killing else None
        try:
            report.stages, report.deliveries = _drive(
                cfg, spark, db, hooks, run, subscriptions, subscribers, expected, fleet, console
            )
        finally:
            if killer is not None:
                killer.stop()
                report.spark = killer.report()
    finally:
        fleet.stop()
        for proc in sinks:
            proc.send_signal(signal.SIGTERM)
        for proc in sinks:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if own_spark and spark is not None:
            spark.stop()
    rec = _read_receipts(logs, hooks, run)
    report.checks = _check(db, hooks, run, expected, rec)
    report.deliveries.update(_delivery_figures(rec, work))
    report.deliveries["workers_killed"] = fleet.killed
    report.seconds = time.monotonic() - t0
    hooks.close()
    db.close()
    return report


def _delivery_figures(rec: dict[str, Any], work: Path) -> dict[str, Any]:
    """What the receivers saw: effects, refusals, repeats dropped (SMTP log + webhook inbox)."""
    stats_file = work / "webhook-receiver-stats.json"
    inbox_stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    delivery_s = (rec["last"] - rec["first"]) if rec["first"] is not None else 0.0
    return {
        "delivered": len(rec["new"]),
        "by_channel": rec["by_channel"],
        "temporary_refusals": rec["temporary_refusals"],
        "acks_lost": rec["acks_lost"],
        "duplicates_suppressed": rec["duplicates_suppressed"]
        + int(inbox_stats.get("duplicates", 0)),
        "seconds": round(delivery_s, 2),
        "per_s": round(len(rec["new"]) / delivery_s, 1) if delivery_s else None,
    }


def _drive(
    cfg: PipelineConfig,
    spark: Any,
    db: Database | ShardedDatabase,
    hooks: Database,
    run: str,
    subscriptions: Path,
    subscribers: Path,
    expected: data.Expected,
    fleet: Fleet,
    console: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    url = cfg.db
    base = _stats(db)
    base_outbox, _ = _http_state(db, hooks)
    expected_hooks = sum(expected.by_channel.get(c, 0) for c in HOOK_CHANNELS)

    def hooks_settled() -> tuple[int, int]:
        """(outbox messages finished since the start, receiver inbox messages handled)."""
        outbox, inbox = _http_state(db, hooks)
        sent = sum(outbox.get(k, 0) - base_outbox.get(k, 0) for k in ("delivered", "failed"))
        return sent, inbox.get("done", 0) + inbox.get("failed", 0)

    def grown(now: dict[str, dict[str, Any]], job_type: str, *states: str) -> int:
        have, was = now.get(job_type, {}), base.get(job_type, {})
        return sum(int(have.get(s, 0)) - int(was.get(s, 0)) for s in states)

    stage_a = StageStats(f"{EVENT} -> {SUBSCRIPTION}")
    stage_b = StageStats(f"{SUBSCRIPTION} -> {NOTIFICATION}")
    errors: list[BaseException] = []
    spark_done = threading.Event()
    finished = threading.Event()
    progress = Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.progress,
        refresh_per_second=4,
    )
    ta = progress.add_task(f"{EVENT} -> {SUBSCRIPTION}", total=expected.events)
    tb = progress.add_task(f"{SUBSCRIPTION} -> {NOTIFICATION}", total=expected.subscriptions)
    tc = progress.add_task("notification jobs (done + perm-failed)", total=expected.notifications)
    th = progress.add_task("webhook + IM acked by the receiver", total=expected_hooks)
    tk = progress.add_task("workers killed (SIGKILL)", total=max(cfg.kills, 1))

    def monitor() -> None:
        """Progress, chaos (kills) and the end condition, beside the Spark stages."""
        kill_every: float | None = None
        next_kill = 0.0
        poll_cost = 0.0
        try:
            while not finished.is_set():
                # The counts scan the run's tables: at millions of rows a scan takes
                # a while, so poll less often as they grow (at most ~1/5 of the time).
                time.sleep(max(1.0, 4 * poll_cost))
                t_poll = time.monotonic()
                now = _stats(db)
                sent, handled = hooks_settled()
                poll_cost = time.monotonic() - t_poll
                progress.update(ta, completed=grown(now, EVENT, "done"))
                progress.update(tb, completed=grown(now, SUBSCRIPTION, "done"))
                notes = grown(now, NOTIFICATION, "done", "failed")
                progress.update(tc, completed=notes)
                progress.update(th, completed=sent)
                fleet.respawn_dead()
                if notes > 0 and kill_every is None:
                    # spread the kills over a rough guess of the delivery time
                    kill_every = max(1.5, expected.notifications / 2000 / max(cfg.kills, 1))
                    next_kill = time.monotonic() + kill_every / 2
                if (
                    kill_every is not None
                    and fleet.killed < cfg.kills
                    and time.monotonic() >= next_kill
                ):
                    fleet.kill_one()
                    next_kill = time.monotonic() + kill_every
                progress.update(tk, completed=fleet.killed)
                if (
                    spark_done.is_set()
                    and notes >= expected.notifications
                    and sent >= expected_hooks
                    and handled >= expected_hooks
                ):
                    finished.set()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            finished.set()

    t_start = time.monotonic()
    watcher = threading.Thread(target=monitor, name="pipeline-monitor", daemon=True)
    with progress:
        watcher.start()
        try:
            fan_out_events(spark, db, url, run, subscriptions, stats=stage_a)
            fan_out_subscriptions(spark, db, url, run, subscribers, chunk=cfg.chunk, stats=stage_b)
        except BaseException:
            finished.set()
            raise
        spark_done.set()
        if not finished.wait(cfg.timeout):
            finished.set()
            raise HomingError(
                f"the deliveries did not finish within {cfg.timeout:g}s; raise --timeout "
                "or lower the scale (see the worker logs in the run directory)"
            )
        watcher.join()
    if errors:
        raise errors[0]
    while fleet.killed < cfg.kills:  # the run was too quick: still exercise the kills
        fleet.kill_one()
    t_end = time.monotonic()
    stages = []
    for st, children in ((stage_a, expected.subscriptions), (stage_b, expected.notifications)):
        stages.append(
            {
                "stage": st.name,
                "parents": st.parents,
                "children": children,
                "commits": st.commits,
                "seconds": round(st.seconds, 2),
                "children_per_s": round(children / st.seconds, 1) if st.seconds else None,
            }
        )
    outbox, inbox = _http_state(db, hooks)
    deliveries = {
        "wall_seconds": round(t_end - t_start, 2),
        "outbox": {k: v - base_outbox.get(k, 0) for k, v in outbox.items()},
        "receiver_inbox": inbox,
    }
    return stages, deliveries


def _check(
    db: Database | ShardedDatabase,
    hooks: Database,
    run: str,
    expected: data.Expected,
    rec: dict[str, Any],
) -> dict[str, Any]:
    """lost / duplicated / unexpected against the store and the receivers' records."""
    counts = _counts(db, run)
    with hooks.store.transaction(write=False) as tx:
        inbox = hq.inbox_counts(tx)
    notes: list[tuple[str, str, int]] = []
    for shard in _shards(db):
        with shard.store.transaction(write=False) as tx:
            notes += sq.run_jobs(tx, run, NOTIFICATION)
    done = {i for i, s, _ in notes if s == "done"}
    failed = {i for i, s, _ in notes if s == "failed"}
    attempts = sum(a for _, _, a in notes)
    delivered = rec["new"]
    lost = len(done - set(delivered))
    duplicated = sum(1 for n in delivered.values() if n > 1)
    unexpected = len(set(delivered) - done)
    not_terminal = sum(n for (t, s), n in counts.items() if s in ("ready", "running"))
    checks = {
        "events_done": counts.get((EVENT, "done"), 0),
        "subscriptions": sum(n for (t, _), n in counts.items() if t == SUBSCRIPTION),
        "notifications": len(notes),
        "notifications_done": len(done),
        "notifications_perm_failed": len(failed),
        "delivery_attempts": attempts,
        "retries": attempts - len(notes),
        "lost": lost,
        "duplicated": duplicated,
        "unexpected": unexpected,
        "left_unfinished": not_terminal,
        "webhook_inbox_unhandled": inbox.get("received", 0),
        "webhook_inbox_failed": inbox.get("failed", 0),
    }
    checks["ok"] = (
        lost == 0
        and duplicated == 0
        and unexpected == 0
        and not_terminal == 0
        and inbox.get("received", 0) == 0
        and inbox.get("failed", 0) == 0
        and checks["events_done"] == expected.events
        and checks["subscriptions"] == expected.subscriptions
        and len(notes) == expected.notifications
        and len(failed) == expected.bounces
    )
    return checks


def print_report(report: Report, console: Any) -> None:
    from homing._tables import print_table

    d = report.as_dict()
    dv, ck = d["deliveries"], d["checks"]
    console.print(f"homing pipeline run {report.run} on {report.db} (Spark {report.master})")
    rows: list[tuple[Any, ...]] = [
        ("FiredEvent (inserted)", "", report.expected.events, "", "", "", "")
    ]
    rows += [
        (
            st["stage"],
            st["parents"],
            st["children"],
            st["commits"],
            "",
            f"{st['seconds']:.1f}",
            st["children_per_s"],
        )
        for st in d["stages"]
    ]
    rows.append(
        (
            "deliveries",
            ck["notifications"],
            dv["delivered"],
            ck["retries"],
            dv["duplicates_suppressed"],
            f"{dv['seconds']:.1f}",
            dv["per_s"],
        )
    )
    print_table(("stage", "in", "out", "commits", "dups", "secs", "per s"), rows, console=console)
    console.print(
        "commits: Spark commits (stages) or retries (deliveries); dups: duplicates suppressed; "
        "deliveries by channel: "
        + ", ".join(f"{k} {v}" for k, v in sorted(dv["by_channel"].items()))
    )
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(
        f"perm-failed (SMTP 5xx bounces): {ck['notifications_perm_failed']} of "
        f"{report.expected.bounces} expected; temporary refusals (451/503): "
        f"{dv['temporary_refusals']}; webhook answers lost: {dv['acks_lost']}; "
        f"outbox: {dv['outbox']}; workers killed: {dv['workers_killed']}; "
        f"left unfinished: {ck['left_unfinished']}"
    )
    if dv["per_s"] is not None:
        console.print(
            f"[bold]deliveries: {dv['delivered']} in {dv['seconds']:.1f} s from the first to "
            f"the last = {dv['per_s']:,.0f}/s[/] (email, webhook and IM effects at the "
            f"receivers; the run's wall time from the first Spark stage: "
            f"{dv['wall_seconds']:.1f} s)"
        )
    if d["spark"]:
        sp = d["spark"]
        console.print(
            f"Spark executors killed (SIGKILL, during a replace): {sp['executors_killed']} "
            f"(pids {sp['pids']}, {sp['staged_batches_at_kill']} staged batch(es) uncommitted)"
        )
    console.print(
        f"lost = {ck['lost']}, duplicated = {ck['duplicated']}, unexpected = {ck['unexpected']}"
        f"  -> {verdict}   total {d['seconds']:.1f}s"
    )
