"""``homing dashboard``: the web dashboard and /metrics of a store, on 127.0.0.1 by default.

homing --db sqlite:///homing-pipeline.db dashboard            # http://127.0.0.1:8080/
homing --db postgresql://... dashboard --host 0.0.0.0 --basic admin:secret
"""

from __future__ import annotations

import logging
import signal
import sys

import click

from homing.cli import open_db
from homing.dashboard.app import Access
from homing.dashboard.server import check_access


def parse_basic(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or len(password) < 8:
        raise click.BadParameter(
            "--basic must look like USER:PASSWORD with 8+ characters of password"
        )
    return user, password


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option(
    "--token",
    envvar="HOMING_DASHBOARD_TOKEN",
    default=None,
    help="Require this bearer token (or it as a basic-auth password). Env: HOMING_DASHBOARD_TOKEN.",
)
@click.option(
    "--basic",
    envvar="HOMING_DASHBOARD_BASIC",
    default=None,
    metavar="USER:PASSWORD",
    help="Require HTTP basic auth. Env: HOMING_DASHBOARD_BASIC.",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve on a non-loopback address without authentication (behind a proxy).",
)
@click.pass_context
def dashboard(
    ctx: click.Context,
    host: str,
    port: int,
    token: str | None,
    basic: str | None,
    read_only: bool,
    insecure_no_auth: bool,
) -> None:
    """Serve the web dashboard (jobs, actions, engine graph) and /metrics of the store."""
    import uvicorn

    from homing.dashboard.app import create_app

    if token is not None and len(token) < 16:
        raise click.BadParameter("use a token of at least 16 characters", param_hint="--token")
    access = Access(token=token, basic=parse_basic(basic), read_only=read_only)
    check_access(host, access, insecure_no_auth)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    db = open_db(ctx)
    try:
        app = create_app(db, access=access)
        click.echo(f"homing dashboard on http://{host}:{port}/ (store {ctx.obj['db']})", err=True)
        if not access.protected:
            click.echo(
                "  no authentication: anyone who reaches this address can act on jobs", err=True
            )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        db.close()
