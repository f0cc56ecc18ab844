"""``homing pipeline``: run seed 002's fan-out end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click


@click.group()
def pipeline() -> None:
    """The data pipeline: FiredEvent -> ProcessSubscription -> ProcessNotification -> delivery."""


@pipeline.command()
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--events", default=20, show_default=True, help="FiredEvent jobs.")
@click.option("--subscribers", default=1000, show_default=True, help="Followers per event (topic).")
@click.option("--workers", default=3, show_default=True, help="Delivery worker processes.")
@click.option("--concurrency", default=8, show_default=True, help="Handler threads per worker.")
@click.option("--kills", default=3, show_default=True, help="Workers to SIGKILL along the way.")
@click.option("--lock-for", default=5.0, show_default=True, help="Delivery lease seconds.")
@click.option(
    "--retry-scale",
    default=1 / 600,
    show_default=True,
    help="Multiply the SMTP retry schedule (5 min .. 4.5 days) by this; 1 = real time. "
    "Giving up never comes before --timeout.",
)
@click.option(
    "--temp-pct",
    default=3,
    show_default=True,
    help="% of first attempts refused (SMTP 451, HTTP 503), and % of webhook answers lost.",
)
@click.option("--chunk", default=20_000, show_default=True, help="Parents per Spark replace.")
@click.option(
    "--data-dir",
    default="pipeline-data",
    show_default=True,
    type=click.Path(path_type=Path),
    help="Where the subscriptions tables and receipt logs go.",
)
@click.option(
    "--timeout",
    default=1800.0,
    show_default=True,
    help="Fail the run if deliveries are not done this many seconds after the Spark stages.",
)
@click.option(
    "--kill-executor",
    is_flag=True,
    help="SIGKILL one Spark executor JVM while a replace is between its tasks' writes and "
    "its commit (needs a spark:// or local-cluster master).",
)
@click.option(
    "--discard-leftovers",
    is_flag=True,
    help="Cancel the unfinished jobs of earlier runs in the store before starting (a run "
    "refuses to start beside them). Only for runs that were stopped, not ones still going.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON too.")
@click.option(
    "--dashboard",
    type=click.Choice(["during", "keep", "off"]),
    default="during",
    show_default=True,
    help="Serve the web dashboard on a free 127.0.0.1 port while the run goes (during), "
    "and after it until Ctrl-C (keep), or not at all (off). Needs homing[dashboard].",
)
@click.pass_context
def run(
    ctx: click.Context,
    master: str,
    events: int,
    subscribers: int,
    workers: int,
    concurrency: int,
    kills: int,
    lock_for: float,
    retry_scale: float,
    temp_pct: int,
    chunk: int,
    data_dir: Path,
    timeout: float,
    kill_executor: bool,
    discard_leftovers: bool,
    as_json: bool,
    dashboard: str,
) -> None:
    """Run the pipeline once on --db (default: a SQLite file here) and check it."""
    from rich.console import Console

    from homing.pipeline.run import PipelineConfig, print_report, run_pipeline

    db = (ctx.obj or {}).get("db") or "sqlite:///homing.db"
    console = Console()
    cfg = PipelineConfig(
        db=db,
        master=master,
        events=events,
        subscribers=subscribers,
        workers=workers,
        concurrency=concurrency,
        kills=kills,
        lock_for=lock_for,
        retry_scale=retry_scale,
        temp_pct=temp_pct,
        chunk=chunk,
        data_dir=data_dir,
        timeout=timeout,
        kill_executor=kill_executor,
        discard_leftovers=discard_leftovers,
    )
    dash = _start_dashboard(db, console) if dashboard != "off" else None
    try:
        report = run_pipeline(cfg, console=console)
        print_report(report, console)
        _keep_dashboard(dash, db, console, keep=dashboard == "keep")
    finally:
        if dash is not None:
            dash.stop()
            dash.db.close()
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    (data_dir / f"run-{report.run}" / "report.json").write_text(
        json.dumps(report.as_dict(), indent=2)
    )
    if not report.ok:
        sys.exit(1)


def _start_dashboard(db_url: str, console: Any) -> Any:
    """The dashboard on a free loopback port for this run, or None if it is not installed."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("jinja2", "prometheus_client", "uvicorn")):
        console.print("(pip install 'homing[dashboard]' to watch the run in a web dashboard)")
        return None
    import homing
    from homing.dashboard.server import BackgroundDashboard

    urls = [u for u in db_url.split(",") if u] if "," in db_url else db_url
    dash = BackgroundDashboard(homing.connect(urls)).start()
    console.print(f"[bold]dashboard:[/] {dash.url} (job types, failures, HTTP outbox, live)")
    return dash


def _keep_dashboard(dash: Any, db_url: str, console: Any, *, keep: bool) -> None:
    if dash is None:
        return
    if not keep:
        console.print(
            f"look at this store again with: homing --db {db_url} dashboard "
            "(or run with --dashboard keep)"
        )
        return
    console.print(f"dashboard still on {dash.url}; Ctrl-C to stop")
    try:
        while dash.thread.is_alive():
            dash.thread.join(1.0)
    except KeyboardInterrupt:
        pass
