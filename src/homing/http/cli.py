"""``homing http``: dead letters and failed deliveries of reliable HTTP, from the shell."""

from __future__ import annotations

import base64
import time
from dataclasses import asdict
from typing import Any

import click

from homing.cli import emit, json_option, open_db
from homing.database import Database
from homing.errors import ConfigurationError
from homing.http import admin


def _db(ctx: click.Context) -> Database:
    db = open_db(ctx)
    if not isinstance(db, Database):
        db.close()
        raise ConfigurationError("homing http works on one store, not a sharded list of URLs")
    return db


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _body(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def _ids(ids: tuple[str, ...], all_: bool) -> list[str] | None:
    if bool(ids) == all_:
        raise click.UsageError("give message ids, or --all (not both)")
    return None if all_ else list(ids)


@click.group()
def http() -> None:
    """Reliable HTTP: dead letters (receiver) and failed deliveries (sender)."""


@http.command("dead-letters")
@click.option("--path", default=None, help="Only dead letters of this node path.")
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@click.pass_context
def dead_letters(ctx: click.Context, path: str | None, limit: int, as_json: bool) -> None:
    """List messages this receiver acknowledged and could not handle (body and history)."""
    with _db(ctx) as db:
        rows = admin.dead_letters(db, limit=limit, path=path)
    data = [{**asdict(r), "body": _body(r.body)} for r in rows]

    def human(items: list[dict[str, Any]]) -> None:
        if not items:
            click.echo("no dead letters")
        for d in items:
            click.echo(
                f"{d['id']} {d['mode']} {d['path']} attempts {d['attempts']} "
                f"dead {_when(d['dead_at'])}: {d['error']}"
            )

    emit(data, as_json, human)


@http.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.pass_context
def redrive(ctx: click.Context, ids: tuple[str, ...], all_: bool) -> None:
    """Put dead letters back in the inbox (a running receiver handles them again)."""
    with _db(ctx) as db:
        n = admin.redrive(db, _ids(ids, all_))
    click.echo(f"redriven: {n}")


@http.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.pass_context
def purge(ctx: click.Context, ids: tuple[str, ...], all_: bool) -> None:
    """Give up on dead letters for good (their bodies are dropped)."""
    with _db(ctx) as db:
        n = admin.purge_dead_letters(db, _ids(ids, all_))
    click.echo(f"purged: {n}")


@http.command()
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@click.pass_context
def failed(ctx: click.Context, limit: int, as_json: bool) -> None:
    """List outbox messages that failed (fatal answer or absurd deadline)."""
    with _db(ctx) as db:
        rows = admin.failed_deliveries(db, limit=limit)

    def human(items: list[dict[str, Any]]) -> None:
        if not items:
            click.echo("no failed deliveries")
        for d in items:
            click.echo(
                f"{d['id']} {d['kind']} {d['method']} {d['url']} attempts {d['attempts']} "
                f"failed {_when(d['finished_at'])}: {d['last_error']}"
            )

    emit([asdict(r) for r in rows], as_json, human)


@http.command("redrive-failed")
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every failed delivery.")
@click.option(
    "--absurd-after",
    type=float,
    default=3 * 24 * 3600.0,
    show_default=True,
    help="New deadline (s).",
)
@click.pass_context
def redrive_failed(
    ctx: click.Context, ids: tuple[str, ...], all_: bool, absurd_after: float
) -> None:
    """Send failed outbox messages again under their own ids (a dispatcher delivers them)."""
    with _db(ctx) as db:
        n = admin.redrive_failed(db, _ids(ids, all_), absurd_after=absurd_after)
    click.echo(f"redriven: {n}")


@http.command()
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@click.pass_context
def endpoints(ctx: click.Context, limit: int, as_json: bool) -> None:
    """List failing endpoints and those disabled by the disable-after rule."""
    with _db(ctx) as db:
        rows = admin.endpoints(db, limit=limit)

    def human(items: list[dict[str, Any]]) -> None:
        if not items:
            click.echo("no failing endpoints")
        for d in items:
            state = (
                f"DISABLED {_when(d['disabled_at'])}: {d['reason']}"
                if d["disabled_at"]
                else "failing"
            )
            click.echo(f"{d['endpoint']} since {_when(d['failing_since'])} {state}")

    emit([asdict(r) for r in rows], as_json, human)


@http.command()
@click.argument("endpoint")
@click.pass_context
def enable(ctx: click.Context, endpoint: str) -> None:
    """Enable a disabled ENDPOINT again (then: homing http redrive-failed)."""
    with _db(ctx) as db:
        found = admin.enable(db, endpoint)
    if not found:
        raise click.UsageError(f"no failing or disabled endpoint {endpoint!r}")
    click.echo(f"enabled: {endpoint}")
