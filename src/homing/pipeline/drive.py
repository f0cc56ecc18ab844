"""A run's middle: the two Spark stages, and beside them a monitor thread that draws the
progress, kills delivery workers (the chaos) and decides when every delivery has settled."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homing.database import Database, ShardedDatabase
from homing.errors import HomingError
from homing.pipeline import data
from homing.pipeline.config import PipelineConfig
from homing.pipeline.data import HOOK_CHANNELS
from homing.pipeline.effects import finished_counts, http_state
from homing.pipeline.processes import Fleet
from homing.pipeline.stages import (
    EVENT,
    NOTIFICATION,
    SUBSCRIPTION,
    StageStats,
    fan_out_events,
    fan_out_subscriptions,
)


def _progress(cfg: PipelineConfig, console: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.progress,
        refresh_per_second=4,
    )


class Monitor:
    """Progress, chaos (kills) and the end condition, beside the Spark stages.

    ``finished`` is set once Spark is done (``spark_done``), every notification job is done
    or perm-failed, and every webhook and IM message was sent and handled by the receiver;
    or when the monitor itself failed (the error is in ``errors``)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        db: Database | ShardedDatabase,
        hooks: Database,
        expected: data.Expected,
        fleet: Fleet,
        progress: Any,
    ) -> None:
        self.cfg, self.db, self.hooks, self.expected, self.fleet = cfg, db, hooks, expected, fleet
        self.progress = progress
        self.base = finished_counts(db)
        self.base_outbox, _ = http_state(db, hooks)
        self.expected_hooks = sum(expected.by_channel.get(c, 0) for c in HOOK_CHANNELS)
        self.spark_done = threading.Event()
        self.finished = threading.Event()
        self.errors: list[BaseException] = []
        self.kill_every: float | None = None
        self.next_kill = 0.0
        add = progress.add_task
        self.task_events = add(f"{EVENT} -> {SUBSCRIPTION}", total=expected.events)
        self.task_subs = add(f"{SUBSCRIPTION} -> {NOTIFICATION}", total=expected.subscriptions)
        self.task_notes = add(
            "notification jobs (done + perm-failed)", total=expected.notifications
        )
        self.task_hooks = add("webhook + IM acked by the receiver", total=self.expected_hooks)
        self.task_kills = add("workers killed (SIGKILL)", total=max(cfg.kills, 1))

    def hooks_settled(self) -> tuple[int, int]:
        """(outbox messages finished since the start, receiver inbox messages handled)."""
        outbox, inbox = http_state(self.db, self.hooks)
        sent = sum(outbox.get(k, 0) - self.base_outbox.get(k, 0) for k in ("delivered", "failed"))
        return sent, inbox.get("done", 0) + inbox.get("failed", 0)

    def grown(self, now: dict[tuple[str, str], int], job_type: str, *states: str) -> int:
        return sum(now.get((job_type, s), 0) - self.base.get((job_type, s), 0) for s in states)

    def run(self) -> None:
        poll_cost = 0.0
        try:
            while not self.finished.is_set():
                # The counts scan the run's tables: at millions of rows a scan takes
                # a while, so poll less often as they grow (at most ~1/9 of the time:
                # the polls compete for the cores with the deliveries they count).
                time.sleep(max(1.0, 8 * poll_cost))
                t_poll = time.monotonic()
                self._look()
                poll_cost = time.monotonic() - t_poll
        except BaseException as exc:  # reported by the main thread
            self.errors.append(exc)
            self.finished.set()

    def _look(self) -> None:
        now = finished_counts(self.db)
        sent, handled = self.hooks_settled()
        update = self.progress.update
        update(self.task_events, completed=self.grown(now, EVENT, "done"))
        update(self.task_subs, completed=self.grown(now, SUBSCRIPTION, "done"))
        notes = self.grown(now, NOTIFICATION, "done", "failed")
        update(self.task_notes, completed=notes)
        update(self.task_hooks, completed=sent)
        self.fleet.respawn_dead()
        self._kill_on_schedule(notes)
        update(self.task_kills, completed=self.fleet.killed)
        if (
            self.spark_done.is_set()
            and notes >= self.expected.notifications
            and sent >= self.expected_hooks
            and handled >= self.expected_hooks
        ):
            self.finished.set()

    def _kill_on_schedule(self, notes: int) -> None:
        if notes > 0 and self.kill_every is None:
            # spread the kills over a rough guess of the delivery time
            self.kill_every = max(1.5, self.expected.notifications / 2000 / max(self.cfg.kills, 1))
            self.next_kill = time.monotonic() + self.kill_every / 2
        if (
            self.kill_every is not None
            and self.fleet.killed < self.cfg.kills
            and time.monotonic() >= self.next_kill
        ):
            self.fleet.kill_one()
            self.next_kill = time.monotonic() + self.kill_every


