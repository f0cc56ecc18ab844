"""The `homing` command, run as users run it: in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def homing_cmd(*args: str, db: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOMING_DB": db}
    proc = subprocess.run(
        [sys.executable, "-m", "homing", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_job_round_trip(store_url: str) -> None:
    assert "jobs:0001" in homing_cmd("migrate", db=store_url).stdout
    handle = json.loads(
        homing_cmd("insert", "email", '{"to": "a@b"}', "--json", db=store_url).stdout
    )["handle"]
    job = json.loads(homing_cmd("grab", "email", "--lock-for", "30", "--json", db=store_url).stdout)
    assert job["handle"] == handle and job["args"] == {"to": "a@b"}
    homing_cmd("complete", handle, "--lease-token", job["lease_token"], db=store_url)
    details = json.loads(homing_cmd("details", handle, "--json", db=store_url).stdout)
    assert details["state"] == "done"
    stats = json.loads(homing_cmd("stats", "--json", db=store_url).stdout)
    assert stats[0]["done"] == 1
    assert "email" in homing_cmd("stats", db=store_url).stdout
    gc = json.loads(homing_cmd("gc", "--older-than", "0", "--json", db=store_url).stdout)
    assert gc["deleted"] == 1 and gc["tables"]["jobs"] == 1


def test_cli_errors_are_one_clear_line(store_url: str, tmp_path: Path) -> None:
    proc = homing_cmd("grab", "nothing", db=store_url, check=False)
    assert proc.returncode == 3 and "no job available" in proc.stderr
    proc = homing_cmd("details", "not-a-handle", db=store_url, check=False)
    assert (
        proc.returncode == 1
        and proc.stderr.startswith("error: ")
        and "Traceback" not in proc.stderr
    )
    proc = homing_cmd("insert", "t", "{not json", db=store_url, check=False)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    proc = homing_cmd("grab", "t", "--lock-for", "-5", db=store_url, check=False)
    assert proc.returncode == 1 and "lock_for" in proc.stderr
    handle = json.loads(homing_cmd("insert", "t", "--json", db=store_url).stdout)["handle"]
    homing_cmd("grab", "t", db=store_url)
    proc = homing_cmd("complete", handle, "--lease-token", "forged", db=store_url, check=False)
    assert proc.returncode == 1 and "stale" in proc.stderr
    proc = homing_cmd("stats", db=f"sqlite:///{tmp_path}/no/such/dir/x.db", check=False)
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    proc = homing_cmd("stats", db="mysql://x", check=False)
    assert proc.returncode == 1 and "unknown store URL scheme" in proc.stderr


def test_cli_refuses_a_newer_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    homing_cmd("migrate", db=url)
    import sqlite3

    with sqlite3.connect(tmp_path / "x.db") as conn:
        conn.execute("INSERT INTO homing_migrations VALUES ('jobs', 99, 'future', 0)")
    proc = homing_cmd("stats", db=url, check=False)
    assert proc.returncode == 1 and "upgrade homing" in proc.stderr


def test_demo_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "homing", "demo"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "5 notifications, each once" in proc.stdout


def test_workers_lists_who_grabs_and_what_it_holds(store_url: str) -> None:
    homing_cmd("migrate", db=store_url)
    for n in range(2):
        homing_cmd("insert", "email", f'{{"n": {n}}}', db=store_url)
    grabbed = homing_cmd("grab", "email", "--lock-for", "600", "--json", db=store_url)
    pid_gone = json.loads(grabbed.stdout)  # the grabbing process has exited since
    listed = json.loads(homing_cmd("workers", "--json", db=store_url).stdout)
    assert len(listed) == 1 and listed[0]["running"] == 1, listed
    assert listed[0]["worker"].endswith(":MainThread") and pid_gone["handle"]
    table = homing_cmd("workers", db=store_url).stdout
    assert "gone" in table and listed[0]["worker"] in table  # its pid no longer runs
    bad = homing_cmd("workers", "--within", "0", db=store_url, check=False)
    assert bad.returncode == 2 and "--within" in bad.stderr
