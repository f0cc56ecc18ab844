"""Local receivers for the pipeline's deliveries: an SMTP server and a webhook receiver.

Run as a process: ``python -m homing.pipeline.sinks --log FILE --smtp-port P --http-port Q``.
Each receiver keeps a durable inbox of the message ids it accepted (the receipt log, one
JSON line per receipt, reloaded on start) and drops repeats: a repeat is acknowledged
again, logged as a suppressed duplicate, and has no effect. To exercise the retry policy
they answer some first attempts with a temporary error (SMTP 451, HTTP 503), and the SMTP
server refuses mailboxes named ``bounce-*`` with 550 (a permanent failure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import zlib
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any


class Inbox:
    """The receivers' shared record: accepted ids, repeats, temporary refusals."""

    def __init__(self, log: Path, temp_pct: int) -> None:
        self.path = log
        self.temp_pct = temp_pct
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.refused: set[str] = set()
        if log.exists():
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                if rec["kind"] == "new":
                    self.seen.add(rec["id"])
                elif rec["kind"] == "temp":
                    self.refused.add(rec["id"])
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

    def accept(self, msg_id: str, channel: str) -> bool:
        """Record a delivery; False if it is a repeat (suppressed)."""
        with self.lock:
            if msg_id in self.seen:
                self._log("dup", msg_id, channel)
                return False
            self.seen.add(msg_id)
            self._log("new", msg_id, channel)
            return True


class SmtpHandler:
    """aiosmtpd handler: 550 for bounce-* mailboxes, 451 for some first attempts."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        if address.startswith("bounce-"):
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        headers = BytesHeaderParser().parsebytes(envelope.content)
        msg_id = headers.get("X-Homing-Id")
        if not msg_id:
            return "554 5.6.0 no X-Homing-Id header"
        if self.inbox.flaky(msg_id, "email"):
            return "451 4.3.0 try again later"
        self.inbox.accept(msg_id, "email")
        return "250 OK queued"


def http_app(inbox: Inbox) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def hook(request: Request) -> Response:
        channel = request.path_params["channel"]
        msg_id = request.headers.get("idempotency-key")
        if not msg_id:
            return Response("missing Idempotency-Key header", status_code=400)
        await request.body()
        if inbox.flaky(msg_id, channel):
            return Response(status_code=503, headers={"Retry-After": "1"})
        inbox.accept(msg_id, channel)
        return Response(status_code=204)

    return Starlette(routes=[Route("/hook/{channel}", hook, methods=["POST"])])


def serve(log: Path, smtp_port: int, http_port: int, temp_pct: int) -> None:
    import uvicorn
    from aiosmtpd.controller import Controller

    inbox = Inbox(log, temp_pct)
    smtp = Controller(SmtpHandler(inbox), hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    config = uvicorn.Config(
        http_app(inbox), host="127.0.0.1", port=http_port, log_level="warning", access_log=False
    )
    try:
        asyncio.run(uvicorn.Server(config).serve())
    finally:
        smtp.stop()
        inbox.file.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--smtp-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--temp-pct", type=int, default=3)
    a = parser.parse_args()
    serve(a.log, a.smtp_port, a.http_port, a.temp_pct)


if __name__ == "__main__":
    main()
