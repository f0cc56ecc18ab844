"""Local receivers for the pipeline's deliveries: an SMTP server and a webhook receiver.

Each runs as its own process (a service of its own, with its own GIL):
``python -m homing.pipeline.sinks smtp --log FILE --port P`` and
``python -m homing.pipeline.sinks hooks --log FILE --hooks-db URL --port Q``.

- SMTP (``homing.pipeline.smtp_sink``, a small asyncio server): keeps a durable record of the message ids it accepted (the receipt log,
  one JSON line per receipt, reloaded on start) and drops repeats by ``X-Homing-Id``: a
  repeat is acknowledged again, logged as a suppressed duplicate, and has no effect. It
  refuses mailboxes named ``bounce-*`` with 550 (a permanent failure) and answers some
  first attempts with 451 (temporary).
- Webhooks: a ``homing.http.Receiver`` on its own store, behind a lossy network that
  refuses some first attempts (503) and loses some answers (502 after the receiver handled
  the message), so the reliable sender's retries and the receiver's inbox are exercised.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from homing._loops import loop_factory
from homing.pipeline.data import HOOK_CHANNELS, HOOK_RECEIVED


class Inbox:
    """The receivers' shared record: accepted ids, repeats, temporary refusals."""

    def __init__(self, log: Path, temp_pct: int) -> None:
        self.path = log
        self.temp_pct = temp_pct
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.refused: set[str] = set()
        self.lost: set[str] = set()
        if log.exists():
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                if rec["kind"] == "new":
                    self.seen.add(rec["id"])
                elif rec["kind"] == "temp":
                    self.refused.add(rec["id"])
                elif rec["kind"] == "ack_lost":
                    self.lost.add(rec["id"])
        self.file = log.open("a", buffering=1)

    def _log(self, kind: str, msg_id: str, channel: str) -> None:
        self.file.write(
            json.dumps({"kind": kind, "id": msg_id, "ch": channel, "t": time.time()}) + "\n"
        )

    def flaky(self, msg_id: str, channel: str) -> bool:
        """True (and recorded) if this first attempt gets a temporary error."""
        with self.lock:
            if msg_id in self.refused or msg_id in self.seen:
                return False
            if zlib.crc32(msg_id.encode()) % 100 >= self.temp_pct:
                return False
            self.refused.add(msg_id)
            self._log("temp", msg_id, channel)
            return True

    def lose_ack(self, msg_id: str, channel: str) -> bool:
        """True (and recorded) if the answer to this first attempt is to be lost."""
        with self.lock:
            if msg_id in self.lost:
                return False
            band = zlib.crc32(msg_id.encode()) % 100
            if not self.temp_pct <= band < 2 * self.temp_pct:
                return False
            self.lost.add(msg_id)
            self._log("ack_lost", msg_id, channel)
            return True

    def accept(self, msg_id: str, channel: str) -> bool:
        """Record a delivery; False if it is a repeat (suppressed)."""
        with self.lock:
            if msg_id in self.seen:
                self._log("dup", msg_id, channel)
                return False
            self.seen.add(msg_id)
            self._log("new", msg_id, channel)
            return True


def homing_id(content: bytes) -> str | None:
    """The ``X-Homing-Id`` header of a message (a scan of the header block: the email
    package's parser cost a third of this server's CPU)."""
    head = content.split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    for line in head.splitlines():
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"x-homing-id":
            return value.strip().decode("ascii", errors="replace") or None
    return None


