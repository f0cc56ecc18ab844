"""``homing worker`` as a real process: bad input, SIGTERM, and crashes at the failpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import homing
from homing.cli import cli
from homing.worker.cli import load_app

APPS = str(Path(__file__).with_name("test_worker_apps.py"))
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "worker_app.py"
EFFECTS_DDL = "CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER)"


def worker_cmd(url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "homing", "--db", url, "worker", "--app", f"{APPS}:app", *extra]


def effects(db: homing.Database) -> Counter[str]:
    with db.transaction() as tx:
        return Counter(str(r[0]) for r in tx.connection.execute("SELECT job_id FROM effects"))


@pytest.fixture
def edb(store_url: str) -> Any:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    with db.transaction() as tx:
        tx.connection.execute(EFFECTS_DDL)
    yield db
    db.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", "no_such_module_xyz:app"], "cannot import no_such_module_xyz"),
        (["--app", f"{APPS}:nothing"], "is NoneType, not a homing.App"),
        (["--app", "/nonexistent/file.py:app"], "no file"),
        (["--app", f"{APPS}:app", "--types", "effect,nope"], "no handler for job type 'nope'"),
        (["--app", f"{APPS}:app", "--concurrency", "0"], "0 is not in the range"),
        (["--app", f"{APPS}:app", "--lock-for", "-1"], "lock_for must be > 0"),
    ],
)
def test_bad_invocations_fail_with_a_clear_message(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{tmp_path / 'x.db'}", "worker", *args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_sigterm_lets_running_jobs_finish_and_releases_the_rest(
    edb: homing.Database, store_url: str
) -> None:
    short = edb.insert("sleep", {"s": 1.0})
    long = edb.insert("sleep", {"s": 60})
    proc = subprocess.Popen(
        worker_cmd(store_url, "-c", "2", "--grace", "2", "--lock-for", "30"),
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while {edb.details(h).state for h in (short, long)} != {"running"}:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    assert code == 0, err
    assert took < 12, err  # grace of 2 s, then the long job's lease was released
    assert edb.details(short).state == "done"
    d = edb.details(long)
    assert d.state == "ready" and d.failures[-1].kind == "released", err
    assert effects(edb) == Counter({short: 1})
    assert "outcome=done" in err and "outcome=released" in err  # one log line per job


def test_a_worker_paused_past_its_lease_cannot_complete(
    edb: homing.Database, store_url: str
) -> None:
    """SIGSTOP a worker mid-job for longer than its lease: another worker takes the job and
    completes it; when the first one wakes up, its completion is refused (fencing)."""
    handle = edb.insert("sleep", {"s": 1.0})
    proc = subprocess.Popen(
        worker_cmd(store_url, "-c", "1", "--lock-for", "1", "--prefetch", "0"),
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while edb.details(handle).state != "running":
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        holder = edb.details(handle).holder
        assert holder is not None and holder.pid == proc.pid
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(1.3)  # the lease (1 s, heartbeats stopped too) runs out
        load_app(f"{APPS}:app").worker(db=edb, concurrency=1, until_idle=True).run()
        assert edb.details(handle).state == "done"
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(1.5)  # the first handler finishes its sleep and tries to complete
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    assert "outcome=lease_lost" in err, err
    assert effects(edb) == Counter({handle: 1})
    d = edb.details(handle)
    assert d.attempts == 2 and [f.kind for f in d.failures] == ["lease_expired"]
    assert d.failures[0].pid == proc.pid


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("worker.after_grab", 1),
        ("worker.after_effect_before_complete", 3),
        ("worker.in_replace", 2),
    ],
)
def test_crash_at_a_failpoint_then_recover_exactly_once(
    edb: homing.Database, store_url: str, point: str, nth: int
) -> None:
    parents = edb.insert_many([("fired", {"n": 2}) for _ in range(3)])
    plain = edb.insert_many([("effect", {"k": k}) for k in range(6)])
    env = {**os.environ, "HOMING_FAILPOINTS": f"{point}={nth}*crash"}
    proc = subprocess.run(
        worker_cmd(store_url, "-c", "2", "--lock-for", "0.5", "--until-idle"),
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()  # it did crash there
    time.sleep(0.6)  # the dead worker's leases run out
    load_app(f"{APPS}:app").worker(db=edb, concurrency=2, until_idle=True).run()
    children: Counter[str | None] = Counter()
    leaves: list[str] = list(plain)
    for handle in effects(edb):
        d = edb.details(handle)
        if d.parent is not None:
            children[d.parent] += 1
            leaves.append(handle)
    assert children == Counter({p: 2 for p in parents})  # replace: all children, once
    assert effects(edb) == Counter({h: 1 for h in leaves})  # lost = 0, duplicated = 0
    assert {edb.details(h).state for h in parents + leaves} == {"done"}


def test_the_example_app_runs() -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import worker_app
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    result = worker_app.main()
    assert result["sent"] == [
        "greylisted@example.com",
        "user0@example.com",
        "user1@example.com",
        "user2@example.com",
        "user3@example.com",
    ]
    assert result["stats"]["send_email"] == {"done": 5, "failed": 1}


def test_the_apps_own_url_is_used_unless_db_is_given(tmp_path: Path) -> None:
    own = tmp_path / "own.db"
    other = tmp_path / "other.db"
    app_file = tmp_path / "own_app.py"
    app_file.write_text(
        "from homing.worker import App\n"
        f"app = App('sqlite:///{own}')\n"
        "@app.job('noop')\n"
        "def noop(job, ctx):\n"
        "    pass\n"
    )
    for path in (own, other):
        with homing.connect(f"sqlite:///{path}") as db:
            db.insert("noop")
    run = ["worker", "--app", f"{app_file}:app", "--until-idle"]
    result = CliRunner().invoke(cli, run, env={"HOMING_DB": None})
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{other}", *run])
    assert result.exit_code == 0, result.output
    for path in (own, other):
        with homing.connect(f"sqlite:///{path}") as db:
            assert [r["done"] for r in db.stats()] == [1]


def test_json_logs_have_one_object_per_job(tmp_path: Path) -> None:
    import json

    url = f"sqlite:///{tmp_path / 'j.db'}"
    with homing.connect(url) as db:
        handle = db.insert("noop")
    result = CliRunner().invoke(
        cli, ["--db", url, "worker", "--app", f"{APPS}:app", "--until-idle", "--log-format", "json"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    jobs = [r for r in records if r.get("event") == "job"]
    assert len(jobs) == 1
    job = jobs[0]
    assert (job["type"], job["handle"], job["attempt"], job["outcome"]) == (
        "noop",
        handle,
        1,
        "done",
    )
    assert job["duration_ms"] >= 0 and job["level"] == "info"
    assert {"worker_started", "worker_stopped"} <= {r.get("event") for r in records}
