"""``/metrics`` scraped from a running ``homing worker --metrics-port`` (its own counters
and histograms plus the store's gauges), and a command whose extra is missing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

import homing
from homing.dashboard.server import free_port

APP = """
import os, time
from homing.worker import App
app = App()
@app.job("noop")
def noop(job, ctx):
    pass
@app.job("hold")
def hold(job, ctx):
    while not os.path.exists({gate!r}):
        time.sleep(0.02)
"""


def _value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def _scrape_until(url: str, series: dict[str, float], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        try:
            text = httpx.get(url, timeout=10).text
        except httpx.TransportError:
            text = ""
        if all(_value(text, s) == v for s, v in series.items()):
            return text
        time.sleep(0.1)
    raise AssertionError(f"never saw {series} in:\n{text}")


def test_worker_serves_metrics_while_it_runs(store_url: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    app = tmp_path / "metrics_app.py"
    app.write_text(APP.format(gate=str(gate)))
    with homing.connect(store_url) as db:
        db.insert_many([("noop", {"i": i}) for i in range(3)])
        held = db.insert("hold", {})
        port = free_port()
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "homing",
                "--db",
                store_url,
                "worker",
                "--app",
                f"{app}:app",
                "--metrics-port",
                str(port),
                "--concurrency",
                "2",
            ],
            stderr=subprocess.PIPE,
        )
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            text = _scrape_until(
                url,
                {
                    'homing_worker_jobs_total{outcome="done",type="noop"}': 3.0,
                    'homing_jobs{state="running",type="hold"}': 1.0,
                },
            )
            assert _value(text, 'homing_worker_job_run_seconds_count{type="noop"}') == 3.0
            assert _value(text, 'homing_worker_job_wait_seconds_count{type="noop"}') == 3.0
            assert 'homing_jobs_oldest_ready_age_seconds{type="noop"}' in text
            assert "homing_engine_queue_messages" in text
            assert (_value(text, "homing_workers_live") or 0.0) >= 1.0
            held_by = [  # the worker holding the "hold" job, from the holder registry
                line
                for line in text.splitlines()
                if line.startswith("homing_workers_jobs_held{") and f":{worker.pid}:" in line
            ]
            assert len(held_by) == 1 and held_by[0].endswith(" 1.0"), held_by
            gate.touch()
            _scrape_until(url, {'homing_worker_jobs_total{outcome="done",type="hold"}': 1.0})
            assert db.details(held).state == "done"
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err.decode()


def test_a_missing_extra_names_the_extra(tmp_path: Path) -> None:
    # A Python whose path hides starlette: `homing serve` must say which extra to install.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "starlette.py").write_text("raise ModuleNotFoundError(name='starlette')\n")
    code = (
        "import sys; sys.modules['starlette'] = None; "
        "from homing.cli import main; sys.argv = ['homing', 'serve']; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 1
    assert "pip install 'homing[http]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_mounts_the_dashboard_and_its_metrics(store_url: str) -> None:
    with homing.connect(store_url) as db:
        db.insert("email", {"user": 1})
    port = free_port()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "homing",
            "--db",
            store_url,
            "serve",
            "--port",
            str(port),
            "--no-dispatch",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}/dashboard"
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(base + "/", timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and serve.poll() is None
                time.sleep(0.1)
        assert page.status_code == 200 and 'data-type="email"' in page.text
        assert 'href="/dashboard/jobs"' in page.text  # links stay under the mount
        metrics = httpx.get(base + "/metrics", timeout=10).text
        assert 'homing_jobs{state="ready",type="email"} 1.0' in metrics
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=60)