class SmtpHandler:
    """What the SMTP sink answers: 550 for bounce-* mailboxes, 451 for some first
    attempts, and each message's id recorded once (``homing.pipeline.smtp_sink``)."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def rcpt(self, address: str) -> str:
        if address.startswith("bounce-"):
            return "550 5.1.1 mailbox unavailable"
        return "250 OK"

    def data(self, content: bytes) -> str:
        msg_id = homing_id(content)
        if not msg_id:
            return "554 5.6.0 no X-Homing-Id header"
        if self.inbox.flaky(msg_id, "email"):
            return "451 4.3.0 try again later"
        self.inbox.accept(msg_id, "email")
        return "250 OK queued"


def hook_receiver(db_url: str) -> Any:
    """The webhook receiver: a ``homing.http.Receiver`` on its own store (the receiving
    service's). Each message's effect is one ``WebhookReceived`` job inserted in the inbox
    transaction, so the receiver's inbox is what keeps it to once; repeats are counted in
    ``receiver.stats["duplicates"]``. The effect table deliberately has no unique key: a
    repeat that got through would show up as a second row and fail the run's check."""
    from homing.database import Database, Transaction, connect
    from homing.http import Receiver

    db = connect(db_url)
    if not isinstance(db, Database):
        raise SystemExit("the webhook receiver needs one store, not a sharded one")
    # The handler is one insert, but its wall time under the run's CPU contention passed
    # the 1 ms default, which sent the node to the background: a second commit for every
    # message (bench/pipeline_commits.py: 8,165 -> 3,489 receiver commits a run).
    receiver = Receiver(db, workers=4, dispatch=False, handle_at_receipt_below=0.01)

    def record(body: Any, tx: Transaction) -> None:
        tx.insert(
            HOOK_RECEIVED,
            {
                "run": body["run"],
                "notification_id": body["notification_id"],
                "channel": body["channel"],
            },
        )

    for channel in HOOK_CHANNELS:
        receiver.add_node(f"/hook/{channel}", record)
    return receiver


class LossyNetwork:
    """ASGI middleware playing an unreliable network in front of the webhook receiver.

    Some first attempts (by ``Homing-Message-Id``) are refused with 503 before the receiver
    sees them; for some others the receiver stores and handles the message but its answer
    is lost (the sender gets a 502), so the sender must retry and the receiver's inbox must
    drop the repeat. Both are recorded in the receipt log as ``temp`` and ``ack_lost``.
    """

    def __init__(self, app: Any, inbox: Inbox, on_shutdown: Any = None) -> None:
        self.app = app
        self.inbox = inbox
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and self.on_shutdown is not None:

            async def send_lifespan(message: Any) -> None:
                if message["type"] == "lifespan.shutdown.complete":
                    self.on_shutdown()  # uvicorn re-raises SIGTERM after this: no finally
                await send(message)

            await self.app(scope, receive, send_lifespan)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path", "").endswith(_batch_path()):
            await self._batch(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        msg_id = headers.get(b"homing-message-id", b"").decode("latin-1")
        channel = scope.get("path", "").rsplit("/", 1)[-1]
        if msg_id and self.inbox.flaky(msg_id, channel):
            await _answer(send, 503, b"try again later", [(b"retry-after", b"1")])
            return
        if msg_id and self.inbox.lose_ack(msg_id, channel):
            answered: list[int] = []

            async def swallow(message: Any) -> None:
                if message["type"] == "http.response.start":
                    answered.append(int(message["status"]))

            await self.app(scope, receive, swallow)
            await _answer(send, 502, f"upstream answered {answered}, lost".encode(), [])
            return
        await self.app(scope, receive, send)

    async def _batch(self, scope: Any, receive: Any, send: Any) -> None:
        """A batch of messages (``homing.http.batch_wire``): the same faults, message by
        message: a refused first attempt is answered 503 in the batch's results without
        reaching the receiver, and a lost answer is a 502 in place of the receiver's."""
        from homing.errors import InvalidArgument
        from homing.http import batch_wire

        data = await _request_body(receive)
        try:
            messages = batch_wire.decode_batch(
                data, max_messages=batch_wire.MAX_BATCH_MESSAGES, max_body=len(data)
            )
        except InvalidArgument:  # the receiver says what is wrong with it
            await self.app(_with_length(scope, len(data)), _once(data), send)
            return
        results: list[dict[str, Any]] = [{} for _ in messages]
        passed: list[tuple[int, batch_wire.BatchMessage, bool]] = []
        for i, m in enumerate(messages):
            msg_id = m.headers.get("homing-message-id", "")
            channel = m.target.rsplit("/", 1)[-1]
            if msg_id and self.inbox.flaky(msg_id, channel):
                results[i] = {"status": 503, "detail": "try again later"}
                continue
            passed.append((i, m, bool(msg_id) and self.inbox.lose_ack(msg_id, channel)))
        if passed:
            body = batch_wire.encode_batch([m for _, m, _ in passed])
            status, answer = await _call(self.app, _with_length(scope, len(body)), body)
            inner = json.loads(answer)["results"] if status == 200 else None
            for n, (i, _, lost) in enumerate(passed):
                if inner is None:
                    results[i] = {"status": status, "detail": "the batch was refused"}
                else:
                    results[i] = {"status": 502, "detail": "answer lost"} if lost else inner[n]
        headers = [(b"content-type", b"application/json")]
        await _answer(send, 200, batch_wire.encode_results(results), headers)


def _batch_path() -> str:
    from homing.http import batch_wire, wire  # (homing.http loads with the receiver only)

    return wire.INTERNAL + batch_wire.BATCH_PATH


async def _request_body(receive: Any) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _once(body: bytes) -> Any:
    sent = [False]

    async def receive() -> Any:
        if sent[0]:
            return {"type": "http.disconnect"}
        sent[0] = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _with_length(scope: Any, length: int) -> Any:
    headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


async def _call(app: Any, scope: Any, body: bytes) -> tuple[int, bytes]:
    """Run ``app`` on a request of ``body``; its status and body."""
    status = [500]
    out: list[bytes] = []

    async def capture(message: Any) -> None:
        if message["type"] == "http.response.start":
            status[0] = int(message["status"])
        elif message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    await app(scope, _once(body), capture)
    return status[0], b"".join(out)


async def _answer(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": headers
            if any(k == b"content-type" for k, _ in headers)
            else [(b"content-type", b"text/plain"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve_smtp(log: Path, port: int, temp_pct: int) -> None:
    """The SMTP server until SIGTERM (its own process: its own GIL)."""
    import asyncio
    import signal

    from homing.pipeline.smtp_sink import serve

    inbox = Inbox(log, temp_pct)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = await serve(SmtpHandler(inbox), "127.0.0.1", port)
        async with server:
            await stop.wait()

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(main())
    finally:
        inbox.file.close()


def serve_hooks(log: Path, hooks_db: str, port: int, temp_pct: int) -> None:
    """The webhook receiver behind the lossy network, served by uvicorn until SIGTERM."""
    import uvicorn

    network = Inbox(log, temp_pct)
    receiver = hook_receiver(hooks_db)

    def write_stats() -> None:
        log.with_name("webhook-receiver-stats.json").write_text(json.dumps(receiver.stats))

    config = uvicorn.Config(
        LossyNetwork(receiver.app, network, on_shutdown=write_stats),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
    )
    try:  # Server.run, not asyncio.run(serve()): its loop factory picks uvloop when installed
        uvicorn.Server(config).run()
    finally:
        network.file.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("service", choices=("smtp", "hooks"), help="which receiver to run")
    parser.add_argument("--log", type=Path, required=True, help="its receipt log (JSON lines)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hooks-db", help="store URL of the webhook receiver (hooks only)")
    parser.add_argument("--temp-pct", type=int, default=3)
    a = parser.parse_args()
    if a.service == "smtp":
        serve_smtp(a.log, a.port, a.temp_pct)
    elif not a.hooks_db:
        parser.error("hooks needs --hooks-db")
    else:
        serve_hooks(a.log, a.hooks_db, a.port, a.temp_pct)


if __name__ == "__main__":
    main()
