"""CLI tables read at 80 columns (not a terminal): no header is cut to ``sche…``."""

from __future__ import annotations

import json

from click.testing import CliRunner

import homing
from homing.cli import cli


def _run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--db", url, *args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def test_stats_is_whole_at_80_columns(store_url: str) -> None:
    with homing.connect(store_url) as db:
        db.insert("ProcessSubscription", {})
        db.insert("email", {})
    out = _run(store_url, "stats")
    assert "…" not in out
    assert all(len(line) <= 80 for line in out.splitlines())
    header = out.splitlines()[0].split()
    assert header[:8] == ["type", "ready", "sched", "staged", "run", "expired", "done", "failed"]
    assert json.loads(_run(store_url, "stats", "--json"))[0]["type"] == "ProcessSubscription"


def test_stats_becomes_records_when_a_name_is_too_long(store_url: str) -> None:
    long_name = "FiredEventWithAnEspeciallyLongNameForThisTable"
    with homing.connect(store_url) as db:
        db.insert(long_name, {})
    out = _run(store_url, "stats")
    assert "…" not in out and all(len(line) <= 80 for line in out.splitlines())
    assert out.splitlines()[0] == long_name
    assert "ready 1" in out and "sched 0" in out


def test_queues_list_is_whole_at_80_columns(store_url: str) -> None:
    _run(store_url, "queues", "create", "print", "--dead-letter", "$dead")
    _run(store_url, "queues", "bind", "print", "bw", "--consumer", "bw-1", "--credits", "2")
    out = _run(store_url, "queues", "list")
    assert "…" not in out and all(len(line) <= 80 for line in out.splitlines())
    assert "dead letters to" in out and "bw" in out and "2/2" in out


def test_redrive_and_complete_speak_json(store_url: str) -> None:
    with homing.connect(store_url) as db:
        handle = db.insert("email", {})
        job = db.grab(["email"], lock_for=30)
        assert job is not None
        db.perm_fail(job, "no")
    assert json.loads(_run(store_url, "redrive", handle, "--json")) == {
        "ok": True,
        "handle": handle,
    }
