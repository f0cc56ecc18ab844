"""homing.pipeline end to end at small scale: every delivery exactly once, on both backends."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import spark_fixtures  # noqa: E402
from homing.pipeline import PipelineConfig, run_pipeline  # noqa: E402

spark = spark_fixtures.spark  # the session-scoped SparkSession fixture


def test_pipeline_small_scale_exactly_once(spark: Any, store_url: str, tmp_path: Path) -> None:
    from rich.console import Console

    cfg = PipelineConfig(
        db=store_url,
        events=3,
        subscribers=40,
        workers=2,
        concurrency=4,
        kills=2,
        lock_for=2.0,
        temp_pct=10,
        chunk=50,  # several replace commits in the second stage
        data_dir=tmp_path / "data",
        timeout=240,
        progress=False,
    )
    report = run_pipeline(cfg, spark=spark, console=Console(quiet=True))
    checks = report.checks
    assert checks["lost"] == 0
    assert checks["duplicated"] == 0
    assert checks["unexpected"] == 0
    assert checks["left_unfinished"] == 0
    assert checks["subscriptions"] == report.expected.subscriptions == 120
    assert checks["notifications"] == report.expected.notifications
    assert checks["notifications_perm_failed"] == report.expected.bounces > 0
    assert report.deliveries["delivered"] == report.expected.notifications - report.expected.bounces
    assert report.deliveries["temporary_refusals"] > 0 and checks["retries"] > 0
    assert report.deliveries["workers_killed"] == 2
    # webhooks and IM went through homing.http: outbox -> lossy network -> receiver inbox
    hooks = sum(report.expected.by_channel[c] for c in ("webhook", "im"))
    assert report.deliveries["outbox"].get("delivered") == hooks > 0
    assert not report.deliveries["outbox"].get("failed")
    assert report.deliveries["receiver_inbox"] == {"done": hooks}
    assert report.deliveries["acks_lost"] > 0  # each one a repeat the inbox had to drop
    assert report.deliveries["duplicates_suppressed"] >= report.deliveries["acks_lost"]
    assert report.stages[1]["commits"] >= 3
    assert report.ok


def test_sqlite_with_a_cluster_master_is_refused(tmp_path: Path) -> None:
    from homing.errors import ConfigurationError
    from homing.spark._common import check_master

    with pytest.raises(ConfigurationError, match="PostgreSQL store"):
        check_master(f"sqlite:///{tmp_path / 'x.db'}", "spark://cluster:7077")


def test_the_check_sees_a_repeated_and_a_missing_effect(
    db: Any, tmp_path: Path, clock: Any
) -> None:
    """The run's check must be able to fail: a webhook effect recorded twice is counted as
    duplicated, a done notification without an effect as lost (a check that cannot fail
    would prove nothing)."""
    import homing
    from homing.pipeline.data import HOOK_RECEIVED, Expected
    from homing.pipeline.effects import check, read_receipts

    run = "chk"
    db.insert_many(
        [
            homing.JobSpec("ProcessNotification", {"run": run, "channel": "webhook", "n": n})
            for n in range(3)
        ]
    )
    jobs = db.grab_many("ProcessNotification", lock_for=30, limit=3)
    db.complete_many(jobs)
    hooks = homing.connect(f"sqlite:///{tmp_path / 'hooks.db'}", clock=clock)
    twice, once, _missing = (j.id for j in jobs)
    for note_id in (twice, twice, once):
        hooks.insert(HOOK_RECEIVED, {"run": run, "notification_id": note_id, "channel": "im"})
    expected = Expected(events=0, subscriptions=0, notifications=3, by_channel={}, bounces=0)
    rec = read_receipts([tmp_path / "no-smtp-log.jsonl"], hooks, run)
    checks = check(db, hooks, run, expected, rec)
    assert (checks["duplicated"], checks["lost"], checks["unexpected"]) == (1, 1, 0)
    assert rec["by_channel"] == {"im": 3}
    assert not checks["ok"]
    hooks.close()


def test_a_run_refuses_to_start_beside_another_runs_unfinished_jobs(db: Any) -> None:
    """Two runs on one store: the second's workers took the first's jobs and delivered
    them to the second's receivers (seen: lost = 3,363, unexpected = 1,356). A run now
    refuses to start beside unfinished jobs of another run, naming it; with
    --discard-leftovers it cancels them (and nothing finished) and starts."""
    import homing
    from homing.errors import ConfigurationError
    from homing.pipeline.run import _handle_leftovers

    class Quiet:
        def __init__(self) -> None:
            self.said: list[str] = []

        def print(self, text: str) -> None:
            self.said.append(text)

    cfg = PipelineConfig(db="the-store")
    _handle_leftovers(db, cfg, Quiet())  # an empty store: nothing to say
    db.insert_many(
        [homing.JobSpec("ProcessNotification", {"run": "old", "n": n}) for n in range(4)]
        + [homing.JobSpec("FiredEvent", {"run": "old", "event_id": 0})]
        + [homing.JobSpec("ProcessNotification", {"run": "done", "n": 0})]
        + [homing.JobSpec("Other", {"run": "old"})]
    )
    held = db.grab("ProcessNotification", lock_for=30)
    finished = db.grab_many("ProcessNotification", lock_for=30, limit=10)
    done = next(j for j in finished if j.args["run"] == "done")
    db.complete(done)
    for j in finished:
        if j is not done:
            db.release(j)
    assert held is not None
    with pytest.raises(ConfigurationError, match=r"another pipeline run: old \(5 jobs\)"):
        _handle_leftovers(db, cfg, Quiet())
    cfg.discard_leftovers = True
    quiet = Quiet()
    _handle_leftovers(db, cfg, quiet)
    assert quiet.said == ["cancelled 5 unfinished jobs of earlier runs: old (5 jobs)"]
    stats = {row["type"]: row for row in db.stats()}
    assert stats["ProcessNotification"].get("ready", 0) == 0
    assert db.details(done.handle).state == "done"
    assert db.details(held.handle).state == "cancelled"
    assert stats["Other"].get("ready") == 1  # not a pipeline job: not the run's to cancel
    cfg.discard_leftovers = False
    _handle_leftovers(db, cfg, Quiet())  # nothing left: starts


def test_a_stopped_fleet_spawns_no_more_workers(tmp_path: Path) -> None:
    """The monitor thread respawns dead delivery workers; once the run stopped the fleet
    (a timeout, an error) a respawn racing the stop starts nothing: a timed-out run left
    three workers running with no parent."""
    from homing.pipeline.processes import Fleet

    cfg = PipelineConfig(db=f"sqlite:///{tmp_path / 'x.db'}", workers=1)
    fleet = Fleet(cfg, 1, 2, tmp_path)
    fleet.stop()
    fleet.spawn()
    fleet.start()
    assert fleet.procs == [] and fleet.started == 0


def test_the_progress_counts_the_pipeline_jobs_that_finished(db: Any) -> None:
    """The monitor's poll (every second or so during a run): done and failed jobs of the
    pipeline's three types by (type, state), and nothing else."""
    import homing
    from homing.pipeline.effects import finished_counts

    db.insert_many(
        [homing.JobSpec("ProcessNotification", {"run": "r", "n": n}) for n in range(4)]
        + [homing.JobSpec("FiredEvent", {"run": "r", "event_id": 0})]
        + [homing.JobSpec("Other", {"run": "r"})]
    )
    assert finished_counts(db) == {}
    notes = db.grab_many("ProcessNotification", lock_for=30, limit=3)
    db.complete(notes[0])
    db.complete(notes[1])
    db.perm_fail(notes[2], "bounced")
    event = db.grab("FiredEvent", lock_for=30)
    other = db.grab("Other", lock_for=30)
    assert event is not None and other is not None
    db.complete(event)
    db.complete(other)
    assert finished_counts(db) == {
        ("ProcessNotification", "done"): 2,
        ("ProcessNotification", "failed"): 1,
        ("FiredEvent", "done"): 1,
    }


def test_the_delivery_workers_poll_for_sqlites_write_lock() -> None:
    from homing.pipeline.processes import _worker_url

    assert _worker_url("sqlite:////tmp/p.db") == "sqlite:////tmp/p.db?lock_wait=poll"
    assert (
        _worker_url("sqlite:///p.db?durable=false") == "sqlite:///p.db?durable=false&lock_wait=poll"
    )
    assert _worker_url("sqlite:///p.db?lock_wait=sleep") == "sqlite:///p.db?lock_wait=sleep"
    pg = "postgresql://postgres@127.0.0.1:5432/test"
    assert _worker_url(pg) == pg
