"""``homing queues``: the queue graph, depths, credits and dead letters from the shell."""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import click

from homing.cli import emit, json_option, open_db
from homing.engine.core import DEAD_LETTERS, Engine
from homing.engine.model import Message, QueueInfo, SelectorInfo
from homing.errors import ConfigurationError


def _engine(ctx: click.Context) -> tuple[Any, Engine]:
    db = open_db(ctx)
    try:
        return db, Engine(db)
    except ConfigurationError:
        db.close()
        raise


def _as_json(ctx: click.Context, as_json: bool) -> bool:
    """``--json`` given to the command or to ``homing queues`` before it."""
    parent = ctx.parent
    return bool(as_json or (parent is not None and parent.params.get("as_json")))


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from exc


def _message_dict(m: Message) -> dict[str, Any]:
    body = m.body
    out: dict[str, Any] = {
        "seq": m.seq,
        "id": m.id,
        "queue": m.queue,
        "state": m.state,
        "headers": m.headers,
        "address": m.address,
        "return_address": m.return_address,
        "original_address": m.original_address,
        "reason": m.reason,
        "deaths": m.deaths,
        "attempts": m.attempts,
    }
    if isinstance(body, bytes):
        out["body_base64"] = base64.b64encode(body).decode()
    else:
        out["body"] = body
    return out


def _graph(queues: list[QueueInfo], selectors: list[SelectorInfo]) -> dict[str, Any]:
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for s in selectors:
        by_queue.setdefault(s.queue, []).append(
            {
                "name": s.name,
                "mode": s.mode,
                "role": s.role,
                "match": s.match,
                "to": f"{s.dest_kind}:{s.dest}" if s.dest else s.dest_kind,
                "credits": s.credits,
                "granted": s.granted,
                "outstanding": s.granted - s.credits,
            }
        )
    return {
        "queues": [
            {
                "name": qi.name,
                "ready": qi.ready,
                "outstanding": qi.outstanding,
                "history": qi.done,
                "discarded": qi.discarded,
                "dead_letter": qi.dead_letter,
                "max_unprocessed": qi.max_unprocessed,
                "on_overflow": qi.on_overflow,
                "max_history": qi.max_history,
                "self_destruct": qi.self_destruct,
                "max_deliveries": qi.max_deliveries,
                "message_ttl": qi.message_ttl,
                "expires": qi.expires,
                "selectors": by_queue.get(qi.name, []),
            }
            for qi in queues
        ]
    }


def _print_graph(data: dict[str, Any]) -> None:
    from homing._tables import print_table

    print_table(
        ("queue", "ready", "outstanding", "history", "discarded", "dead letters to"),
        (
            (
                qd["name"] + (" (self-destruct)" if qd["self_destruct"] else ""),
                qd["ready"],
                qd["outstanding"],
                qd["history"],
                qd["discarded"],
                qd["dead_letter"] or "-",
            )
            for qd in data["queues"]
        ),
    )
    selectors = [(qd["name"], s) for qd in data["queues"] for s in qd["selectors"]]
    if selectors:
        click.echo()
        print_table(
            ("queue", "selector", "mode", "to", "match", "credits"),
            (
                (
                    q,
                    s["name"] + ("" if s["role"] == "normal" else f" ({s['role']})"),
                    s["mode"].upper(),
                    s["to"],
                    json.dumps(s["match"]),
                    f"{s['credits']}/{s['granted']}" if s["mode"] != "copy" else "-",
                )
                for q, s in selectors
            ),
            text_columns=5,
        )


