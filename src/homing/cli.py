"""The ``homing`` command. Parts add subcommands through ``PLUGINS`` (loaded lazily)."""

from __future__ import annotations

import importlib
import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

import click

from homing.errors import HomingError

DEFAULT_DB = "sqlite:///homing.db"

# name -> "module:attribute" of a click command, owned by the part that provides it.
PLUGINS: dict[str, str] = {
    "worker": "homing.worker.cli:worker",
    "queues": "homing.engine.cli:queues",
    "serve": "homing.serve:serve",
    "http": "homing.http.cli:http",
    "messenger": "homing.messenger.cli:messenger",
    "sessions": "homing.sessions.cli:sessions",
    "pipeline": "homing.pipeline.cli:pipeline",
    "demo": "homing.demo:demo",
    "dashboard": "homing.dashboard.cli:dashboard",
    "cancel": "homing.jobs_cli:cancel",
    "pause": "homing.jobs_cli:pause",
    "resume": "homing.jobs_cli:resume",
    "limit": "homing.jobs_cli:limit",
    "controls": "homing.jobs_cli:controls",
    "schedules": "homing.jobs_cli:schedules",
}
# The extra that brings a command's third-party packages, named when one is missing.
EXTRAS: dict[str, str] = {
    "serve": "http",
    "http": "http",
    "sessions": "http",
    "messenger": "messenger",
    "pipeline": "spark,pipeline",
    "dashboard": "dashboard",
}


def _missing_extra(name: str, package: str) -> click.Command:
    """A stand-in for a command whose extra is not installed: one clear line, exit 1."""

    @click.command(
        name=name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"(not installed: pip install 'homing[{EXTRAS.get(name, 'all')}]')",
    )
    def stub() -> None:
        raise click.ClickException(
            f"homing {name} needs the {package} package, which is not installed: "
            f"pip install 'homing[{EXTRAS.get(name, 'all')}]'"
        )

    return stub


class HomingGroup(click.Group):
    """Turns homing's own errors into one clear line and exit code 1, never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n in PLUGINS if self._load(n)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or self._load(name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = PLUGINS.get(name)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None  # that part is not installed / not written yet
            if exc.name and not exc.name.startswith("homing"):
                return _missing_extra(name, exc.name.split(".")[0])
            raise
        command = getattr(module, attr, None)
        return command if isinstance(command, click.Command) else None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HomingError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def emit(data: Any, as_json: bool, human: Callable[[Any], None] | None = None) -> None:
    """Print ``data`` as JSON (``--json``) or with the human formatter."""
    if as_json or human is None:
        click.echo(json.dumps(_jsonable(data), indent=2, default=str))
    else:
        human(data)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


def upkeep_options(who: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--gc-every`` and ``--vacuum-every`` of a long-running command that keeps the store
    tidy while it runs (``homing.upkeep``); ``who`` names it in the help."""

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--vacuum-every",
            type=click.FloatRange(min=0),
            default=60.0,
            show_default=True,
            help="PostgreSQL without autovacuum only: seconds between VACUUMs of homing's "
            "tables that hold dead rows (one process at a time does it; 0: never).",
        )(fn)
        return click.option(
            "--gc-every",
            type=click.FloatRange(min=0),
            default=3600.0,
            show_default=True,
            help=f"Seconds between `homing gc` passes run by this {who} (0: leave it to cron).",
        )(fn)

    return add


def open_db(ctx: click.Context) -> Any:
    from homing.database import connect

    url = ctx.obj["db"]
    urls = [u for u in url.split(",") if u] if "," in url else url
    return connect(urls, migrate=ctx.obj.get("migrate", True))


@click.group(cls=HomingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    envvar="HOMING_DB",
    default=DEFAULT_DB,
    show_default=True,
    help="Store URL (sqlite:///file.db or postgresql://...; comma-separated for shards). Env: HOMING_DB.",
)
@click.version_option(package_name="homing")
@click.pass_context
def cli(ctx: click.Context, db: str) -> None:
    """homing: exactly-once messaging, durable jobs and data pipelines."""
    ctx.ensure_object(dict)
    ctx.obj["db"] = db


