"""``homing sessions``: inspect client sessions and look up past requests."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from homing.cli import emit, json_option, open_db, upkeep_options
from homing.errors import ConfigurationError
from homing.sessions._model import Recovery, RequestRecord, SessionInfo
from homing.sessions.manager import Sessions


def _sessions(db: Any) -> Sessions:
    if hasattr(db, "shards"):
        raise ConfigurationError("sessions live in one store; pass one URL with --db, not shards")
    return Sessions(db)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


@click.group()
def sessions() -> None:
    """Client sessions of queued request/reply (seed 004)."""


@sessions.command()
@click.argument("client_id")
@json_option
@click.pass_context
def show(ctx: click.Context, client_id: str, as_json: bool) -> None:
    """Show the session of CLIENT_ID and the recovery state of each of its requests."""
    with open_db(ctx) as db:
        api = _sessions(db)
        info = api.info(client_id)
        rec = api.attach(client_id).recover()

    def human(data: tuple[SessionInfo, Recovery]) -> None:
        i, r = data
        click.echo(f"client          {i.client_id}\nconnects        {i.connects}")
        click.echo(
            f"created         {_when(i.created_at)}\nreconnected     {_when(i.reconnected_at)}"
        )
        click.echo(f"LastRequest     {i.last_request_id or '-'}")
        click.echo(f"LastEnqueuedID  {i.last_enqueued_id or '-'}")
        click.echo(f"LastDequeuedID  {i.last_dequeued_id or '-'}")
        if r.last is not None:
            click.echo(f"last request    state {r.last.state}: {r.last.meaning} -> {r.last.action}")
        for s in r.requests:
            click.echo(f"  {s.request_id}  {s.state}  {s.action:17}  {json.dumps(s.body)[:60]}")

    data = (info, rec)
    if as_json:
        emit({"session": info.as_dict(), "recovery": rec.as_dict()}, True)
    else:
        human(data)


@sessions.command()
@click.argument("request_id")
@json_option
@click.pass_context
def lookup(ctx: click.Context, request_id: str, as_json: bool) -> None:
    """Status and reply of any request within the retention period."""
    with open_db(ctx) as db:
        record = _sessions(db).lookup(request_id)

    def human(r: RequestRecord) -> None:
        click.echo(f"request   {r.id}\nclient    {r.client_id}\nqueue     {r.queue}")
        click.echo(f"state     {r.state}\nattempts  {r.attempts}\nserver    {r.server or '-'}")
        click.echo(f"created   {_when(r.created_at)}\nreplied   {_when(r.replied_at)}")
        click.echo(f"taken     {_when(r.taken_at)}\nconfirmed {_when(r.confirmed_at)}")
        click.echo(f"body      {json.dumps(r.body)}")
        click.echo(
            f"reply     {json.dumps(r.reply)}" + (f"\nerror     {r.error}" if r.error else "")
        )

    emit(record, as_json, human)


@sessions.command()
@json_option
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """Requests waiting per queue: queued (not yet processed) and replied (not yet taken)."""
    with open_db(ctx) as db:
        rows = _sessions(db).queue_depths()
    data = [{"queue": q, "state": s, "count": n} for q, s, n in rows]
    emit(
        data,
        as_json,
        lambda d: click.echo(
            "\n".join(f"{r['queue']:30} {r['state']:8} {r['count']}" for r in d)
            or "no requests waiting"
        ),
    )


@sessions.command()
@click.option("--older-than", type=float, default=None, help="Seconds; default: the retention.")
@click.option("--idle-for", type=float, default=None, help="Seconds; default: the session TTL.")
@json_option
@click.pass_context
def gc(ctx: click.Context, older_than: float | None, idle_for: float | None, as_json: bool) -> None:
    """Delete finished requests past the retention period and expire idle sessions (with
    their requests and replies). ``homing gc`` does this and cleans the other parts too."""
    with open_db(ctx) as db:
        api = _sessions(db)
        n = api.gc(older_than=older_than)
        expired = api.expire(idle_for=idle_for)
    emit(
        {"deleted": n, "expired_sessions": expired},
        as_json,
        lambda d: click.echo(
            f"deleted {d['deleted']} finished requests, expired {d['expired_sessions']} sessions"
        ),
    )


@sessions.command()
@click.argument("client_id")
def token(client_id: str) -> None:
    """Print CLIENT_ID's bearer token for the sessions HTTP API (signed with the secret in
    HOMING_SESSIONS_SECRET, which the server must share)."""
    from homing.sessions._http import SECRET_ENV, client_token, secret_from_env
    from homing.sessions._model import check_name

    secret = secret_from_env()
    if secret is None:
        raise ConfigurationError(
            f"set {SECRET_ENV} to the secret the sessions API runs with (at least 16 bytes)"
        )
    click.echo(client_token(secret, check_name("client_id", client_id)))


@sessions.command()
@click.argument("queues")
@click.option(
    "--handler",
    "handler_path",
    required=True,
    help="module:function called as function(request, txn) -> reply body (JSON).",
)
@click.option("--max-attempts", type=int, default=5, show_default=True)
@click.option(
    "--retry-in", type=float, default=1.0, show_default=True, help="First retry delay, s."
)
@click.option(
    "--lease", type=float, default=10.0, show_default=True, help="Lease of a taken request, s."
)
@click.option(
    "--handler-timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Longest a handler keeps its lease, s.",
)
@upkeep_options("server")
@click.pass_context
def server(
    ctx: click.Context,
    queues: str,
    handler_path: str,
    max_attempts: int,
    retry_in: float,
    lease: float,
    handler_timeout: float,
    gc_every: float,
    vacuum_every: float,
) -> None:
    """Answer requests of QUEUES (comma-separated) with a Python handler until SIGTERM/Ctrl-C.

    Like a worker, the server keeps the store tidy while it runs (``--gc-every``,
    ``--vacuum-every``), so that a deployment of servers alone needs no cron entry."""
    import importlib
    import logging
    import signal
    import threading

    from homing import upkeep
    from homing.sessions.server import Server

    module_name, _, attr = handler_path.partition(":")
    try:
        handler = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise click.BadParameter(
            f"cannot load {handler_path!r} ({exc}); give module:function importable from here"
        ) from exc
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open_db(ctx) as db:
        srv = Server(
            db,
            queues.split(","),
            handler,
            max_attempts=max_attempts,
            retry_in=retry_in,
            lease=lease,
            handler_timeout=handler_timeout,
        )
        click.echo(f"serving {', '.join(srv.queues)} as {srv.name}", err=True)
        log = logging.getLogger("homing.sessions")
        with upkeep.running(db, gc_every=gc_every, vacuum_every=vacuum_every, log=log):
            try:
                n = srv.run(stop, idle_wait=0.5)
            except KeyboardInterrupt:
                n = -1
    click.echo(f"stopped; handled {n} requests" if n >= 0 else "stopped", err=True)
