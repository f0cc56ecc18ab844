"""The pipeline's SMTP sink: the conversation smtplib (the delivery workers' client) has
with it, its refusals, its once-only record, and what it does with bad input."""

from __future__ import annotations

import asyncio
import json
import smtplib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from homing.pipeline.deliver import Channels
from homing.pipeline.sinks import Inbox, SmtpHandler
from homing.pipeline.smtp_sink import MAX_LINE, serve

SENDER = "notifications@homing.invalid"


class RecordingHandler(SmtpHandler):
    """The sink's handler, keeping each message's content as the server handed it over."""

    def __init__(self, inbox: Inbox) -> None:
        super().__init__(inbox)
        self.contents: list[bytes] = []

    def data(self, content: bytes) -> str:
        self.contents.append(content)
        return super().data(content)


class Sink:
    def __init__(self, log: Path, temp_pct: int, max_message: int) -> None:
        self.inbox = Inbox(log, temp_pct)
        self.handler = RecordingHandler(self.inbox)
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            serve(self.handler, "127.0.0.1", 0, max_message=max_message)
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        # on the loop's own thread: asyncio's Server is not thread-safe (closed from here
        # while the loop detached a closing connection, it woke its waiters twice)
        def stop() -> None:
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self.thread.join(5)
        self.inbox.file.close()

    def records(self) -> list[dict[str, str]]:
        return [json.loads(line) for line in self.inbox.path.read_text().splitlines()]


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Sink]:
    s = Sink(tmp_path / "receipts.jsonl", temp_pct=0, max_message=4096)
    yield s
    s.close()


def message(msg_id: str, body: str = "hello") -> bytes:
    return (
        f"From: {SENDER}\r\nTo: a@example.com\r\nX-Homing-Id: {msg_id}\r\n\r\n{body}\r\n"
    ).encode()


def test_a_message_is_accepted_once_and_a_repeat_is_suppressed(sink: Sink) -> None:
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
        assert smtp.ehlo()[0] == 250 and smtp.has_extn("pipelining")
        assert smtp.sendmail(SENDER, ["a@example.com"], message("m1")) == {}
        assert smtp.sendmail(SENDER, ["a@example.com"], message("m1")) == {}  # a retry
        assert smtp.sendmail(SENDER, ["a@example.com"], message("m2")) == {}
        assert smtp.noop()[0] == 250
    kinds = [(r["kind"], r["id"]) for r in sink.records()]
    assert kinds == [("new", "m1"), ("dup", "m1"), ("new", "m2")]


def test_bounce_mailboxes_get_550_which_the_worker_treats_as_permanent(sink: Sink) -> None:
    from homing.errors import PermanentFailure

    channels = Channels(sink.port)
    with pytest.raises(PermanentFailure, match="550"):
        channels.send_email(
            "j1", {"email": "bounce-1@example.com", "event_id": 1, "subscriber_id": 1}
        )
    # the session stays usable: the next message goes through on the same connection
    channels.send_email("j2", {"email": "ok@example.com", "event_id": 2, "subscriber_id": 2})
    assert [r["id"] for r in sink.records() if r["kind"] == "new"] == ["j2"]


def test_a_first_attempt_refused_with_451_is_retried_and_counted_once(tmp_path: Path) -> None:
    sink = Sink(tmp_path / "r.jsonl", temp_pct=100, max_message=4096)  # every first attempt
    try:
        channels = Channels(sink.port)
        args = {"email": "a@example.com", "event_id": 1, "subscriber_id": 1}
        with pytest.raises(RuntimeError, match="451"):
            channels.send_email("j1", args)
        channels.send_email("j1", args)  # the retry, on the same connection
        assert [r["kind"] for r in sink.records()] == ["temp", "new"]
    finally:
        sink.close()


def test_dot_stuffed_lines_are_restored(sink: Sink) -> None:
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
        smtp.sendmail(SENDER, ["a@example.com"], message("m1", body=".leading dot\r\n.."))
    # smtplib doubled the leading dots (RFC 5321 4.5.2); the sink takes them off again
    assert sink.handler.contents[0].endswith(b"\r\n\r\n.leading dot\r\n..\r\n")


def raw_session(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_pipelined_commands_get_their_replies_in_order(sink: Sink) -> None:
    out = raw_session(
        sink.port,
        b"EHLO x\r\nMAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nRCPT TO:<bounce-x@d>\r\nDATA\r\n"
        + message("p1")
        + b".\r\nQUIT\r\n",
    )
    codes = [line[:3] for line in out.decode().split("\r\n") if line and line[3:4] != "-"]
    assert codes == ["220", "250", "250", "250", "550", "354", "250", "221"]


def test_garbage_and_out_of_order_commands_get_errors_and_no_effect(sink: Sink) -> None:
    out = raw_session(
        sink.port,
        b"\x00\xff\xfe garbage\r\nDATA\r\nRCPT TO:<a@b>\r\nMAIL FROM:nobrackets\r\n"
        b"MAIL FROM:<a@b>\r\nDATA\r\nQUIT\r\n",
    )
    codes = [line[:3] for line in out.decode().split("\r\n") if line]
    assert codes == ["220", "500", "503", "503", "501", "250", "503", "221"]
    assert not sink.inbox.path.exists() or sink.records() == []


def test_an_oversized_message_is_refused_and_the_session_goes_on(sink: Sink) -> None:
    big = message("big", body="x" * 70 + ("\r\n" + "x" * 70) * 100)  # > 4096 bytes
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
        with pytest.raises(smtplib.SMTPDataError) as err:
            smtp.sendmail(SENDER, ["a@example.com"], big)
        assert err.value.smtp_code == 552
        assert smtp.sendmail(SENDER, ["a@example.com"], message("small")) == {}
    assert [r["id"] for r in sink.records()] == ["small"]


def test_an_endless_line_closes_the_connection(sink: Sink) -> None:
    out = raw_session(sink.port, b"EHLO " + b"x" * (MAX_LINE * 3))
    assert out.decode().split("\r\n")[1].startswith("500")


def test_a_session_of_errors_is_closed_after_fifty(sink: Sink) -> None:
    from homing.pipeline.smtp_sink import MAX_ERRORS

    out = raw_session(sink.port, b"BOGUS\r\n" * (MAX_ERRORS * 3))
    replies = [line for line in out.decode().split("\r\n") if line]
    assert replies[0].startswith("220")
    errors = replies[1:]
    # one reply per error up to the one past the bound, then the connection closes (the
    # commands were all in one read: the bound holds within a read, not only between them)
    assert len(errors) == MAX_ERRORS + 1, len(errors)
    assert all(r.startswith("500") for r in errors)
