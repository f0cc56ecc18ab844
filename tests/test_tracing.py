"""OpenTelemetry spans of jobs: one trace per job (its UUID), every attempt in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import homing
from homing.worker import App, RetryLater


def test_each_attempt_of_a_job_is_a_span_of_the_jobs_trace(store_url: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from homing.tracing import JobTracer, trace_id_of

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = App()
    tries: list[int] = []

    @app.job("flaky")
    def flaky(job: homing.Job, ctx: object) -> None:
        tries.append(job.attempts)
        if job.attempts == 1:
            raise RetryLater("busy, try again", 0.0)

    with homing.connect(store_url) as db:
        handle = db.insert("flaky", {"n": 1})
        worker = app.worker(db=db, until_idle=True)
        worker.observers.append(JobTracer(provider).observe)
        worker.run()
        job_id = handle.split(":")[-1]
        assert db.details(handle).state == "done"
    provider.shutdown()
    runs = [s for s in exporter.get_finished_spans() if s.name == "homing.job flaky"]
    assert [s.attributes["homing.job.outcome"] for s in runs] == ["retry", "done"]
    assert {s.context.trace_id for s in runs} == {trace_id_of(job_id)}
    assert [s.attributes["homing.job.attempt"] for s in runs] == [1, 2]
    assert all(s.end_time >= s.start_time for s in runs)


def test_worker_traces_flag_prints_spans(store_url: str, tmp_path: Path) -> None:
    app = tmp_path / "traced_app.py"
    app.write_text(
        "from homing.worker import App\napp = App()\n"
        "@app.job('noop')\ndef noop(job, ctx):\n    pass\n"
    )
    with homing.connect(store_url) as db:
        handle = db.insert("noop", {})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "homing",
            "--db",
            store_url,
            "worker",
            "--app",
            f"{app}:app",
            "--until-idle",
            "--traces",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "homing.job noop"' in done.stderr and handle in done.stderr
