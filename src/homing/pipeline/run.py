"""The pipeline end to end: data, receivers, workers, Spark stages, chaos, check, report.

The parts live in modules of their own: ``config`` (the options), ``processes`` (delivery
workers and receivers), ``session`` (Spark), ``drive`` (the stages and the monitor),
``effects`` (counting and checking every delivery) and ``report``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from homing.database import Database, ShardedDatabase, connect
from homing.errors import ConfigurationError
from homing.jobs import JobSpec
from homing.pipeline import data
from homing.pipeline.config import PipelineConfig
from homing.pipeline.drive import RunParts, drive
from homing.pipeline.effects import (
    check,
    delivery_figures,
    discard_leftovers,
    leftover_runs,
    read_receipts,
    shards,
)
from homing.pipeline.processes import Fleet, child_env, free_port, stop_processes, wait_port
from homing.pipeline.report import Report, print_report
from homing.pipeline.session import java_missing, spark_session
from homing.pipeline.stages import EVENT
from homing.spark import check_session, register

__all__ = [
    "PipelineConfig",
    "Report",
    "java_missing",
    "print_report",
    "run_pipeline",
    "spark_session",
]


def _check_config(cfg: PipelineConfig) -> None:
    if cfg.events < 1 or cfg.subscribers < 1:
        raise ConfigurationError("--events and --subscribers must be at least 1")
    if cfg.kill_executor and (cfg.master == "local" or cfg.master.startswith("local[")):
        raise ConfigurationError(
            "--kill-executor needs executors in JVMs of their own: a spark:// master "
            "(make run-cluster) or local-cluster[N,C,MB], not " + repr(cfg.master)
        )


def _absolute(url: str) -> str:
    """A relative SQLite path made absolute: the worker processes may start elsewhere."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(url[len("sqlite:///") :])
    return url


class _Receivers:
    """The SMTP server and the webhook receiver, each a process of its own."""

    def __init__(self, cfg: PipelineConfig, work: Path, hooks: Database) -> None:
        self.smtp_port, self.http_port = free_port(), free_port()
        self.logs = [work / "smtp-receipts.jsonl", work / "network.jsonl"]
        self.procs = [
            self._start(cfg, work, "smtp", self.logs[0], self.smtp_port),
            self._start(cfg, work, "hooks", self.logs[1], self.http_port, "--hooks-db", hooks.url),
        ]

    @staticmethod
    def _start(
        cfg: PipelineConfig, work: Path, service: str, log: Path, port: int, *extra: str
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "homing.pipeline.sinks", service, "--log", str(log)]
            + ["--port", str(port), "--temp-pct", str(cfg.temp_pct), *extra],
            stdout=(work / f"{service}.log").open("ab"),
            stderr=subprocess.STDOUT,
            env=child_env(),
        )

    def wait_listening(self) -> None:
        wait_port(self.smtp_port, self.procs[0])
        wait_port(self.http_port, self.procs[1])

    def stop(self) -> None:
        stop_processes(self.procs)


def _handle_leftovers(db: Database | ShardedDatabase, cfg: PipelineConfig, console: Any) -> None:
    """Refuse to start beside another run's unfinished jobs (or cancel them when asked)."""
    leftovers = leftover_runs(db)
    if not leftovers:
        return
    runs = ", ".join(f"{run} ({n} jobs)" for run, n in sorted(leftovers.items()))
    if not cfg.discard_leftovers:
        raise ConfigurationError(
            f"the store {cfg.db} holds unfinished jobs of another pipeline run: {runs}. "
            "This run's workers would take them and deliver them to this run's receivers, "
            "and both checks would fail. Wait for that run to finish, run on another store "
            "(--db, or HOMING_DB), or, if that run no longer runs (it was stopped), add "
            "--discard-leftovers to cancel its jobs."
        )
    n = discard_leftovers(db, sorted(leftovers))
    console.print(f"cancelled {n} unfinished jobs of earlier runs: {runs}")


def _insert_events(db: Database | ShardedDatabase, run: str, events: int) -> None:
    db.insert_many(
        [
            JobSpec(
                EVENT,
                {"run": run, "event_id": i, "topic": i, "actor": f"user{i}", "verb": "posted"},
                unique_key=f"{run}:event:{i}",
            )
            for i in range(events)
        ]
    )


def _spark_stages(parts: RunParts, report: Report) -> None:
    """The Spark stages (with the executor killer when asked), into ``report``."""
    from homing.pipeline.cluster import start_executor_killer

    register(parts.spark)
    check_session(parts.spark, parts.cfg.db)
    killer = start_executor_killer(parts.spark, parts.db) if parts.cfg.kill_executor else None
    try:
        report.stages, report.deliveries = drive(parts)
    finally:
        if killer is not None:
            killer.stop()
            report.spark = killer.report()


def run_pipeline(cfg: PipelineConfig, *, spark: Any = None, console: Any = None) -> Report:
    """Run seed 002's fan-out once, end to end, and check every delivery happened once."""
    from rich.console import Console

    from homing.pipeline.cluster import HOLD_MS

    console = console or Console()
    _check_config(cfg)
    run = cfg.run_id or uuid.uuid4().hex[:12]
    data_dir = cfg.data_dir.resolve()
    work = data_dir / f"run-{run}"
    cfg.db = url = _absolute(cfg.db)

    t0 = time.monotonic()
    db = connect(url.split(",") if "," in url else url)
    try:
        _handle_leftovers(db, cfg, console)
    except BaseException:
        db.close()
        raise
    work.mkdir(parents=True, exist_ok=True)
    subscriptions, subscribers, expected = data.write_tables(data_dir, cfg.events, cfg.subscribers)
    report = Report(run=run, db=url, master=cfg.master, expected=expected)
    hooks = connect(f"sqlite:///{work / 'webhook-receiver.db'}")  # migrated before the sinks
    assert isinstance(hooks, Database)
    receivers = _Receivers(cfg, work, hooks)
    fleet = Fleet(cfg, receivers.smtp_port, receivers.http_port, work, [s.url for s in shards(db)])
    own_spark = spark is None
    try:
        receivers.wait_listening()
        fleet.start()
        _insert_events(db, run, cfg.events)
        if spark is None:
            console.print(f"[dim]starting Spark ({cfg.master}) ...[/dim]")
            spark = spark_session(
                cfg.master, hold_first_write_ms=HOLD_MS if cfg.kill_executor else 0
            )
        tables = (subscriptions, subscribers)
        parts = RunParts(cfg, spark, db, hooks, run, tables, expected, fleet, console)
        _spark_stages(parts, report)
    finally:
        fleet.stop()
        receivers.stop()
        if own_spark and spark is not None:
            spark.stop()
    rec = read_receipts(receivers.logs, hooks, run)
    report.checks = check(db, hooks, run, expected, rec)
    report.deliveries.update(delivery_figures(rec, work))
    report.deliveries["workers_killed"] = fleet.killed
    report.seconds = time.monotonic() - t0
    hooks.close()
    db.close()
    return report
