"""``homing serve``: the reliable HTTP receiver, the outbox dispatcher and, when installed,
the sessions HTTP API, on one uvicorn server (a composition root: it may import faces).

    homing --db sqlite:///homing.db serve --port 8000 --node /orders=myapp.handlers:order

Each ``--node PATH=MODULE:FUNCTION`` registers ``FUNCTION(body, tx)`` as a reliable node;
``--setup MODULE:FUNCTION`` calls ``FUNCTION(receiver)`` to register nodes in code.
The dispatcher drains this store's outbox (messages stored by ``Sender(db,
dispatch=False)`` in other processes, and the job results this receiver sends back).
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from homing.cli import open_db, upkeep_options
from homing.database import Database
from homing.errors import ConfigurationError
from homing.http import Receiver


def _load(target: str, what: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(f"{what} {target!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"{what} {target!r}: cannot import {module_name}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise click.BadParameter(f"{what} {target!r}: {module_name} has no function {attr}")
    return fn


def parse_secrets(specs: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """``KEYID=SECRET`` options as (key id, secret bytes), in the order given."""
    keys: list[tuple[str, bytes]] = []
    for spec in specs:
        key_id, sep, secret = spec.partition("=")
        if not sep or not key_id or not secret or "," in key_id:
            raise click.BadParameter(f"--secret must look like KEYID=SECRET, got {spec[:20]!r}...")
        if len(secret) < 16:
            raise click.BadParameter(f"--secret {key_id}: use at least 16 characters of secret")
        keys.append((key_id, secret.encode()))
    return keys


def build_app(receiver: Receiver, db: Database, dashboard: Any = None) -> Any:
    """The receiver at ``/``, the sessions API at ``/sessions`` if that part exists, and
    the dashboard (with /dashboard/metrics) at ``/dashboard`` when ``dashboard`` is given
    (an ``Access``)."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    routes = []
    if dashboard is not None:
        from homing.dashboard import create_app as dashboard_app

        routes.append(Mount("/dashboard", app=dashboard_app(db, access=dashboard)))
    try:
        sessions = importlib.import_module("homing.sessions.asgi")
    except ImportError:
        sessions = None
    create_app = getattr(sessions, "create_app", None)
    if create_app is not None:
        routes.append(Mount("/sessions", app=create_app(db)))
    routes.append(Mount("/", app=receiver.app))
    return Starlette(routes=routes)


def _dashboard_access(host: str, token: str | None) -> Any:
    """The dashboard's access rules for ``homing serve``, or None to leave it out."""
    if (
        importlib.util.find_spec("jinja2") is None
        or importlib.util.find_spec("prometheus_client") is None
    ):
        return None
    from homing.dashboard.app import Access
    from homing.dashboard.server import is_loopback

    if token is None and not is_loopback(host):
        return None
    return Access(token=token)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="PATH=MODULE:FUNCTION",
    help="Register FUNCTION(body, tx) as the reliable node at PATH (repeatable).",
)
@click.option(
    "--setup",
    "setups",
    multiple=True,
    metavar="MODULE:FUNCTION",
    help="Call FUNCTION(receiver) to register nodes in code (repeatable).",
)
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    help="A private host that response/confirmation URLs may name (repeatable).",
)
@click.option("--max-body", type=int, default=1024 * 1024, show_default=True, help="Bytes.")
@click.option(
    "--retention",
    type=float,
    default=7 * 24 * 3600.0,
    show_default=True,
    help="Seconds message ids are remembered (published to senders).",
)
@click.option("--no-dispatch", is_flag=True, help="Do not drain the outbox in this process.")
@click.option(
    "--batch",
    type=click.IntRange(0, 256),
    default=0,
    show_default=True,
    help="Send Option 2 messages to homing receivers up to this many a request (0: one a "
    "request); see docs/http.md, Batches.",
)
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    envvar="HOMING_HTTP_SECRET",
    metavar="KEYID=SECRET",
    help="Require Homing-Signature with this shared secret on every request, and sign what "
    "this process sends. Repeat to rotate keys: all verify, the first signs. "
    "Env (space-separated): HOMING_HTTP_SECRET.",
)
@click.option(
    "--webhook-secret",
    "webhook_secrets",
    multiple=True,
    envvar="HOMING_WEBHOOK_SECRET",
    metavar="whsec_...",
    help="Accept Standard Webhooks signed with this secret (repeat while rotating).",
)
@click.option(
    "--dashboard-token",
    envvar="HOMING_DASHBOARD_TOKEN",
    default=None,
    help="Mount the dashboard at /dashboard behind this bearer token (needed when --host is "
    "not loopback; on loopback it is mounted without one when homing[dashboard] is installed).",
)
@upkeep_options("server")
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    nodes: tuple[str, ...],
    setups: tuple[str, ...],
    allowed_hosts: tuple[str, ...],
    max_body: int,
    retention: float,
    no_dispatch: bool,
    batch: int,
    secrets: tuple[str, ...],
    webhook_secrets: tuple[str, ...],
    dashboard_token: str | None,
    gc_every: float,
    vacuum_every: float,
) -> None:
    """Serve reliable HTTP nodes and drain the outbox (seed 000).

    Like a worker, the server keeps the store tidy while it runs (``--gc-every``,
    ``--vacuum-every``: ``homing gc``, which keeps what every receiver promised its
    senders, and a VACUUM on PostgreSQL without autovacuum)."""
    import logging

    import uvicorn

    from homing import upkeep

    db = open_db(ctx)
    if not isinstance(db, Database):
        db.close()
        raise ConfigurationError("homing serve works on one store, not a sharded list of URLs")
    receiver: Receiver | None = None
    try:
        keys = parse_secrets(secrets)
        receiver = Receiver(
            db,
            allowed_hosts=allowed_hosts,
            max_body=max_body,
            retention=retention,
            dispatch=not no_dispatch,
            secrets=dict(keys) if keys else None,
            webhook_secrets=list(webhook_secrets) or None,
            dispatcher_options={"batch": batch, **({"signing": {"*": keys[0]}} if keys else {})},
        )
        for spec in nodes:
            path, sep, target = spec.partition("=")
            if not sep:
                raise click.BadParameter(f"--node {spec!r} must look like /path=module:function")
            receiver.add_node(path, _load(target, "--node"))
        for target in setups:
            _load(target, "--setup")(receiver)
        app = build_app(receiver, db, _dashboard_access(host, dashboard_token))
        receiver.start()
        click.echo(
            f"homing serve on http://{host}:{port} nodes: {', '.join(receiver.nodes) or '-'}",
            err=True,
        )
        # uvicorn shuts down gracefully on SIGTERM and then re-raises it: make that an exit
        # through ``finally`` (stop the worker and dispatcher, close the store), status 0.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        log = logging.getLogger("homing.http")
        with upkeep.running(db, gc_every=gc_every, vacuum_every=vacuum_every, log=log):
            uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if receiver is not None:
            receiver.stop()
        db.close()
