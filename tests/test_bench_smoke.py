"""The benchmark harness keeps working: ``python -m bench --smoke`` once, tiny (< 60 s).

The numbers of a smoke run mean nothing (tiny windows, cells run three at a time); this
checks that every driver runs and that the JSON, the Markdown table and the chart are
written and well-formed. A peer service that is down shows as an error cell, not a failure
here; homing's own cells must succeed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run_script(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    """Run one of bench/'s scripts from the project's root; it must succeed."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.mark.timeout(180)
def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    doc = json.loads((out / "results.json").read_text())
    assert doc["smoke"] is True
    assert doc["reps"] == 1
    assert doc["probes"] and all(p["fdatasync_per_s"] > 0 for p in doc["probes"])
    assert "postgres" in doc["settings"]

    cells = doc["cells"]
    planned = {(g["name"], s) for g in doc["groups"] for s in g["systems"]}
    assert {(c["group"], c["system"]) for c in cells} == planned
    for c in cells:
        assert isinstance(c["ok"], bool)
        if c["ok"] and c["spec"]["workload"] != "latency":
            assert c["rate"] >= 0
    homing = [c for c in cells if c["system"].startswith("homing-sqlite")]
    assert homing, "the smoke set must exercise homing on SQLite"
    failed = [(c["group"], c["system"], c.get("error")) for c in homing if not c["ok"]]
    assert not failed, failed
    lat = [c for c in cells if c["system"] == "homing-sqlite" and c["group"] == "latency-1"]
    assert lat and lat[0]["started"] > 0 and lat[0]["p99_ms"] >= lat[0]["p50_ms"]

    ids = {t["id"] for t in doc["targets"]}
    assert {"pg-vs-pgqueuer", "sqlite-batched-vs-raw", "pg-latency-p99"} <= ids
    for t in doc["targets"]:
        assert t["result"] in ("PASS", "FAIL", "n/a", "info")

    md = (out / "results.md").read_text()
    assert md.startswith("# homing side-by-side benchmark")
    assert "## Targets" in md and "| result |" in md
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "Targets" in proc.stdout


@pytest.mark.timeout(180)
def test_before_after_runs_a_cell_on_both_versions(tmp_path: Path) -> None:
    """``python -m bench.ab`` checks a revision out beside the working tree and runs the
    cell on each; against HEAD both sides succeed and a ratio is printed, and ``--out``
    writes the same table with the command that made it."""
    out = tmp_path / "ab.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ab", "--base", "HEAD", "--reps", "1"]
        + ["--cells", "drain-1-worker-sqlite", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| drain-1"))
    assert row.rstrip(" |").endswith("x"), row  # a ratio, so both sides produced a rate
    written = out.read_text()
    assert "python -m bench.ab --base HEAD" in written and row in written


@pytest.mark.timeout(120)
def test_statement_costs_run_on_two_trees() -> None:
    """bench/statements.py times the job path's statements as the job API sends them, on
    every tree given (here the working tree twice): a table row each."""
    sizes = ["--batch", "5", "--rounds", "2", "--passes", "1"]
    proc = _run_script("bench/statements.py", *sizes, "--src", "src", str(ROOT / "src"))
    rows = [ln for ln in proc.stdout.splitlines() if "insert" in ln and "complete" in ln]
    assert len(rows) == 2, proc.stdout


def test_a_steady_drain_is_timed_from_when_every_consumer_runs() -> None:
    """The workers-N cells time a drain from the moment every consumer process has done a
    job (start-up skew left out), and fall back to the first completion when the backlog
    ran out first."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.drivers.__main__ import _steady_rate

    # 10,000 done by t=12; all consumers running at t=10 with 4,000 done: 6,000 in 2 s
    steady = _steady_rate(800.0, 10_000, 12.0, (4_000, 10.0))
    assert steady == {
        "rate_from_first": 800.0,
        "steady": True,
        "rate": 3000.0,
        "steady_jobs": 6000,
    }
    assert _steady_rate(800.0, 10_000, 12.0, None) == {"rate_from_first": 800.0, "steady": False}
    # too few jobs after every consumer ran: no steady window
    assert _steady_rate(800.0, 10_000, 12.0, (9_950, 11.9))["steady"] is False


@pytest.mark.timeout(120)
def test_wal_records_break_the_job_path_down() -> None:
    """bench/wal_records.py reads the WAL the job path wrote (pg_walinspect), per record type,
    for homing and the raw loop: both write B-tree leaf insertions and commits."""
    proc = _run_script("bench/wal_records.py", "--jobs", "20")
    assert "homing / raw:" in proc.stdout
    homing_part, raw_part = proc.stdout.split("homing: ", 1)[1].split("raw: ", 1)
    for part in (homing_part, raw_part.split("homing / raw:")[0]):
        assert "Btree INSERT_LEAF" in part and "Transaction COMMIT" in part, proc.stdout


@pytest.mark.timeout(120)
def test_grab_cost_reports_server_cpu_for_both_sides(tmp_path: Path) -> None:
    """bench/grab_cost.py measures the empty grab's server CPU (from /proc) for homing and
    for the raw loop, as it runs and with a generic plan, beside EXPLAIN ANALYZE's time."""
    out = tmp_path / "grab_cost.json"
    proc = _run_script("bench/grab_cost.py", "--points", "0", "300", "--out", str(out))
    doc = json.loads(out.read_text())
    for row in doc["rows"]:
        assert row["homing"]["server_cpu_us"] > 0 and row["raw"]["server_cpu_us"] > 0, row
        assert row["raw"]["server_cpu_us_generic_plan"] > 0, row
    assert "server CPU" in proc.stdout and "EXPLAIN ANALYZE" in proc.stdout


@pytest.mark.timeout(120)
def test_narrow_row_sketch_measures_three_layouts() -> None:
    """bench/narrow_row_sketch.py (item 3's measurement) runs the raw loop, homing and the
    sketched split layout, and the split layout writes fewer index entries than homing."""
    proc = _run_script("bench/narrow_row_sketch.py", "--jobs", "30")
    leaf = {
        line.split(":")[0].strip(): float(line.split(",")[1].split()[0])
        for line in proc.stdout.splitlines()
        if "B-tree leaf insertions" in line
    }
    assert set(leaf) == {"raw", "homing", "split"}, proc.stdout
    assert leaf["raw"] < leaf["split"] < leaf["homing"], leaf


@pytest.mark.timeout(120)
def test_uuid_migration_times_the_upgrade_of_a_filled_store() -> None:
    """bench/uuid_migration.py fills a store at jobs 7 (text ids) and times the upgrade."""
    proc = _run_script("bench/uuid_migration.py", "--jobs", "2000")
    assert "upgrade to jobs 8 took" in proc.stdout and "(id is uuid now)" in proc.stdout, (
        proc.stdout
    )