@click.group(invoke_without_command=True)
@json_option
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """The queue engine: graph, depths, credits, dead letters (seed 001)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_queues, as_json=as_json)


@queues.command("list")
@json_option
@click.pass_context
def list_queues(ctx: click.Context, as_json: bool) -> None:
    """Show every queue with its depths and selectors (credits held / granted)."""
    db, engine = _engine(ctx)
    with db:
        data = _graph(engine.queues(), engine.selectors())
    emit(data, _as_json(ctx, as_json), _print_graph)


@queues.command("create")
@click.argument("name")
@click.option("--dead-letter", default=None, help="Queue that takes this queue's exceptions.")
@click.option("--max-unprocessed", type=int, default=None, help="Limit of waiting messages.")
@click.option(
    "--on-overflow",
    type=click.Choice(["reject", "discard", "overflow", "drop-head"]),
    default="discard",
    show_default=True,
)
@click.option("--max-history", type=int, default=1000, show_default=True)
@click.option("--max-deliveries", type=int, default=None, help="Takes before dead-lettering.")
@click.option("--message-ttl", type=float, default=None, help="Seconds a message may wait.")
@click.option("--expires", type=float, default=None, help="Seconds unused before deletion.")
@click.option("--self-destruct", is_flag=True, help="Delete the queue when its last selector goes.")
@json_option
@click.pass_context
def create(
    ctx: click.Context,
    name: str,
    dead_letter: str | None,
    max_unprocessed: int | None,
    on_overflow: str,
    max_history: int,
    max_deliveries: int | None,
    message_ttl: float | None,
    expires: float | None,
    self_destruct: bool,
    as_json: bool,
) -> None:
    """Create queue NAME."""
    db, engine = _engine(ctx)
    with db:
        info = engine.create_queue(
            name,
            dead_letter=dead_letter,
            max_unprocessed=max_unprocessed,
            on_overflow=on_overflow,
            max_history=max_history,
            self_destruct=self_destruct,
            max_deliveries=max_deliveries,
            message_ttl=message_ttl,
            expires=expires,
        )
    emit(info, _as_json(ctx, as_json), lambda i: click.echo(f"created queue {i.name}"))


@queues.command("delete")
@click.argument("name")
@click.option(
    "--force", is_flag=True, help="Delete even if in use (messages are returned/bounced)."
)
@click.pass_context
def delete(ctx: click.Context, name: str, force: bool) -> None:
    """Delete queue NAME."""
    db, engine = _engine(ctx)
    with db:
        engine.delete_queue(name, force=force)
    click.echo(f"deleted queue {name}")


@queues.command("bind")
@click.argument("queue")
@click.argument("name")
@click.option("--to", "to_queue", default=None, help="Destination queue.")
@click.option("--consumer", default=None, help="Destination consumer (takes with the API).")
@click.option("--job-type", default=None, help="Destination job type (one job per message).")
@click.option(
    "--mode", type=click.Choice(["move", "copy", "bounce"]), default="move", show_default=True
)
@click.option(
    "--match", "match", default=None, help="Match rule as JSON, e.g. '{\"color\": true}'."
)
@click.option("--credits", type=int, default=1, show_default=True)
@click.option(
    "--role",
    type=click.Choice(["normal", "default", "overflow"]),
    default="normal",
    show_default=True,
)
@json_option
@click.pass_context
def bind(
    ctx: click.Context,
    queue: str,
    name: str,
    to_queue: str | None,
    consumer: str | None,
    job_type: str | None,
    mode: str,
    match: str | None,
    credits: int,
    role: str,
    as_json: bool,
) -> None:
    """Attach selector NAME to QUEUE."""
    rule = _json_arg(match, "--match")
    db, engine = _engine(ctx)
    with db:
        info = engine.bind(
            queue,
            name,
            to=to_queue,
            consumer=consumer,
            job_type=job_type,
            mode=mode,
            match=rule,
            credits=credits,
            role=role,
        )
    emit(info, _as_json(ctx, as_json), lambda i: click.echo(f"bound {i.queue}/{i.name}"))


@queues.command("unbind")
@click.argument("queue")
@click.argument("name")
@json_option
@click.pass_context
def unbind(ctx: click.Context, queue: str, name: str, as_json: bool) -> None:
    """Delete selector NAME of QUEUE; its outstanding messages return to QUEUE."""
    db, engine = _engine(ctx)
    with db:
        returned = engine.unbind(queue, name)
    emit(
        {"returned": returned},
        _as_json(ctx, as_json),
        lambda d: click.echo(f"unbound {queue}/{name}; {len(d['returned'])} messages returned"),
    )


@queues.command("publish")
@click.argument("queue")
@click.argument("body", default="null")
@click.option("--headers", default=None, help="Headers as a JSON object.")
@click.option("--return-address", default=None)
@click.option("--id", "message_id", default=None, help="Message id (UUID) for an idempotent retry.")
@click.option("--raw", is_flag=True, help="Send BODY as bytes instead of parsing it as JSON.")
@json_option
@click.pass_context
def publish(
    ctx: click.Context,
    queue: str,
    body: str,
    headers: str | None,
    return_address: str | None,
    message_id: str | None,
    raw: bool,
    as_json: bool,
) -> None:
    """Publish BODY (JSON, or bytes with --raw) to QUEUE."""
    payload: Any = body.encode() if raw else _json_arg(body, "BODY")
    head = _json_arg(headers, "--headers")
    db, engine = _engine(ctx)
    with db:
        result = engine.publish(
            queue, payload, headers=head, return_address=return_address, id=message_id
        )
    emit(result, _as_json(ctx, as_json), lambda r: click.echo(f"{r.id} seq {r.seq} {r.outcome}"))


@queues.command("dead-letters")
@click.option("--queue", "queue", default=DEAD_LETTERS, show_default=True)
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@click.pass_context
def dead_letters(ctx: click.Context, queue: str, limit: int, as_json: bool) -> None:
    """List the unprocessed messages of a dead-letter queue."""
    db, engine = _engine(ctx)
    with db:
        rows = [_message_dict(m) for m in engine.dead_letters(queue, limit=limit)]

    def human(items: list[dict[str, Any]]) -> None:
        if not items:
            click.echo(f"no dead letters in {queue}")
        for m in items:
            click.echo(f"{m['seq']} {m['id']} to {m['address']}: {m['reason']}")

    emit(rows, _as_json(ctx, as_json), human)


@queues.command("redrive")
@click.argument("seq", type=int)
@click.option(
    "--to", "to_queue", default=None, help="Publish to this queue instead of its address."
)
@json_option
@click.pass_context
def redrive(ctx: click.Context, seq: int, to_queue: str | None, as_json: bool) -> None:
    """Publish the held message SEQ (a dead letter) again."""
    db, engine = _engine(ctx)
    with db:
        result = engine.redrive(seq, to=to_queue)
    emit(
        result,
        _as_json(ctx, as_json),
        lambda r: click.echo(f"{r.id} -> {r.queue} seq {r.seq} {r.outcome}"),
    )


@queues.command("sweep")
@json_option
@click.pass_context
def sweep(ctx: click.Context, as_json: bool) -> None:
    """Apply time-triggered limits now: lapsed consumer leases, expired messages, unused
    queues (consumers' take does this too)."""
    db, engine = _engine(ctx)
    with db:
        n = engine.sweep()
    emit({"handled": n}, _as_json(ctx, as_json), lambda d: click.echo(f"handled {d['handled']}"))


@queues.command("check")
@click.pass_context
def check(ctx: click.Context) -> None:
    """Verify the credit books of every selector; exit 1 on a violation."""
    db, engine = _engine(ctx)
    with db:
        problems = engine.check()
    for p in problems:
        click.echo(p, err=True)
    if problems:
        sys.exit(1)
    click.echo("ok: credits held + outstanding = granted for every selector")
