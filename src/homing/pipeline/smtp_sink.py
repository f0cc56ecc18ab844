"""A small SMTP server for the pipeline's local email sink (RFC 5321's minimum).

The pipeline's SMTP receiver stands in for a remote mail server, yet it runs on the same
cores as the delivery workers it measures. aiosmtpd spent 690-738 us of CPU a message
there, this protocol 218-245 us (``python -m bench.smtp_sink``, bench/results/
smtp-sink.txt); in one py-spy profile (not kept) about a third of aiosmtpd's went to
parsing addresses with the ``email`` package's RFC 5322 parser and most of the rest to
its per-command stream machinery. This protocol answers the same
conversation (greeting, EHLO/HELO, MAIL, RCPT, DATA with dot-unstuffing, RSET, NOOP,
QUIT, ``PIPELINING``) with one ``write`` per batch of replies. What a message means is
the ``Handler``'s business (``homing.pipeline.sinks.SmtpHandler``).

Bounds: a command line longer than 2,000 bytes gets an error and a closed connection; a
message over ``max_message`` bytes gets 552 and the session goes on (what is over is not
kept); more than 50 errors in one session (counted within one read too) get their replies
and a closed connection. Nothing a client sends grows without a bound.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

MAX_LINE = 2000  # RFC 5321 4.5.3.1: 512 for a command line; leave room
MAX_ERRORS = 50


class Handler(Protocol):
    def rcpt(self, address: str) -> str:
        """The reply to ``RCPT TO:<address>`` (``250 ...`` accepts it)."""

    def data(self, content: bytes) -> str:
        """The reply to a message's content (dot-unstuffed, ending in CRLF)."""


def _address(arg: str, keyword: str) -> str | None:
    """``FROM:<a@b> SIZE=10`` -> ``a@b`` (``""`` for the null sender); None if malformed."""
    head, sep, rest = arg.partition(":")
    if not sep or head.strip().upper() != keyword:
        return None
    rest = rest.strip()
    if not rest.startswith("<") or ">" not in rest:
        return None
    return rest[1 : rest.index(">")].strip()


class SmtpSession(asyncio.Protocol):
    """One client connection: a command state machine over CRLF lines."""

    def __init__(self, handler: Handler, hostname: str, max_message: int) -> None:
        self.handler = handler
        self.hostname = hostname
        self.max_message = max_message
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.in_data = False
        self.message = bytearray()
        self.too_big = False
        self.sender: str | None = None
        self.recipients: list[str] = []
        self.errors = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(f"220 {self.hostname} homing sink ESMTP\r\n".encode())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        replies: list[str] = []
        while (
            self.transport is not None
            and not self.transport.is_closing()
            and self.errors <= MAX_ERRORS  # past it: the replies so far, then close
        ):
            end = self.buffer.find(b"\n")
            if end < 0:
                if len(self.buffer) > (self.max_message if self.in_data else MAX_LINE):
                    replies.append("500 5.5.2 line too long, closing")
                    self.errors = MAX_ERRORS + 1  # closed once the replies are out
                break
            line = bytes(self.buffer[: end + 1])
            del self.buffer[: end + 1]
            reply = self._data_line(line) if self.in_data else self._command(line)
            if reply:
                replies.append(reply)
        self._flush(replies)

    def _flush(self, replies: list[str]) -> None:
        if replies and self.transport is not None and not self.transport.is_closing():
            self.transport.write(("\r\n".join(replies) + "\r\n").encode())
            if replies[-1].startswith("221") or self.errors > MAX_ERRORS:
                self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _data_line(self, line: bytes) -> str | None:
        if line in (b".\r\n", b".\n"):
            self.in_data = False
            content, too_big = bytes(self.message), self.too_big
            self._reset()
            if too_big:
                return "552 5.3.4 message too big"
            return self.handler.data(content)
        if line.startswith(b"."):
            line = line[1:]  # dot-unstuffing (RFC 5321 4.5.2)
        if len(self.message) + len(line) > self.max_message:
            self.too_big = True
        elif not self.too_big:
            self.message += line
        return None

    def _reset(self) -> None:
        self.sender, self.recipients = None, []
        self.message, self.too_big = bytearray(), False

    def _command(self, raw: bytes) -> str:
        if len(raw) > MAX_LINE:
            return self._error("500 5.5.2 line too long")
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        verb, _, arg = text.partition(" ")
        verb = verb.upper()
        if verb == "EHLO":
            self._reset()
            return (
                f"250-{self.hostname}\r\n250-SIZE {self.max_message}\r\n"
                "250-8BITMIME\r\n250 PIPELINING"
            )
        if verb == "HELO":
            self._reset()
            return f"250 {self.hostname}"
        if verb == "MAIL":
            address = _address(arg, "FROM")
            if address is None:
                return self._error("501 5.5.4 syntax: MAIL FROM:<address>")
            self._reset()
            self.sender = address
            return "250 OK"
        if verb == "RCPT":
            if self.sender is None:
                return self._error("503 5.5.1 need MAIL first")
            address = _address(arg, "TO")
            if not address:
                return self._error("501 5.5.4 syntax: RCPT TO:<address>")
            reply = self.handler.rcpt(address)
            if reply.startswith("250"):
                self.recipients.append(address)
            return reply
        if verb == "DATA":
            if not self.recipients:
                return self._error("503 5.5.1 need RCPT first")
            self.in_data = True
            return "354 end data with <CR><LF>.<CR><LF>"
        if verb == "RSET":
            self._reset()
            return "250 OK"
        if verb == "NOOP":
            return "250 OK"
        if verb == "QUIT":
            return "221 bye"
        return self._error("500 5.5.1 command not recognized")

    def _error(self, reply: str) -> str:
        self.errors += 1
        return reply


async def serve(
    handler: Handler, host: str, port: int, *, max_message: int = 1 << 20
) -> asyncio.Server:
    """Listen on ``host:port``; each connection gets its own :class:`SmtpSession`."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: SmtpSession(handler, host, max_message), host, port, reuse_address=True
    )
