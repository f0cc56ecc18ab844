"""``homing worker``: run an app's handlers in this process until SIGTERM."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import click

from homing.cli import upkeep_options
from homing.errors import ConfigurationError
from homing.worker._logging import configure
from homing.worker.app import App


def load_app(target: str) -> App:
    """Load ``module:attribute`` or ``path/to/file.py:attribute`` (attribute default ``app``)."""
    module_name, _, attr = target.partition(":")
    attr = attr or "app"
    if not module_name:
        raise ConfigurationError(f"--app {target!r}: expected module:app or path/file.py:app")
    try:
        if module_name.endswith(".py") or "/" in module_name:
            path = Path(module_name).resolve()
            if not path.is_file():
                raise ConfigurationError(f"--app {target!r}: no file {path}")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None:
                raise ConfigurationError(f"--app {target!r}: cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and "." not in sys.path:
                sys.path.insert(0, "")  # like `python -m`: the working directory's modules
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--app {target!r}: cannot import {module_name}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigurationError(
            f"--app {target!r}: {module_name}.{attr} is {type(app).__name__}, not a homing.App"
        )
    return app


@click.command()
@click.option("--app", "app_target", required=True, help="The App: module:app or file.py:app.")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1024),
    default=4,
    show_default=True,
    help="Handler threads (async handlers share the same number of slots).",
)
@click.option("--types", default=None, help="Comma-separated job types (default: all the app's).")
@click.option(
    "--lock-for",
    type=float,
    default=None,
    help="Lease seconds; a killed worker's jobs come back after this. Default: the app's.",
)
@click.option(
    "--grace",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds running handlers get to finish after SIGTERM before their leases are released.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 10_000),
    default=None,
    help="Jobs grabbed beyond the free handler slots (default: max(4, concurrency), more for "
    "short handlers, up to 16 per slot); 0 for long jobs.",
)
@upkeep_options("worker")
@click.option(
    "--gather",
    type=click.FloatRange(min=0),
    default=0.005,
    show_default=True,
    help="Seconds a worker woken by an insert waits before grabbing, so one grab takes several jobs.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus /metrics for this worker on 127.0.0.1:PORT (needs homing[dashboard]).",
)
@click.option(
    "--traces",
    is_flag=True,
    help="Print an OpenTelemetry span per job attempt on stderr (needs homing[otel]; in code, "
    "homing.tracing.JobTracer sends them to your own exporter).",
)
@click.option("--until-idle", is_flag=True, help="Exit once no job is available and none runs.")
@click.option("--name", default="worker", show_default=True, help="Worker name in leases and logs.")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
@click.pass_context
def worker(
    ctx: click.Context,
    app_target: str,
    concurrency: int,
    types: str | None,
    lock_for: float | None,
    grace: float,
    prefetch: int | None,
    gc_every: float,
    vacuum_every: float,
    gather: float,
    metrics_port: int | None,
    traces: bool,
    until_idle: bool,
    name: str,
    log_format: str,
    log_level: str,
) -> None:
    """Run the handlers of --app: grab jobs, run them, retry failures, until SIGTERM.

    The store is the app's own URL unless --db / HOMING_DB is given, which wins.
    """
    configure(log_format, log_level)
    app = load_app(app_target)
    parent = ctx.find_root()
    obj = parent.obj or {}
    source = parent.get_parameter_source("db")
    explicit = source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")
    db = obj.get("db") if explicit or app.db is None else None
    type_list = [t.strip() for t in types.split(",") if t.strip()] if types else None
    if grace < 0:
        raise click.BadParameter("must be >= 0", param_hint="--grace")
    w = app.worker(
        db=db,
        concurrency=concurrency,
        types=type_list,
        lock_for=lock_for,
        grace=grace,
        prefetch=prefetch,
        gc_every=gc_every,
        vacuum_every=vacuum_every,
        gather=gather,
        until_idle=until_idle,
        name=name,
    )
    if metrics_port is not None:
        from homing.extras import require

        require("prometheus_client", "dashboard", "homing worker --metrics-port")
        from homing.metrics import WorkerMetrics

        metrics = WorkerMetrics()
        metrics.serve(metrics_port, store=w.db)
        w.observers.append(metrics.observe)
    if traces:
        from homing.extras import require

        require("opentelemetry.sdk", "otel", "homing worker --traces")
        from homing.tracing import JobTracer, console_provider

        w.observers.append(JobTracer(console_provider()).observe)
    w.run(
        ready=lambda: click.echo(
            f"homing worker {w.worker_id} ready: {','.join(w.types)} x{w.concurrency} "
            f"on {w.dialect}",
            err=True,
        )
    )
