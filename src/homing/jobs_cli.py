"""``homing cancel``, ``pause``, ``resume``, ``limit``, ``controls`` and ``schedules``:
the job features of docs/jobs.md from the command line."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from homing.cli import emit, json_option, open_db
from homing.errors import InvalidArgument


@click.command()
@click.argument("handle")
@click.option("--children", is_flag=True, help="Cancel the ready and running children of HANDLE.")
@click.option("--message", default=None, help="Reason, kept in the job's history.")
@json_option
@click.pass_context
def cancel(
    ctx: click.Context, handle: str, children: bool, message: str | None, as_json: bool
) -> None:
    """Cancel a job (a ready job never runs; a running job's completion is refused)."""
    with open_db(ctx) as db:
        if children:
            handles = db.cancel_children(handle, message)
            emit(
                {"cancelled": handles},
                as_json,
                lambda d: click.echo(f"{len(d['cancelled'])} cancelled"),
            )
            return
        previous = db.cancel(handle, message)
    emit(
        {"handle": handle, "was": previous},
        as_json,
        lambda d: click.echo(f"cancelled (was {d['was']})"),
    )


@click.command()
@click.argument("job_type")
@click.pass_context
def pause(ctx: click.Context, job_type: str) -> None:
    """Stop handing out jobs of JOB_TYPE (every worker within a second; until resume)."""
    with open_db(ctx) as db:
        db.pause(job_type)
    click.echo(f"{job_type}: paused")


@click.command()
@click.argument("job_type")
@click.pass_context
def resume(ctx: click.Context, job_type: str) -> None:
    """Hand out jobs of JOB_TYPE again."""
    with open_db(ctx) as db:
        db.resume(job_type)
    click.echo(f"{job_type}: resumed")


def _rate(text: str | None) -> Any:
    if text is None:
        return None
    count, sep, per = text.partition("/")
    try:
        if sep:
            return (int(count), float(per))
    except ValueError:
        pass
    raise InvalidArgument(f"--rate takes COUNT/SECONDS (for example 100/60), got {text!r}")


def _per_key(text: str) -> Any:
    field, sep, k = text.partition(":")
    if sep and not k.isdigit():
        raise InvalidArgument(
            f"--per-key takes FIELD or FIELD:K (for example user_id:1), got {text!r}"
        )
    return (field, int(k)) if sep else field


@click.command()
@click.argument("job_type")
@click.option(
    "--max-running", type=int, default=None, help="Jobs of the type running at once, at most."
)
@click.option("--rate", default=None, help="Grabs per window: COUNT/SECONDS.")
@click.option("--per-key", default=None, help="At most K running per args field: FIELD[:K].")
@click.option("--clear", is_flag=True, help="Remove every limit of the type.")
@json_option
@click.pass_context
def limit(
    ctx: click.Context,
    job_type: str,
    max_running: int | None,
    rate: str | None,
    per_key: str | None,
    clear: bool,
    as_json: bool,
) -> None:
    """Set the limits of JOB_TYPE, enforced in the store across all workers."""
    given: dict[str, Any] = {}
    if clear:
        given = {"max_running": None, "rate": None, "per_key": None}
    if max_running is not None:
        given["max_running"] = max_running
    if rate is not None:
        given["rate"] = _rate(rate)
    if per_key is not None:
        given["per_key"] = _per_key(per_key)
    with open_db(ctx) as db:
        control = db.limit(job_type, **given)
    emit(control, as_json, lambda c: click.echo(_describe(c.as_dict())))


def _describe(c: dict[str, Any]) -> str:
    parts = ["paused" if c["paused"] else "running"]
    if c["max_running"] is not None:
        parts.append(f"max_running={c['max_running']}")
    if c["rate_limit"] is not None:
        parts.append(f"rate={c['rate_limit']}/{c['rate_per']:g}s")
    if c["key_field"] is not None:
        parts.append(f"per_key={c['key_field']}:{c['key_limit']}")
    return f"{c['type']}: {' '.join(parts)}"


@click.command()
@json_option
@click.pass_context
def controls(ctx: click.Context, as_json: bool) -> None:
    """The job types that are paused or limited."""
    with open_db(ctx) as db:
        rows = [c.as_dict() for c in db.controls()]

    def human(rs: list[dict[str, Any]]) -> None:
        for r in rs:
            click.echo(_describe(r))
        if not rs:
            click.echo("no job type is paused or limited")

    emit(rows, as_json, human)


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


@click.command()
@json_option
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Periodic schedules with their last and next tick."""
    with open_db(ctx) as db:
        rows = db.schedules()

    def human(rs: list[dict[str, Any]]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table("name", "cron", "tz", "type", "missed", "last tick", "next tick")
        for r in rs:
            table.add_row(
                r["name"],
                r["cron"],
                r["tz"],
                r["type"],
                r["missed"],
                _when(r["last_tick"]),
                _when(r["next_tick"]),
            )
        Console().print(table)

    emit(rows, as_json, human)