def _stage_rows(stage_a: StageStats, stage_b: StageStats, expected: data.Expected) -> list[Any]:
    rows = []
    for st, children in ((stage_a, expected.subscriptions), (stage_b, expected.notifications)):
        rows.append(
            {
                "stage": st.name,
                "parents": st.parents,
                "children": children,
                "commits": st.commits,
                "seconds": round(st.seconds, 2),
                "children_per_s": round(children / st.seconds, 1) if st.seconds else None,
            }
        )
    return rows


@dataclass
class RunParts:
    """What the Spark stages and the monitor need of one run: its options, the Spark
    session, the job store and the webhook receiver's store, the run id, the input tables
    (subscriptions, subscribers), the expected counts, the delivery workers and the console
    that shows progress."""

    cfg: PipelineConfig
    spark: Any
    db: Database | ShardedDatabase
    hooks: Database
    run: str
    tables: tuple[Path, Path]
    expected: data.Expected
    fleet: Fleet
    console: Any


def drive(parts: RunParts) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run both Spark stages and wait until every delivery settled; return the stages'
    rows and the delivery figures."""
    cfg, spark, db, hooks, run = parts.cfg, parts.spark, parts.db, parts.hooks, parts.run
    expected, fleet = parts.expected, parts.fleet
    subscriptions, subscribers = parts.tables
    progress = _progress(cfg, parts.console)
    monitor = Monitor(cfg, db, hooks, expected, fleet, progress)
    stage_a = StageStats(f"{EVENT} -> {SUBSCRIPTION}")
    stage_b = StageStats(f"{SUBSCRIPTION} -> {NOTIFICATION}")
    t_start = time.monotonic()
    watcher = threading.Thread(target=monitor.run, name="pipeline-monitor", daemon=True)
    with progress:
        watcher.start()
        try:
            fan_out_events(spark, db, cfg.db, run, subscriptions, stats=stage_a)
            fan_out_subscriptions(
                spark, db, cfg.db, run, subscribers, chunk=cfg.chunk, stats=stage_b
            )
        except BaseException:
            monitor.finished.set()
            raise
        monitor.spark_done.set()
        if not monitor.finished.wait(cfg.timeout):
            monitor.finished.set()
            raise HomingError(
                f"the deliveries did not finish within {cfg.timeout:g}s; raise --timeout "
                "or lower the scale (see the worker logs in the run directory)"
            )
        watcher.join()
    if monitor.errors:
        raise monitor.errors[0]
    while fleet.killed < cfg.kills:  # the run was too quick: still exercise the kills
        fleet.kill_one()
    t_end = time.monotonic()
    outbox, inbox = http_state(db, hooks)
    deliveries = {
        "wall_seconds": round(t_end - t_start, 2),
        "outbox": {k: v - monitor.base_outbox.get(k, 0) for k, v in outbox.items()},
        "receiver_inbox": inbox,
    }
    return _stage_rows(stage_a, stage_b, expected), deliveries
