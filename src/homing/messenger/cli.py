"""``homing messenger``: an echo server and a send tool for trying the messenger out."""

from __future__ import annotations

import signal
import threading
import time

import click

from homing.messenger.core import Messenger
from homing.messenger.model import Incoming


@click.group()
def messenger() -> None:
    """ZeroMQ messenger (seed 003): callbacks, retries, duplicate suppression."""


@messenger.command()
@click.option("--listen", "endpoint", default="tcp://127.0.0.1:15445", show_default=True)
@click.option("--name", default="echo", show_default=True, help="This messenger's name.")
@click.option("--db", "url", default=None, help="Store URL for durable mode (sqlite:///...).")
@click.option("--quiet", is_flag=True, help="Do not print each message.")
def echo(endpoint: str, name: str, url: str | None, quiet: bool) -> None:
    """Reply to every message with its own body until SIGINT/SIGTERM."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    db = None
    if url is not None:
        import homing

        connected = homing.connect(url)
        if not isinstance(connected, homing.Database):
            raise click.UsageError("the durable messenger needs one store, not a sharded one")
        db = connected

    def on_message(msg: Incoming) -> None:
        if not quiet:
            click.echo(f"{msg.sender}#{msg.message_id}: {msg.body!r}")
        msg.reply(msg.body)

    with Messenger(name, db=db) as m:
        bound = m.listen(endpoint, on_message)
        click.echo(f"echo listening on {bound} as {name!r}", err=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    if db is not None:
        db.close()


@messenger.command()
@click.argument("destination")
@click.argument("messages", nargs=-1, required=True)
@click.option("--name", default=None, help="This messenger's name (default: random).")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for replies.")
def send(destination: str, messages: tuple[str, ...], name: str | None, timeout: float) -> None:
    """Send MESSAGES to DESTINATION and print the replies (exit 1 if some never came)."""
    replies: list[str] = []
    done = threading.Event()

    def on_reply(reply: Incoming) -> None:
        replies.append(reply.body.decode("utf-8", "replace"))
        if len(replies) == len(messages):
            done.set()

    with Messenger(name) as m:
        for text in messages:
            m.send(destination, text, on_reply)
        done.wait(timeout)
        m.wait_idle(0.2)
    for reply in replies:
        click.echo(reply)
    if len(replies) < len(messages):
        click.echo(
            f"error: {len(messages) - len(replies)} of {len(messages)} replies did not arrive "
            f"within {timeout:g}s; is something listening on {destination}?",
            err=True,
        )
        raise SystemExit(1)


@messenger.command()
@click.argument("endpoint")
@click.option("--count", default=1000, show_default=True)
def ping(endpoint: str, count: int) -> None:
    """Measure round trips to an echo server: rate and p50/p99 latency."""
    latencies: list[float] = []
    with Messenger() as m:
        for _ in range(count):
            got = threading.Event()
            t0 = time.perf_counter()

            def on_reply(_reply: Incoming, got: threading.Event = got) -> None:
                got.set()

            m.send(endpoint, b"ping", on_reply)
            if not got.wait(5):
                raise click.ClickException(f"no reply from {endpoint} within 5s")
            latencies.append(time.perf_counter() - t0)
    latencies.sort()
    total = sum(latencies)
    click.echo(
        f"{count} round trips: {count / total:.0f}/s, p50 {latencies[len(latencies) // 2] * 1e6:.0f}us, "
        f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1e6:.0f}us"
    )