@cli.command()
@json_option
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Apply pending schema migrations."""
    ctx.obj["migrate"] = False
    with open_db(ctx) as db:
        applied = db.migrate()
    emit(
        {"applied": applied},
        as_json,
        lambda d: click.echo("\n".join(d["applied"]) or "schema is up to date"),
    )


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from exc


@cli.command()
@click.argument("type")
@click.argument("args", default="null")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--delay", type=float, default=0.0, help="Seconds from now until the job may run.")
@click.option("--unique-key", default=None, help="Idempotency key: a repeat returns the first job.")
@json_option
@click.pass_context
def insert(
    ctx: click.Context,
    type: str,
    args: str,
    priority: int,
    delay: float,
    unique_key: str | None,
    as_json: bool,
) -> None:
    """Insert a job of TYPE with JSON ARGS; prints its handle."""
    payload = _parse_json(args, "ARGS")
    with open_db(ctx) as db:
        run_at = time.time() + delay if delay else None  # None: due now by the store's clock
        handle = db.insert(type, payload, priority=priority, run_at=run_at, unique_key=unique_key)
    emit({"handle": handle}, as_json, lambda d: click.echo(d["handle"]))


@cli.command()
@click.argument("types")
@click.option(
    "--lock-for", type=float, default=60.0, show_default=True, help="Lease length in seconds."
)
@click.option("--where", default=None, help="JSON search on args, e.g. '{\"user\": 5}'.")
@json_option
@click.pass_context
def grab(ctx: click.Context, types: str, lock_for: float, where: str | None, as_json: bool) -> None:
    """Lease one job of TYPES (comma-separated); prints it, exit 3 if none is available."""
    filt = _parse_json(where, "--where") if where else None
    with open_db(ctx) as db:
        job = db.grab(types.split(","), lock_for=lock_for, where=filt)
    if job is None:
        click.echo("no job available", err=True)
        sys.exit(3)
    emit(
        job,
        as_json,
        lambda j: click.echo(
            f"{j.handle} {j.type} attempt {j.attempts} lease {j.lease_token} "
            f"until {time.strftime('%H:%M:%S', time.localtime(j.lease_expires_at))}\n{json.dumps(j.args)}"
        ),
    )


@cli.command()
@click.argument("handle")
@click.option("--lease-token", required=True, help="The token printed by grab.")
@click.option("--fail", "fail_message", default=None, help="Temp-fail with this message instead.")
@click.option("--retry-in", type=float, default=60.0, show_default=True)
@click.option(
    "--perm-fail", "perm_message", default=None, help="Perm-fail with this message instead."
)
@json_option
@click.pass_context
def complete(
    ctx: click.Context,
    handle: str,
    lease_token: str,
    fail_message: str | None,
    retry_in: float,
    perm_message: str | None,
    as_json: bool,
) -> None:
    """Complete (or --fail / --perm-fail) the job HANDLE held with --lease-token."""
    with open_db(ctx) as db:
        if perm_message is not None:
            db.perm_fail(handle, perm_message, lease_token=lease_token)
        elif fail_message is not None:
            db.temp_fail(handle, fail_message, retry_in=retry_in, lease_token=lease_token)
        else:
            db.complete(handle, lease_token=lease_token)
    emit({"ok": True, "handle": handle}, as_json, lambda _d: click.echo("ok"))


def _print_details(d: Any) -> None:
    fmt = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"  # noqa: E731
    click.echo(
        f"job       {d.handle}\ntype      {d.type}\nstate     {d.state}\nattempts  {d.attempts}"
    )
    click.echo(f"priority  {d.priority}\nrun_at    {fmt(d.run_at)}\ncreated   {fmt(d.created_at)}")
    if d.holder:
        click.echo(
            f"holder    {d.holder.host} pid {d.holder.pid} ({d.holder.worker}) until {fmt(d.lease_expires_at)}"
        )
    if d.unique_key:
        click.echo(f"unique    {d.unique_key}")
    click.echo(f"args      {json.dumps(d.args)}")
    for f in d.failures:
        click.echo(
            f"  {fmt(f.at)} attempt {f.attempt} {f.kind} on {f.host} pid {f.pid}: {f.message}"
        )


@cli.command()
@click.argument("handle")
@json_option
@click.pass_context
def details(ctx: click.Context, handle: str, as_json: bool) -> None:
    """Show a job: args, state, attempts, holder, failure history."""
    with open_db(ctx) as db:
        emit(db.details(handle), as_json, _print_details)


@cli.command()
@click.argument("handle")
@json_option
@click.pass_context
def redrive(ctx: click.Context, handle: str, as_json: bool) -> None:
    """Run a perm-failed job again (attempts reset, history kept)."""
    with open_db(ctx) as db:
        db.redrive(handle)
    emit({"ok": True, "handle": handle}, as_json, lambda _d: click.echo("ok"))


def _print_stats(rows: list[dict[str, Any]]) -> None:
    from homing._tables import print_table

    states = ("ready", "scheduled", "staged", "running", "expired", "done", "failed")
    # the states of the job features (issue 16) only when some type has them: the table
    # stays readable in 80 columns
    extra = [k for k in ("cancelled", "waiting") if any(r.get(k) for r in rows)]
    headers = (
        "type",
        "ready",
        "sched",
        "staged",
        "run",
        "expired",
        "done",
        "failed",
        *extra,
        "oldest",
        "done/s",
    )
    print_table(
        headers,
        (
            (
                r["type"] + (" (paused)" if r.get("paused") else ""),
                *(r.get(k, 0) for k in (*states, *extra)),
                f"{r['oldest_ready_age_s']:.1f}s" if r["oldest_ready_age_s"] is not None else "-",
                f"{r['done_per_s']:.1f}",
            )
            for r in rows
        ),
    )
    click.echo("sched: scheduled for later, run: running, oldest: oldest ready job's age")


@cli.command()
@click.option(
    "--window", type=float, default=60.0, show_default=True, help="Seconds for the throughput."
)
@json_option
@click.pass_context
def stats(ctx: click.Context, window: float, as_json: bool) -> None:
    """Per job type: counts by state, oldest ready job's age, throughput."""
    with open_db(ctx) as db:
        emit(db.stats(window=window), as_json, _print_stats)


