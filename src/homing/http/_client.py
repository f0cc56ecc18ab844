"""The dispatcher's HTTP/1.1 client: keep-alive connections, a C parser, nothing else.

Profiles of the pipeline's delivery stage showed httpx (its models, httpcore's connection
pool scan, anyio) at ~77% of a dispatcher's CPU. Delivering an outbox row needs far less:
one request with a byte body and a few headers, the status, the headers and the body of
the answer. This client does that on asyncio's protocol layer with ``httptools`` (llhttp,
already in the ``http`` extra for uvicorn) parsing the answers:

- keep-alive connections per origin, at most ``max_connections`` open (and as many
  requests in flight); an idle connection is dropped after ``KEEPALIVE_S`` (below the
  5 s after which uvicorn closes it) or when another origin needs its place;
- TLS with certificate and host name verification (certifi's CA bundle when installed,
  as httpx uses it; else the system's);
- ``timeout``: connecting, waiting for a free connection, and the longest silence while a
  request is written and its answer read (httpx's connect, pool, write and read timeouts);
- redirects are never followed (a 3xx is an answer like any other), as before;
- ``connect_to``: an async hook (host, port) -> address called before every new
  connection; the guarded client's hook (``_netguard.pinning``) checks the address and
  pins it (DNS rebinding), and may raise ``RefusedAddress``.

Errors are ``HttpError`` subclasses; the dispatcher retries them (except ``RefusedAddress``).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

from homing import __version__

KEEPALIVE_S = 4.0
USER_AGENT = f"homing/{__version__}"

ConnectTo = Callable[[str, int], Awaitable[str]]


class HttpError(Exception):
    """The request got no complete answer (connection, protocol or timeout problem)."""


class ConnectError(HttpError):
    """No connection could be made."""


class RequestTimeout(HttpError):
    """Nothing happened for ``timeout`` seconds."""


class RemoteProtocolError(HttpError):
    """The server closed the connection or answered something that is not HTTP/1.1."""


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    host_header: str
    path: str  # path and query: the request target

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ConnectError(f"unsupported URL scheme in {url[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise ConnectError("credentials in the URL are not sent; use an Authorization header")
    host = parts.hostname or ""
    if not host:
        raise ConnectError(f"no host in URL {url[:200]!r}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise ConnectError(f"bad port in URL {url[:200]!r}") from exc
    shown = f"[{host}]" if ":" in host else host
    default = (scheme == "https" and port == 443) or (scheme == "http" and port == 80)
    host_header = shown if default else f"{shown}:{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme, host, port, host_header, path)


def _ssl_context() -> ssl.SSLContext:
    try:
        import certifi

        ctx = ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with httpx
        ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.last_io = 0.0
        self._waiter: asyncio.Future[Response] | None = None
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._status = 0
        self._keep_alive = False
        self._received = False

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_io = time.monotonic()
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RemoteProtocolError(f"malformed HTTP answer: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        length = "content-length" in self._headers or "chunked" in self._headers.get(
            "transfer-encoding", ""
        )
        if self._headers_done and not length:  # a body delimited by the end of the stream
            self._keep_alive = False
            self._complete()
        else:
            self._fail(RemoteProtocolError("the server closed the connection without an answer"))

    # -- httptools callbacks -------------------------------------------------------------
    @property
    def silent(self) -> bool:
        """No byte of an answer came: the request may not have reached the server."""
        return not self._received

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim answer (103 ...): the real one follows
            self._headers, self._body, self._headers_done = {}, [], False
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._complete()

    # -- use -----------------------------------------------------------------------------
    def _complete(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        body = b"".join(self._body)
        coding = self._headers.get("content-encoding", "").strip().lower()
        try:
            if coding in ("gzip", "x-gzip"):
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
            elif coding == "deflate":
                body = zlib.decompress(body)
        except zlib.error as exc:
            waiter.set_exception(RemoteProtocolError(f"undecodable {coding} body: {exc}"))
            return
        waiter.set_result(Response(self._status, self._headers, body))

    def _fail(self, exc: HttpError) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed and self.transport is not None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def request(self, data: bytes, timeout: float) -> Response:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._reset()
        waiter = self._waiter = loop.create_future()
        self.last_io = time.monotonic()

        timers: list[asyncio.TimerHandle] = []

        def check() -> None:  # the longest silence while writing and reading is `timeout`
            if waiter.done():
                return
            quiet = time.monotonic() - self.last_io
            if quiet >= timeout:
                waiter.set_exception(RequestTimeout(f"no answer within {timeout:g} s"))
                self.close()
            else:
                timers.append(loop.call_later(timeout - quiet, check))

        timers.append(loop.call_later(timeout, check))
        try:
            self.transport.write(data)
            return await waiter
        finally:
            timers[-1].cancel()
            self._waiter = None


class Client:
    """Requests over pooled keep-alive connections (see the module docstring)."""

    def __init__(
        self,
        *,
        max_connections: int,
        timeout: float,
        connect_to: ConnectTo | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.timeout = timeout
        self.connect_to = connect_to
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._closed = False

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    async def request(
        self,
        method: str,
        url: str,
        *,
        content: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if self._closed:
            raise HttpError("the client is closed")
        target = _target(url)
        data = _request_bytes(method, target, headers or {}, content)
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise RequestTimeout(f"no free connection within {self.timeout:g} s") from None
        else:
            await self._slots.acquire()
        try:
            conn, reused = await self._checkout(target)
            try:
                response = await conn.request(data, self.timeout)
            except RemoteProtocolError:
                self._drop(conn)
                if not (reused and conn.silent):
                    raise
                # the server closed a kept-alive connection as we reused it (its close
                # had not reached us yet): once more on a new connection
                conn = await self._connect(target)
                try:
                    response = await conn.request(data, self.timeout)
                except BaseException:
                    self._drop(conn)
                    raise
            except BaseException:
                self._drop(conn)
                raise
            if conn.reusable:
                conn.idle_since = time.monotonic()
                self._idle.setdefault(conn.origin, []).append(conn)
            else:
                self._drop(conn)
            return response
        finally:
            self._slots.release()

    async def delete(self, url: str, *, headers: Mapping[str, str] | None = None) -> Response:
        return await self.request("DELETE", url, headers=headers)

    async def get(self, url: str, *, headers: Mapping[str, str] | None = None) -> Response:
        return await self.request("GET", url, headers=headers)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def _checkout(self, target: _Target) -> tuple[_Connection, bool]:
        """A connection to the target's origin, and whether it was used before."""
        idle = self._idle.get(target.origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable and now - conn.idle_since < KEEPALIVE_S:
                return conn, True
            self._drop(conn)
        if len(self._open) >= self.max_connections:
            self._evict_one()
        return await self._connect(target), False

    def _evict_one(self) -> None:
        """Close the longest idle connection (of any origin) to make room for a new one."""
        oldest: tuple[float, tuple[str, str, int]] | None = None
        for origin, conns in self._idle.items():
            if conns and (oldest is None or conns[0].idle_since < oldest[0]):
                oldest = (conns[0].idle_since, origin)
        if oldest is not None:
            conns = self._idle[oldest[1]]
            self._drop(conns.pop(0))
            if not conns:
                del self._idle[oldest[1]]

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: Any = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = _ssl_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(self.timeout):
                address = target.host
                if self.connect_to is not None:
                    address = await self.connect_to(target.host, target.port)
                transport, conn = await loop.create_connection(
                    lambda: _Connection(target.origin),
                    address,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls is not None else None,
                )
        except HttpError:
            raise
        except TimeoutError:
            raise RequestTimeout(
                f"could not connect to {target.host_header} within {self.timeout:g} s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"could not connect to {target.host_header}: {exc}") from exc
        conn.transport = transport  # uvloop may call connection_made after this returns
        self._open.add(conn)
        return conn


def _request_bytes(method: str, target: _Target, headers: Mapping[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target.path} HTTP/1.1", f"host: {target.host_header}"]
    if body or method not in ("GET", "DELETE"):
        lines.append(f"content-length: {len(body)}")
    if "user-agent" not in headers:
        lines.append(f"user-agent: {USER_AGENT}")
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise HttpError(f"header {name[:60]!r} has a line break or colon in it")
        if name.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            continue  # framing is this client's job
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body