def _print_workers(rows: list[dict[str, Any]]) -> None:
    from homing._process import alive
    from homing._tables import print_table

    if not rows:
        click.echo("no worker grabbed recently or holds a job")
        return
    here, now = socket.gethostname(), time.time()

    def state(r: dict[str, Any]) -> str:
        if r["host"] != here:
            return "?"
        return "alive" if alive(int(r["pid"])) else "gone"

    print_table(
        ("worker", "host", "pid", "process", "seen", "running"),
        (
            (
                r["worker"],
                r["host"],
                r["pid"],
                state(r),
                f"{max(0.0, now - r['seen_at']):.0f}s ago",
                r["running"],
            )
            for r in rows
        ),
        text_columns=2,
    )
    click.echo("seen: its last registration (renewed while it grabs, every 10 min at most)")
    click.echo("process: on this host, whether its pid still runs (? on another host)")


@cli.command()
@click.option(
    "--within",
    type=float,
    default=None,
    help="Seconds back to look for grabs (workers holding jobs are always listed); "
    "default 900, past the registrations' 10-minute renewal.",
)
@json_option
@click.pass_context
def workers(ctx: click.Context, within: float | None, as_json: bool) -> None:
    """The workers that grabbed jobs lately or hold some now, with how many they hold."""
    if within is not None and within <= 0:
        raise click.BadParameter("must be positive", param_hint="--within")
    with open_db(ctx) as db:
        rows = db.workers() if within is None else db.workers(within=within)
        emit(rows, as_json, _print_workers)


@cli.command()
@click.option(
    "--older-than",
    type=float,
    default=None,
    help="Seconds finished jobs are kept; default: the jobs retention (7 days).",
)
@click.option("--sessions-retention", type=float, default=None, help="Seconds; default 30 days.")
@click.option("--session-ttl", type=float, default=None, help="Idle seconds; default 30 days.")
@click.option("--engine-retention", type=float, default=None, help="Seconds; default 7 days.")
@click.option("--http-retention", type=float, default=None, help="Seconds; default 7 days.")
@click.option(
    "--messenger-retention", type=float, default=None, help="Idle seconds; default 7 days."
)
@json_option
@click.pass_context
def gc(
    ctx: click.Context,
    older_than: float | None,
    sessions_retention: float | None,
    session_ttl: float | None,
    engine_retention: float | None,
    http_retention: float | None,
    messenger_retention: float | None,
    as_json: bool,
) -> None:
    """Clean every table that grows: finished jobs, taken session requests, expired
    sessions (with their requests and replies), the engine's published-id ledger, HTTP
    tombstones and the durable messenger's idle rows, each past its retention (docs/operations in homing.housekeeping)."""
    from dataclasses import replace

    from homing.housekeeping import Retention, collect

    given = {
        "jobs": older_than,
        "sessions": sessions_retention,
        "session_ttl": session_ttl,
        "engine_published": engine_retention,
        "http": http_retention,
        "messenger": messenger_retention,
    }
    retention = replace(Retention(), **{k: v for k, v in given.items() if v is not None})
    with open_db(ctx) as db:
        totals: dict[str, int] = {}
        for one in getattr(db, "live_shards", lambda: [db])():
            for table, n in collect(one, retention).items():
                totals[table] = totals.get(table, 0) + n
    data = {"deleted": sum(totals.values()), "tables": totals}

    def human(d: dict[str, Any]) -> None:
        for table, n in d["tables"].items():
            click.echo(f"{table:20} {n} deleted")

    emit(data, as_json, human)


def main() -> None:
    cli(prog_name="homing")
